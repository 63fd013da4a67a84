"""A stage's units in the order of a judge's score or of their answers' parsed value, either way.

An order needs every unit's value, so it is one pass over the stage's shard files (and, for a score that a later
stage gives, over that stage's shard files beside the stage's unit ids, merged: both are in id order, so memory is a
shard at a time, not a dict of the run), built once. What is kept is a rank per unit (four bytes a unit: the rank of
its value among the stage's distinct values), in memory and, for a finished run, under ``runs/_view/<run>/`` beside
the stage indexes: an order either way is then a bucket pass over the ranks. A unit without the value (failed, not
judged, does not parse) comes last both ways.
"""

from __future__ import annotations

import contextlib
import re
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec

from punchline.data.errors import PunchlineError
from punchline.data.storage.jsonio import atomic_write_bytes
from punchline.data.storage.run_layout import RunLayout
from punchline.data.units import ShardOutput
from punchline.viewer.index import Layout, RunFiles

_NUMBER = re.compile(r"\s*-?\d+(\.\d+)?\s*")
_shard_output = msgspec.msgpack.Decoder(ShardOutput)
Value = str | int | float | bool | None
Score = Callable[[str, str], str | None]  # (stage, answer text) -> its score or verdict
Parse = Callable[[str, str, str], Value]  # (stage, answer text, field or "") -> a parsed value


class SortSpec(msgspec.Struct, frozen=True, kw_only=True):
    """``score`` (a judge's score or verdict: the unit's own in a judging stage, else the first later unit's about
    it) or ``parsed`` (a field of the first answer's parsed fields, by default the first), ascending or not."""

    key: str
    field: str = ""
    descending: bool = False

    @property
    def name(self) -> str:
        return self.key + (f".{self.field}" if self.field else "")


def parse_sort(text: str) -> SortSpec | None:
    """``score``, ``-score``, ``parsed``, ``-parsed.confidence`` -> a spec; anything else: None (plan order)."""
    descending = text.startswith("-")
    key, _, field = text.lstrip("-").partition(".")
    if key not in ("score", "parsed") or (key == "score" and field) or not re.fullmatch(r"[\w-]{0,100}", field):
        return None
    return SortSpec(key=key, field=field, descending=descending)


def _order_key(value: Value) -> tuple[int, float, str]:
    """Numbers (and number-shaped text, as a regex's score is) before text, each in its own order."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, float(value), "")
    text = str(value)
    return (0, float(text), "") if _NUMBER.fullmatch(text) else (1, 0.0, text.lower())


class Ranks(msgspec.Struct, kw_only=True):
    """Per unit position the rank of its value (``missing``: none); saved as bytes for the stage's plan digest."""

    digest: str
    ranks: bytes
    missing: int

    def order(self, descending: bool) -> array[int]:
        ranks = array("I")
        ranks.frombytes(self.ranks)
        buckets: list[array[int]] = [array("I") for _ in range(self.missing + 1)]
        for position, rank in enumerate(ranks):
            buckets[rank].append(position)
        values = buckets[: self.missing]
        out = array("I")
        for bucket in reversed(values) if descending else values:
            out.extend(bucket)
        out.extend(buckets[self.missing])
        return out


_ranks = msgspec.msgpack.Decoder(Ranks)


