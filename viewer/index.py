"""A run's units as the viewer reads them: a stage's layout and index, and its plan shards and shard files on demand.

Nothing here holds a stage whole. Paging needs only the stage's *layout*, read from its first and last plan pages:
``data.units.cut`` makes every shard but the last ``shard_size`` units long, so unit ``i`` is in shard
``i // shard_size``. A later stage's units about a unit (its judges) are found by a binary search over shards'
first unit ids, each read once. The *index* (one pass over the plan pages, decoding only each unit's id and model)
is what a model filter needs: per unit its model, per model its positions, per shard its first id; a few bytes a
unit, built in the background and kept on disk for the plan's digest. Comparing models adds a second pass: each
unit's prompt digest, and per model its units sorted by it, so the same prompt asked of another model is a binary
search. The units themselves (prompts, answers, usage) come from one plan page and one shard file at a time, each
kept in a small LRU: shard files and plan pages are written once and never change.
"""

from __future__ import annotations

import bisect
import contextlib
import threading
import zlib
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import msgspec

from punchline.data.errors import InputError, PunchlineError
from punchline.data.storage.jsonio import atomic_write_bytes
from punchline.data.storage.run_layout import RunLayout
from punchline.data.store import Store
from punchline.data.units import ShardOutput, UnitSpec, plan_page_key, shard_key, stage_prefix


class _IdxReq(msgspec.Struct):
    model: str = ""


class _PromptReq(msgspec.Struct):
    messages: msgspec.Raw = msgspec.Raw(b"")


class _PromptUnit(msgspec.Struct):
    request: _PromptReq


class _PromptPage(msgspec.Struct):
    shards: list[list[_PromptUnit]] = []


class _IdxUnit(msgspec.Struct):
    unit_id: str
    request: _IdxReq


class _IdxPage(msgspec.Struct):
    first_shard: int = 0
    shards: list[list[_IdxUnit]] = []


class _RawPage(msgspec.Struct):
    """A plan page with its shards left encoded: a page holds 64 shards, a viewer page needs one."""

    first_shard: int = 0
    shards: list[msgspec.Raw] = []


_idx_page = msgspec.msgpack.Decoder(_IdxPage)
_prompt_page = msgspec.msgpack.Decoder(_PromptPage)
_raw_page = msgspec.msgpack.Decoder(_RawPage)
_shard_units = msgspec.msgpack.Decoder(list[UnitSpec])
_raw_list = msgspec.msgpack.Decoder(list[msgspec.Raw])
_shard_output = msgspec.msgpack.Decoder(ShardOutput)


def _plain(raw: bytes) -> bytes:
    return zlib.decompress(raw) if raw[:1] == b"\x78" else raw  # pages written before compression still read


plain = _plain  # a plan page's msgpack, for the viewer's other readers


@contextlib.contextmanager
def _plan_file(key: str) -> Iterator[None]:
    """A plan page that does not decode is named (the page says so; the server goes on)."""
    try:
        yield
    except (msgspec.DecodeError, msgspec.ValidationError, zlib.error, ValueError) as exc:
        raise InputError(f"not a readable plan page ({str(exc)[:120]})", file=key) from None