class Sorter:
    """Builds and keeps a run's orders (one per stage and sort key)."""

    def __init__(self, files: RunFiles, stages: list[str], score: Score, parse: Parse, keep: bool) -> None:
        self.files = files
        self.stages = stages
        self.score = score
        self.parse = parse
        self.keep = keep  # a finished run: its shard files never change, the ranks are kept on disk
        self._orders: dict[tuple[str, str, bool], array[int]] = {}

    def order(self, stage: str, layout: Layout, spec: SortSpec) -> array[int]:
        key = (stage, spec.name, spec.descending)
        have = self._orders.get(key)
        if have is not None and len(have) == layout.units_total:
            return have
        made = self.ranks(stage, layout, spec).order(spec.descending)
        if self.keep:
            self._orders[key] = made
        return made

    def ranks(self, stage: str, layout: Layout, spec: SortSpec) -> Ranks:
        digest = ",".join(self.digest(s) for s in (stage, self._judging(stage, spec)) if s)
        path = self.files.cache_dir / f"{stage}.sort-{spec.name}" if self.files.cache_dir and self.keep else None
        if path is not None and path.is_file():
            with contextlib.suppress(OSError, msgspec.DecodeError, ValueError):
                saved = _ranks.decode(path.read_bytes())
                if saved.digest == digest and len(saved.ranks) == 4 * layout.units_total:
                    return saved
        made = self._build(stage, layout, spec, digest)
        if path is not None:
            with contextlib.suppress(OSError, PunchlineError):  # a read-only runs folder: not kept
                atomic_write_bytes(Path(path), msgspec.msgpack.encode(made))
        return made

    def digest(self, stage: str) -> str:
        raw = self.files.store.get(RunLayout(self.files.run_id).plan_digest(stage))
        return raw.decode(errors="replace").strip() if raw else ""

    def _judging(self, stage: str, spec: SortSpec) -> str | None:
        """The later stage whose units score this stage's (a score of a stage that is not the last), or None."""
        if spec.key != "score" or stage not in self.stages:
            return None
        later = self.stages[self.stages.index(stage) + 1 :]
        return later[0] if later else None

    def _build(self, stage: str, layout: Layout, spec: SortSpec, digest: str) -> Ranks:
        codes = array("I", bytes(4 * layout.units_total))  # 0: no value
        values: dict[Value, int] = {}

        def code(value: Value) -> int:
            return values.setdefault(value, len(values) + 1)

        judging = self._judging(stage, spec)
        if judging is not None:
            self._merge_scores(stage, judging, codes, code)
        else:
            for position, text in self._answers(stage, layout):
                value = self.score(stage, text) if spec.key == "score" else self.parse(stage, text, spec.field)
                if value is not None:
                    codes[position] = code(value)
        ordered = sorted(values, key=_order_key)
        rank_of = array("I", [len(ordered)] * (len(values) + 1))
        for rank, value in enumerate(ordered):
            rank_of[values[value]] = rank
        ranks = array("I", (rank_of[c] for c in codes))
        return Ranks(digest=digest, ranks=ranks.tobytes(), missing=len(ordered))

    def _answers(self, stage: str, layout: Layout) -> Iterator[tuple[int, str]]:
        """(position, first answer text) of the stage's answered units, a shard file at a time."""
        for shard in range(layout.shards_total):
            for position, _, text in self._shard_answers(stage, layout, shard):
                yield position, text

    def _shard_answers(self, stage: str, layout: Layout, shard: int) -> list[tuple[int, str, str]]:
        """(position, unit id, first answer text) of a shard's answered units, in id order."""
        raw = self.files.shard_raw(stage, shard)
        if raw is None:
            return []
        try:
            results = sorted(_shard_output.decode(raw).results, key=lambda r: r.unit_id)
        except (msgspec.DecodeError, ValueError):
            return []  # the page names an unreadable shard; an order passes it over
        base = shard * layout.shard_size
        size = min(layout.shard_size, layout.units_total - base)
        if len(results) == size:  # the usual: every unit of the shard, and ids are in plan order
            at = {r.unit_id: base + i for i, r in enumerate(results)}
        else:
            at = {u.unit_id: base + i for i, u in enumerate(self.files.plan_shard(stage, shard))}
        return [
            (at[r.unit_id], r.unit_id, r.response.texts[0])
            for r in results
            if r.unit_id in at and r.response is not None and r.response.texts
        ]

    def _merge_scores(self, stage: str, judging: str, codes: array[int], code: Callable[[Value], int]) -> None:
        """The first score of ``judging``'s units about each unit of ``stage`` (``judge/r1/m0/s0`` is about
        ``generate/r1/m0``): both streams in id order, merged; a second id head (``judge_mera/``) starts again."""
        other = self.files.layout(judging)
        if other is None:
            return
        ours = self.files.unit_ids(stage)
        mine = next(ours, None)
        position, last_parent = 0, ""
        for shard in range(other.shards_total):
            for _, unit_id, text in self._shard_answers(judging, other, shard):
                parent = unit_id.split("/", 1)[-1].rsplit("/", 1)[0]
                if parent < last_parent:  # the next id head: our ids again from the start
                    ours, position = self.files.unit_ids(stage), 0
                    mine = next(ours, None)
                last_parent = parent
                while mine is not None and mine.split("/", 1)[-1] < parent:
                    mine, position = next(ours, None), position + 1
                if mine is not None and mine.split("/", 1)[-1] == parent and not codes[position]:
                    score = self.score(judging, text)
                    if score is not None:
                        codes[position] = code(score)