class StageIndex:
    """Where every unit of a stage is, its model and its prompt digest (positions count units in plan order)."""

    def __init__(self, stage: str, page_keys: list[str]) -> None:
        self.stage = stage
        self.page_keys = page_keys
        self.shard_first: list[str] = []
        self.shard_start = array("Q")  # position of each shard's first unit; one more entry: the total
        self.models: list[str] = []
        self.unit_model = array("H")
        self.unit_hash = array("q")  # filled on first use (comparing models): a second pass over the plan
        self.by_model: list[array[int]] = []
        self._sorted: dict[int, tuple[array[int], array[int]]] = {}
        self._lock = threading.Lock()

    @property
    def units_total(self) -> int:
        return len(self.unit_model)

    @property
    def shards_total(self) -> int:
        return len(self.shard_first)

    def add_page(self, raw: bytes) -> None:
        page = _idx_page.decode(_plain(raw))
        model_of = {m: i for i, m in enumerate(self.models)}
        for units in page.shards:
            if not units:
                continue
            base = len(self.unit_model)
            self.shard_first.append(units[0].unit_id)
            self.shard_start.append(base)
            names = [u.request.model for u in units]
            for name in set(names) - model_of.keys():
                model_of[name] = len(self.models)
                self.models.append(name)
                self.by_model.append(array("I"))
            ids = [model_of[n] for n in names]
            self.unit_model.extend(ids)
            if len(model_of) == 1:
                self.by_model[ids[0]].extend(range(base, base + len(ids)))
            else:
                for m in set(ids):
                    self.by_model[m].extend([base + i for i, x in enumerate(ids) if x == m])

    def add_prompts(self, raw: bytes) -> None:
        for units in _prompt_page.decode(_plain(raw)).shards:
            self.unit_hash.extend([hash(bytes(u.request.messages)) for u in units])

    def close(self) -> None:
        self.shard_start.append(len(self.unit_model))

    def model_index(self, model: str) -> int | None:
        return self.models.index(model) if model in self.models else None

    def prompts(self, read: Callable[[str], bytes | None]) -> None:
        """Each unit's prompt digest, and per model its units sorted by it (a second pass over the plan, once:
        what comparing two models needs; the viewer starts it in the background after the model index)."""
        with self._lock:
            if len(self.unit_hash) < self.units_total:
                self.unit_hash = array("q")
                for key in self.page_keys:
                    raw = read(key)
                    if raw is not None:
                        self.add_prompts(raw)
            for model in range(len(self.models)):
                if model not in self._sorted:
                    order = array("I", sorted(self.by_model[model], key=self.unit_hash.__getitem__))
                    self._sorted[model] = (array("q", (self.unit_hash[i] for i in order)), order)

    def same_prompt(self, position: int, model: int, read: Callable[[str], bytes | None]) -> int | None:
        """The position of the unit of ``model`` asked the same prompt as the unit at ``position`` (the first)."""
        self.prompts(read)
        hashes, order = self._sorted[model]
        want = self.unit_hash[position]
        at = bisect.bisect_left(hashes, want)
        return order[at] if at < len(hashes) and hashes[at] == want else None


class _Saved(msgspec.Struct, kw_only=True):
    """A stage's index as the viewer keeps it on disk (``<runs>/_view/<run>/<stage>.idx``), for the plan whose
    digest it names: a finished plan never changes, so a viewer started again reads it in milliseconds."""

    digest: str
    page_keys: list[str]
    shard_first: list[str]
    shard_start: bytes
    models: list[str]
    unit_model: bytes
    by_model: list[bytes]


_saved = msgspec.msgpack.Decoder(_Saved)


def save_index(index: StageIndex, digest: str) -> bytes:
    return msgspec.msgpack.encode(
        _Saved(
            digest=digest,
            page_keys=index.page_keys,
            shard_first=index.shard_first,
            shard_start=index.shard_start.tobytes(),
            models=index.models,
            unit_model=index.unit_model.tobytes(),
            by_model=[a.tobytes() for a in index.by_model],
        )
    )


def load_index(stage: str, raw: bytes, digest: str, page_keys: list[str]) -> StageIndex | None:
    """The saved index if it is of this plan (same digest and pages), else None."""
    try:
        saved = _saved.decode(raw)
    except (msgspec.DecodeError, ValueError):
        return None
    if saved.digest != digest or saved.page_keys != page_keys:
        return None
    index = StageIndex(stage, page_keys)
    index.shard_first = saved.shard_first
    index.shard_start.frombytes(saved.shard_start)
    index.models = saved.models
    index.unit_model.frombytes(saved.unit_model)
    for raw_positions in saved.by_model:
        positions = array("I")
        positions.frombytes(raw_positions)
        index.by_model.append(positions)
    return index


class Layout(msgspec.Struct, frozen=True, kw_only=True):
    """How a stage's units lie in its shards, from its first and last plan pages alone: every shard but the
    last holds ``shard_size`` units (``data.units.cut``), so a unit's shard is a division."""

    page_keys: tuple[str, ...]
    shard_size: int
    shards_total: int
    units_total: int

    def locate(self, position: int) -> tuple[int, int]:
        """(shard, offset in it) of a unit position."""
        return divmod(position, self.shard_size)


class ShardRead(msgspec.Struct, kw_only=True):
    """A shard file as read: ``output`` None and no ``error``: not written yet (its units are pending)."""

    output: ShardOutput | None = None
    error: str | None = None


K = TypeVar("K")
V = TypeVar("V")


class _Lru(OrderedDict[K, V]):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size
        self.lock = threading.Lock()

    def fetch(self, key: K, make: Callable[[], V]) -> V:
        with self.lock:
            if key in self:
                self.move_to_end(key)
                return self[key]
        value = make()
        with self.lock:
            self[key] = value
            while len(self) > self.size:
                self.popitem(last=False)
        return value


class RunFiles:
    """One run's stage files in the store, read on demand. Thread-safe (the server answers in threads)."""

    def __init__(
        self, store: Store, run_id: str, *, cache_dir: Path | None = None, keep_pages: int = 4, keep_shards: int = 64
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.cache_dir = cache_dir  # where built indexes are kept (None: not kept)
        self.frozen = False  # a finished run: its plan pages are all there and never change
        self._indexes: dict[str, StageIndex] = {}
        self._index_lock = threading.Lock()
        self._pages: _Lru[tuple[str, int], _RawPage] = _Lru(keep_pages)
        self._shards: _Lru[tuple[str, int], ShardRead] = _Lru(keep_shards)
        self._units: _Lru[tuple[str, int], list[UnitSpec]] = _Lru(keep_shards)
        self._per_page: dict[str, int] = {}
        self._layouts: dict[str, Layout] = {}
        self._first_ids: dict[tuple[str, int], str] = {}
        self._building: set[str] = set()
        self._lock = threading.Lock()

    def page_keys(self, stage: str) -> list[str]:
        return sorted(self.store.list(f"{stage_prefix(self.run_id, stage)}/plan/"))

    def layout(self, stage: str) -> Layout | None:
        """The stage's layout (None: not planned yet), from two plan pages: what paging needs, at once. A finished
        run's (``frozen``) is read once: its plan pages are not listed again for each unit."""
        if self.frozen:
            with self._lock:
                kept = self._layouts.get(stage)
            if kept is not None:
                return kept
        keys = tuple(self.page_keys(stage))
        if not keys:
            return None
        with self._lock:
            have = self._layouts.get(stage)
        if have is not None and have.page_keys == keys:
            return have
        first, last = self._page(stage, 0, fresh=True), self._page(stage, len(keys) - 1, fresh=True)
        if not first.shards or not last.shards:
            return None
        with self._lock:
            self._per_page[stage] = len(first.shards)
        with _plan_file(keys[0]):
            size = len(_raw_list.decode(first.shards[0]))
        shards = (len(keys) - 1) * len(first.shards) + len(last.shards)
        with _plan_file(keys[-1]):
            made = Layout(
                page_keys=keys,
                shard_size=size,
                shards_total=shards,
                units_total=(shards - 1) * size + len(_raw_list.decode(last.shards[-1])),
            )
        with self._lock:
            self._layouts[stage] = made
        return made

    def built_index(self, stage: str) -> StageIndex | None:
        """The stage's index if it is built or loaded already (never builds it)."""
        return self._indexes.get(stage)

    def first_id(self, stage: str, shard: int) -> str:
        """The first unit id of a shard: from the stage's index when it is built (no plan page read; a plan page
        never changes once written, so an index of fewer pages still answers for the shards it has), else from
        the shard's plan page (kept: a search over shards asks for the same few)."""
        index = self._indexes.get(stage)
        if index is not None and shard < len(index.shard_first):
            return index.shard_first[shard]
        with self._lock:
            found = self._first_ids.get((stage, shard))
        if found is None:
            units = self.plan_shard(stage, shard)
            found = units[0].unit_id if units else "\uffff"
            with self._lock:
                self._first_ids[(stage, shard)] = found
        return found

    def shard_at_or_before(self, stage: str, layout: Layout, unit_id: str, guess: int | None = None) -> int:
        """The shard where ``unit_id`` is or would be (ids are sorted): a search over first ids. ``guess``: where
        it likely is (a unit's place in an earlier stage, scaled); the search gallops out from there, so without
        an index it reads the plan pages near the guess, not ``log2(shards)`` pages spread over the stage."""
        lo, hi = 0, layout.shards_total
        if guess is not None and lo < hi:
            at, step = min(max(guess, 0), hi - 1), 1
            if self.first_id(stage, at) <= unit_id:  # every shard up to ``at`` starts at or before it
                good, bound = at, hi
                while good + step < hi:
                    if self.first_id(stage, good + step) > unit_id:
                        bound = good + step
                        break
                    good, step = good + step, step * 2
                lo, hi = good + 1, bound
            else:  # every shard from ``at`` on starts after it
                bad, bound = at, 0
                while bad - step >= 0:
                    if self.first_id(stage, bad - step) <= unit_id:
                        bound = bad - step + 1
                        break
                    bad, step = bad - step, step * 2
                lo, hi = bound, bad
        while lo < hi:
            mid = (lo + hi) // 2
            if self.first_id(stage, mid) <= unit_id:
                lo = mid + 1
            else:
                hi = mid
        return max(0, lo - 1)

    def ready_index(self, stage: str, layout: Layout) -> StageIndex | None:
        """The stage's index if it is built; if not, None at once and it is built in the background."""
        have = self._indexes.get(stage)
        if have is not None and tuple(have.page_keys) == layout.page_keys:
            return have
        with self._lock:
            if stage in self._building:
                return None
            self._building.add(stage)

        def build() -> None:
            try:
                self.index(stage)
            except Exception:  # a page that needs it builds it itself and says why
                pass
            finally:
                with self._lock:
                    self._building.discard(stage)

        threading.Thread(target=build, name=f"punchline-view-index-{stage}", daemon=True).start()
        return None

    def index(self, stage: str) -> StageIndex | None:
        """The stage's index (None: not planned yet). Rebuilt when its plan has more pages than when built
        (a stage still being planned); a plan is written before its shards are queued."""
        with self._index_lock:
            keys = self.page_keys(stage)
            if not keys:
                return None
            have = self._indexes.get(stage)
            if have is not None and have.page_keys == keys:
                return have
            digest_raw = self.store.get(RunLayout(self.run_id).plan_digest(stage))
            digest = digest_raw.decode(errors="replace").strip() if digest_raw else ""
            saved = self.cache_dir / f"{stage}.idx" if self.cache_dir is not None and digest else None
            index = None
            if saved is not None and saved.is_file():
                with contextlib.suppress(OSError):
                    index = load_index(stage, saved.read_bytes(), digest, keys)
            if index is None:
                index = StageIndex(stage, keys)
                for key in keys:
                    raw = self.store.get(key)
                    if raw is not None:
                        with _plan_file(key):
                            index.add_page(raw)
                index.close()
                if saved is not None:
                    with contextlib.suppress(OSError, PunchlineError):  # a read-only runs folder: not kept
                        atomic_write_bytes(saved, save_index(index, digest))
            self._indexes[stage] = index
            return index

    def plan_shard(self, stage: str, shard: int) -> list[UnitSpec]:
        def load() -> list[UnitSpec]:
            per_page = self._per_page.get(stage)
            if per_page is None:  # every page but the last holds the same number of shards
                per_page = self._per_page[stage] = len(self._page(stage, 0).shards) or 1
            page = self._page(stage, shard // per_page)
            at = shard - page.first_shard
            with _plan_file(plan_page_key(self.run_id, stage, shard // per_page)):
                return _shard_units.decode(page.shards[at]) if 0 <= at < len(page.shards) else []

        return self._units.fetch((stage, shard), load)

    def unit_ids(self, stage: str) -> Iterator[str]:
        """The stage's unit ids in plan order, a plan page at a time (only each unit's id and model decoded)."""
        for key in self.page_keys(stage):
            raw = self.store.get(key)
            if raw is None:
                continue
            with _plan_file(key):
                page = _idx_page.decode(_plain(raw))
            for units in page.shards:
                yield from (u.unit_id for u in units)

    def plan_shard_raw(self, stage: str, shard: int) -> bytes:
        """A shard's units as the plan page holds them, encoded (what a text search looks through before it
        decodes anything)."""
        per_page = self._per_page.get(stage)
        if per_page is None:
            per_page = self._per_page[stage] = len(self._page(stage, 0).shards) or 1
        page = self._page(stage, shard // per_page)
        at = shard - page.first_shard
        return bytes(page.shards[at]) if 0 <= at < len(page.shards) else b""

    def shard_raw(self, stage: str, shard: int) -> bytes | None:
        """A shard file's bytes as stored (None: not written yet), not decoded and not kept."""
        return self.store.get(shard_key(self.run_id, stage, shard))

    def _page(self, stage: str, page: int, *, fresh: bool = False) -> _RawPage:
        def load() -> _RawPage:
            key = plan_page_key(self.run_id, stage, page)
            raw = self.store.get(key)
            with _plan_file(key):
                return _RawPage() if raw is None else _raw_page.decode(_plain(raw))

        if fresh:  # a stage still being planned: its last page may grow
            with self._pages.lock:
                self._pages.pop((stage, page), None)
        return self._pages.fetch((stage, page), load)

    def shard(self, stage: str, shard: int) -> ShardRead:
        """The shard's file; a file that is not one says so (the page shows it, the server goes on)."""

        def load() -> ShardRead:
            key = shard_key(self.run_id, stage, shard)
            raw = self.store.get(key)
            if raw is None:
                return ShardRead()
            try:
                return ShardRead(output=_shard_output.decode(raw))
            except (msgspec.DecodeError, ValueError) as exc:
                return ShardRead(error=f"{key}: not a readable shard file ({str(exc)[:120]})")

        read = self._shards.fetch((stage, shard), load)
        if read.output is None and read.error is None:  # pending: ask again next time
            with self._shards.lock:
                self._shards.pop((stage, shard), None)
        return read
