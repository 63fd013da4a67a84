"""What the viewer's pages show, as structs: a run's stages, and a page of its units (filtered, compared).

Filters that the index answers (stage, model) are slices of positions, so any page of them is one plan shard
and one shard file away. Filters that need the answers (a failed unit or an answer that does not parse, a judge
score, free text) scan forward from a cursor shard by shard and stop when the page is full or after
``SCAN_UNITS`` units, handing back where to go on: a page never costs more than a bounded scan, whatever the
size of the run.
"""

from __future__ import annotations

import bisect
import re
import threading
import time
from array import array
from pathlib import Path
from typing import Any

import msgspec

from punchline.cluster.pipeline import AnswerParser
from punchline.cluster.records.status import StatusView
from punchline.cluster.registry import resolve
from punchline.data.store import Store
from punchline.data.units import LATENCY_BUCKETS_S, ModelUsage, UnitResult, UnitSpec
from punchline.viewer.index import Layout, RunFiles, StageIndex
from punchline.viewer.references import RowInputs
from punchline.viewer.search_text import SearchText, SearchTexts, needle_of
from punchline.viewer.sorting import Sorter, SortSpec, Value, parse_sort
from punchline.workers.calls.call_stats import CallRow
from punchline.workers.logs import is_secret_name, redact_text

SCAN_UNITS = 20_000  # units a filtered page may look at before it hands back a cursor
SCAN_S = 0.5  # and seconds
SEARCH_S = 20.0  # a text search's seconds (waiting for a finished stage's kept text, or reading the store's files)
_SCORE = re.compile(r"\b(score|verdict|rating|grade|label|оценка)\s*[:=]\s*\"?([\w.+-]+)", re.I)
_ASSIGN = re.compile(r"^(\s*\"?)([A-Za-z0-9_.-]+)(\"?\s*=\s*)(.+)$")


class JudgeView(msgspec.Struct, kw_only=True):
    unit_id: str
    model: str
    text: str
    score: str | None = None
    error: str | None = None


class UnitView(msgspec.Struct, kw_only=True):
    """One unit as the samples page shows it."""

    position: int
    unit_id: str
    shard: int
    provider: str = ""
    model: str = ""
    alias: str = ""
    messages: list[tuple[str, str]] = []
    n: int = 1
    temperature: float = 0.0
    check: str = ""
    state: str = "pending"  # done / failed / pending / unreadable
    texts: list[str] = []
    finish_reasons: list[str] = []
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None
    error: str | None = None
    parsed: list[str] = []  # one per sample: the fields, or why the answer does not parse
    parse_failed: bool = False
    score: str | None = None  # a judge's unit: the score or verdict its answer gives
    judges: list[JudgeView] = []  # the later stages' units about this one (a judge's)
    shard_retries: int = 0
    shard_cache_hits: int = 0
    latency_s: float | None = None  # first attempt to accepted answer (None: cached, or not recorded then)
    retries: int = 0  # the unit's failed attempts tried again
    row: list[tuple[str, str, bool]] = []  # its input row: (field, value, is a reference), from outputs.jsonl
    row_note: str = ""  # why the row is not shown


class SamplesQuery(msgspec.Struct, kw_only=True):
    stage: str = ""
    model: str = ""
    compare: str = ""  # a second model: rows pair each unit of ``model`` with the same prompt asked of it
    failed: bool = False  # failed units and answers that do not parse
    score: str = ""  # a judge score or verdict (the unit's own, or a judge's about it)
    q: str = ""
    page: int = 0
    after: int = 0  # with a scanning filter: the position (in the model's units) to go on from
    size: int = 25
    sort: str = ""  # "": plan order; score / parsed[.<field>], "-" first: descending (sorting.parse_sort)


class SamplesPage(msgspec.Struct, kw_only=True):
    run_id: str
    query: SamplesQuery
    stages: list[str]
    models: list[str] = []
    aliases: dict[str, str] = {}
    rows: list[UnitView] = []
    partners: list[UnitView | None] = []  # with ``compare``: the other model's unit of each row
    total: int | None = None  # None: a scanning filter (the count is not known without reading everything)
    next_after: int | None = None
    scanned: int = 0
    notes: list[str] = []
    sorted_by: str = ""  # how the rows are ordered, when not in plan order


class RunMeta:
    """What a run's config says about reading its units: model aliases, prices, its pipeline's answer parsers."""

    def __init__(self, pipeline: str, config_toml: str) -> None:
        self.aliases: dict[str, str] = {}
        self.prices: dict[str, tuple[float, float]] = {}
        self.parsers: dict[str, AnswerParser] = {}
        self.notes: list[str] = []
        try:
            tables = msgspec.toml.decode(config_toml.encode(), type=dict[str, Any])
        except msgspec.DecodeError:
            self.notes.append("the run's config does not parse: no prices or parsers")
            return
        providers = tables.get("providers")
        for table in providers.values() if isinstance(providers, dict) else ():
            models = table.get("models") if isinstance(table, dict) else None
            for alias, m in models.items() if isinstance(models, dict) else ():
                if isinstance(m, dict) and isinstance(m.get("id"), str):
                    self.aliases[m["id"]] = alias
                    self.prices[m["id"]] = (
                        float(m.get("input_usd_per_mtok", 0)),
                        float(m.get("output_usd_per_mtok", 0)),
                    )
        self._read_parsers(pipeline, tables)

    def _read_parsers(self, pipeline: str, tables: dict[str, Any]) -> None:
        """The pipeline's own parsers of its stages' answers (its optional ``answer_parsers``), from its table."""
        try:
            plugin = resolve(pipeline)
            parsers = getattr(plugin, "answer_parsers", None)
            if parsers is None:
                return
            settings = msgspec.convert(tables.get(plugin.name, {}), plugin.settings_type)
            self.parsers = dict(parsers(settings))
        except Exception as exc:  # not installed here, or a config another version wrote: answers unparsed
            self.notes.append(f"the {pipeline} answers' parse settings are not readable here ({str(exc)[:80]})")


def redacted_config(config_toml: str) -> str:
    """The run's config as shown: URL passwords and key-shaped values masked, and every assignment to a
    secret-named key (``api_key = ...``) masked whatever its value (run.json already redacts URLs)."""
    out = []
    for line in redact_text(config_toml).splitlines():
        m = _ASSIGN.match(line)
        if m and is_secret_name(m.group(2)) and not m.group(2).endswith("_env") and not m.group(2).endswith("_file"):
            line = f'{m.group(1)}{m.group(2)}{m.group(3)}"***"'
        out.append(line)
    return "\n".join(out)


def _score_of(text: str) -> str | None:
    m = _SCORE.search(text)
    if m:
        return m.group(2).lower()
    stripped = text.strip()
    return stripped if re.fullmatch(r"-?\d+(\.\d+)?", stripped) else None


class Samples:
    """Pages of one run's units. One per run in the server, shared by its threads."""

    def __init__(
        self,
        store: Store,
        run_id: str,
        stages: list[str],
        meta: RunMeta,
        cache_dir: Path | None = None,
        *,
        finished: bool = False,
        rows: RowInputs | None = None,
    ) -> None:
        self.files = RunFiles(store, run_id, cache_dir=cache_dir)
        self.files.frozen = finished
        self.run_id = run_id
        self.stages = stages
        self.meta = meta
        self.rows = rows
        self.sorter = Sorter(self.files, stages, self.judge_score, self.parsed_value, keep=finished)
        self.texts = SearchTexts(self.files)
        self._by_model: dict[tuple[str, str, bool, int], array[int]] = {}
        self._lock = threading.Lock()
        self._heads: dict[str, tuple[tuple[Layout, bool], set[str]]] = {}
        self._models: dict[str, tuple[Layout, list[str]]] = {}

    # --- one unit -------------------------------------------------------------------------------------

    def unit(self, stage: str, layout: Layout, position: int, *, judges: bool = True) -> UnitView:
        shard, offset = layout.locate(position)
        units = self.files.plan_shard(stage, shard)
        spec = units[offset] if offset < len(units) else None
        view = UnitView(position=position, unit_id=spec.unit_id if spec else "?", shard=shard)
        if spec is not None:
            self._fill_request(view, spec)
        read = self.files.shard(stage, shard)
        if read.error is not None:
            view.state, view.error = "unreadable", read.error
        elif read.output is not None:
            out = read.output
            result = out.results[offset] if offset < len(out.results) else None
            if result is None or result.unit_id != view.unit_id:  # not in plan order: look it up
                result = next((r for r in out.results if r.unit_id == view.unit_id), None)
            if out.usage is not None:
                view.shard_retries, view.shard_cache_hits = out.usage.provider_retries, out.usage.cache_hits
            if result is not None:
                self._fill_result(view, stage, result)
        if judges and spec is not None:
            view.judges = self._judges(stage, spec.unit_id, layout, position)
        if judges and self.rows is not None and spec is not None:
            view.row, view.row_note = self.rows.row(spec.unit_id)
        return view

    def parsed_value(self, stage: str, text: str, field: str) -> Value:
        """What sorting by the parsed value reads of an answer: the field (by default the first) of its parsed
        fields (None: it does not parse); a stage without a parser: the answer's text."""
        parser = self.meta.parsers.get(stage)
        if parser is None:
            return text[:200]
        fields, error = parser(text)
        if error or not fields:
            return None
        value = fields.get(field) if field else next(iter(fields.values()))
        if value is None or isinstance(value, (str, int, float, bool)):
            return value
        return msgspec.json.encode(value).decode()

    def _fill_request(self, view: UnitView, spec: UnitSpec) -> None:
        req = spec.request
        view.provider, view.model, view.alias = req.provider, req.model, self.meta.aliases.get(req.model, "")
        view.messages = [(m.role, m.content) for m in req.messages]
        view.n, view.temperature, view.check = req.n, req.temperature, spec.check

    def _fill_result(self, view: UnitView, stage: str, result: UnitResult) -> None:
        view.latency_s, view.retries = result.latency_s, result.retries
        view.error = redact_text(result.error) if result.error else None
        view.state = "failed" if result.error is not None else "done"
        resp = result.response
        if resp is None:
            view.parse_failed = view.state == "failed"
            return
        view.texts, view.finish_reasons = resp.texts, resp.finish_reasons
        view.input_tokens, view.output_tokens = resp.input_tokens, resp.output_tokens
        price = self.meta.prices.get(view.model)
        if price is not None:
            view.cost_usd = (resp.input_tokens * price[0] + resp.output_tokens * price[1]) / 1e6
        parser = self.meta.parsers.get(stage)
        if parser is not None:
            for text in resp.texts:
                fields, error = parser(text)
                view.parsed.append(f"error: {error}" if error else msgspec.json.encode(fields).decode())
                view.parse_failed = view.parse_failed or error is not None
        if stage.startswith("judge") and resp.texts:
            view.score = self.judge_score(stage, resp.texts[0])
        view.parse_failed = view.parse_failed or view.state == "failed"

    def _judges(
        self, stage: str, unit_id: str, here: Layout | None = None, position: int | None = None, limit: int = 8
    ) -> list[JudgeView]:
        """The units of later stages whose id continues this unit's (``judge/r1/m0/s0`` for ``generate/r1/m0``).
        Stages are row-major alike, so the unit's place in its stage, scaled, is where to look first in the later
        one: without that stage's index a page reads the plan pages near it, not pages spread over the stage."""
        suffix = unit_id.split("/", 1)[1] if "/" in unit_id else unit_id
        found: list[JudgeView] = []
        later = self.stages[self.stages.index(stage) + 1 :] if stage in self.stages else []
        for other in later:
            layout = self.files.layout(other)
            if layout is None:
                continue
            guess = None
            if here is not None and position is not None and here.units_total:
                guess = position * layout.shards_total // here.units_total
            prefixes = {f"{other}/{suffix}", *(f"{p}/{suffix}" for p in self._id_heads(other, layout))}
            for prefix in sorted(prefixes):
                found += self._units_with_prefix(other, layout, prefix, limit - len(found), guess)
        return found

    def _id_heads(self, stage: str, layout: Layout) -> set[str]:
        """The first segments of a stage's unit ids (a stage may have several: ``judge/`` and ``judge_mera/``): from
        its index's shards' first ids when the index is built, else from its first and last units (ids are
        sorted: two heads are its first and its last)."""
        index = self.files.built_index(stage)
        key = (layout, index is not None)
        with self._lock:
            have = self._heads.get(stage)
        if have is None or have[0] != key:
            if index is not None:
                heads = {first.split("/", 1)[0] for first in index.shard_first}
            else:
                last = self.files.plan_shard(stage, layout.shards_total - 1)
                heads = {self.files.first_id(stage, 0).split("/", 1)[0]}
                heads |= {last[-1].unit_id.split("/", 1)[0]} if last else set()
            have = (key, heads)
            with self._lock:
                self._heads[stage] = have
        return have[1]

    def judge_score(self, stage: str, text: str) -> str | None:
        """A judge's score or verdict in its answer: its parsed fields when the pipeline parses that stage's
        answers, else a ``score: 7`` / ``verdict: correct`` line or a bare number."""
        parser = self.meta.parsers.get(stage)
        if parser is not None and text:
            fields, _ = parser(text)
            if fields:
                return " ".join(str(v) for v in fields.values())
        return _score_of(text)

    def _units_with_prefix(
        self, stage: str, layout: Layout, prefix: str, limit: int, guess: int | None = None
    ) -> list[JudgeView]:
        out: list[JudgeView] = []
        shard = self.files.shard_at_or_before(stage, layout, prefix, guess)
        while shard < layout.shards_total and len(out) < limit:
            units = self.files.plan_shard(stage, shard)
            read = self.files.shard(stage, shard)
            results = {r.unit_id: r for r in read.output.results} if read.output else {}
            past = False
            for spec in units:
                uid = spec.unit_id
                if uid == prefix or uid.startswith(prefix + "/"):
                    r = results.get(uid)
                    text = r.response.texts[0] if r and r.response and r.response.texts else ""
                    out.append(
                        JudgeView(
                            unit_id=uid,
                            model=self.meta.aliases.get(spec.request.model, spec.request.model),
                            text=text,
                            score=self.judge_score(stage, text),
                            error=redact_text(r.error) if r and r.error else (None if r else "pending"),
                        )
                    )
                elif uid > prefix + "/\uffff":
                    past = True
                    break
            if past:
                break
            shard += 1
        return out[:limit]

    # --- a page -----------------------------------------------------------------------------------------

    def page(self, q: SamplesQuery) -> SamplesPage:
        stage = q.stage or (self.stages[0] if self.stages else "")
        q = msgspec.structs.replace(q, stage=stage, size=max(1, min(q.size, 200)))
        out = SamplesPage(run_id=self.run_id, query=q, stages=self.stages, aliases=self.meta.aliases)
        out.notes += self.meta.notes
        if stage not in self.stages:
            out.notes.append(f"no stage {stage!r} in this run")
            return out
        layout = self.files.layout(stage)
        if layout is None:
            out.notes.append(f"stage {stage} is not planned yet")
            return out
        # paging needs only the layout; a model filter or a comparison needs the index (built once, in the
        # background as soon as the stage is first shown)
        index = self.files.index(stage) if q.model or q.compare else self.files.ready_index(stage, layout)
        if index is not None:
            out.models = list(index.models)
        else:
            out.models = self._some_models(stage, layout)
            out.notes.append("indexing the stage's models: the list may grow")
        model = index.model_index(q.model) if index is not None and q.model else None
        if q.model and model is None:
            out.notes.append(f"no unit of stage {stage} asks model {q.model!r}")
            return out
        other = index.model_index(q.compare) if index is not None and q.compare else None
        if q.compare and (other is None or model is None):
            out.notes.append("compare: pick two models of this stage")
            return out
        positions: Any = range(layout.units_total)
        if index is not None and model is not None:
            positions = index.by_model[model]
        sort = parse_sort(q.sort)
        if sort is not None:
            positions = self._sorted(stage, layout, sort, index, model)
            what = "the judge's score" if sort.key == "score" else f"the parsed {sort.field or 'value'}"
            out.sorted_by = (
                f"sorted by {what}, {'descending' if sort.descending else 'ascending'} (units without one last)"
            )
        scanning = q.failed or bool(q.score) or bool(q.q)
        if not scanning:
            out.total = len(positions)
            chosen = positions[q.page * q.size : (q.page + 1) * q.size]
            out.rows = [self.unit(stage, layout, p) for p in chosen]
            if (q.page + 1) * q.size < len(positions):
                out.next_after = q.page + 1
        else:
            self._scan(stage, layout, positions, q, out, ordered=sort is None)
        if index is not None and other is not None:
            for row in out.rows:
                match = index.same_prompt(row.position, other, self.files.store.get)
                out.partners.append(None if match is None else self.unit(stage, layout, match))
        return out

    def _sorted(
        self, stage: str, layout: Layout, sort: SortSpec, index: StageIndex | None, model: int | None
    ) -> array[int]:
        """The stage's positions in ``sort``'s order (built once: a pass over its shard files), a model's only
        when ``model`` is given."""
        order = self.sorter.order(stage, layout, sort)
        if index is None or model is None:
            return order
        key = (stage, sort.name, sort.descending, model)
        have = self._by_model.get(key)
        if have is None or not self.sorter.keep:
            of = index.unit_model
            have = array("I", (p for p in order if of[p] == model))
            if self.sorter.keep:
                self._by_model[key] = have
        return have

    def _some_models(self, stage: str, layout: Layout) -> list[str]:
        """The models of the stage's first and last shards, while its index is being built."""
        with self._lock:
            have = self._models.get(stage)
        if have is None or have[0] is not layout:
            seen: dict[str, None] = {}
            for shard in (0, layout.shards_total - 1):
                seen.update((u.request.model, None) for u in self.files.plan_shard(stage, shard))
            have = (layout, list(seen))
            with self._lock:
                self._models[stage] = have
        return have[1]

    def _scan(
        self, stage: str, layout: Layout, positions: Any, q: SamplesQuery, out: SamplesPage, ordered: bool = True
    ) -> None:
        """Units from the cursor on that pass the filters, until the page is full or the scan's bound. A text
        search first looks for the text in each shard's bytes (its plan units and its answers, as stored): a
        shard without it is passed over undecoded, so a search reads the stage once, one shard at a time, and
        decodes only the shards that hold the text. ``ordered``: positions ascend (plan order), so a passed-over
        shard's units are skipped at once."""
        started = time.monotonic()
        needle = q.q.lower()
        text = self.search_text(stage, layout) if needle else None
        raw = needle_of(needle) if text is not None else needle.encode() if needle and needle.isascii() else None
        bound_s = SEARCH_S if raw is not None else SCAN_S
        at = max(0, q.after)
        decoded = 0
        seen: dict[int, bool] = {}
        while at < len(positions) and len(out.rows) < q.size:
            if decoded >= SCAN_UNITS or time.monotonic() - started > bound_s:
                break
            position = positions[at]
            if raw is not None:
                shard = position // layout.shard_size
                if text is not None and ordered:  # the next shard that holds it, at once
                    hit = text.next_holding(raw, shard)
                    if hit != shard:
                        end = bisect.bisect_left(positions, hit * layout.shard_size, at)
                        out.scanned += end - at
                        at = end
                        continue
                else:
                    if shard not in seen:
                        if len(seen) > 4096:
                            seen.clear()
                        seen[shard] = text.holds(raw, shard) if text is not None else self._holds(stage, shard, raw)
                    if not seen[shard]:
                        end = bisect.bisect_left(positions, (shard + 1) * layout.shard_size, at) if ordered else at + 1
                        out.scanned += end - at
                        at = end
                        continue
            view = self.unit(stage, layout, position, judges=bool(q.score))
            at += 1
            decoded += 1
            out.scanned += 1
            if q.failed and not view.parse_failed and view.state != "unreadable":
                continue
            if q.score and q.score.lower() not in {view.score, *(j.score for j in view.judges)}:
                continue
            if needle and not _contains(view, needle):
                continue
            if not view.judges:
                view.judges = self._judges(stage, view.unit_id, layout, position)
            out.rows.append(view)
        out.next_after = at if at < len(positions) else None
        if out.next_after is not None and len(out.rows) < q.size:
            out.notes.append(f"looked at {out.scanned} units; go on to look further")

    def search_text(self, stage: str, layout: Layout) -> SearchText | None:
        """A finished stage's kept text (``search_text.py``), or None: not kept yet (it is being written now) or the
        run still runs (its files are searched as they are)."""
        if not self.sorter.keep:
            return None
        return self.texts.ready(stage, layout, self.sorter.digest(stage), wait_s=SEARCH_S)

    def _holds(self, stage: str, shard: int, needle: bytes) -> bool:
        """Whether the shard's plan units or its answers hold ``needle`` (lower-case ASCII) in any case."""
        if needle in self.files.plan_shard_raw(stage, shard).lower():
            return True
        data = self.files.shard_raw(stage, shard)
        return data is not None and needle in data.lower()


def _contains(view: UnitView, needle: str) -> bool:
    if needle in view.unit_id.lower() or (view.error and needle in view.error.lower()):
        return True
    return any(needle in t.lower() for t in view.texts) or any(needle in c.lower() for _, c in view.messages)


class StageRow(msgspec.Struct, kw_only=True):
    stage: str
    units_total: int = 0
    units_done: int = 0
    units_failed: int = 0
    shards_total: int = 0
    shards_done: int = 0
    leased: int | None = None
    calls: int = 0
    cache_hits: int = 0
    retries: int = 0
    cost_usd: float = 0.0
    rate_per_s: float | None = None
    eta_s: float | None = None
    failures: list[tuple[str, str]] = []  # the first few (unit, reason)
    failures_total: int = 0


def stage_rows(view: StatusView, now: float | None = None, keep_failures: int = 20) -> list[StageRow]:
    """Per stage: progress, rate (units a second since it started), ETA at that rate, cost, failures."""
    now = time.time() if now is None else now
    rows = []
    for stage, c in view.counters.items():
        row = StageRow(
            stage=stage,
            units_total=c.units_total,
            units_done=c.units_done,
            units_failed=c.units_failed,
            shards_total=c.shards_total,
            shards_done=c.shards_done,
            leased=view.leased.get(stage) if view.leased else None,
            calls=c.provider_requests,
            cache_hits=c.cache_hits,
            retries=c.provider_retries,
            cost_usd=c.cost_usd,
        )
        end = now if view.live else (c.updated_at or now)
        if c.started_at and end > c.started_at and c.units_done:
            row.rate_per_s = (c.units_done + c.units_failed) / (end - c.started_at)
            left = c.units_total - c.units_done - c.units_failed
            row.eta_s = left / row.rate_per_s if view.live and left > 0 else None
        failed = view.failures.get(stage, {})
        row.failures_total = len(failed)
        row.failures = [(u, redact_text(r)) for u, r in list(failed.items())[:keep_failures]]
        rows.append(row)
    return rows


class ModelRow(msgspec.Struct, kw_only=True):
    """One model of one stage on the models page: its committed shards' calls, retries, 429s and the latency
    distribution of its answered units (percentiles as the bucket bound they fall under), and, while the run
    runs, its workers' figures of the moment."""

    stage: str
    model: str
    alias: str = ""
    calls: int = 0
    retries: int = 0
    rate_limited: int = 0
    answered: int = 0  # units with a recorded latency
    mean_s: float | None = None
    p50_s: float | None = None  # None: no latency recorded; inf: above the last bucket
    p90_s: float | None = None
    p99_s: float | None = None
    buckets: list[tuple[str, int]] = []  # (bucket label, units)
    in_flight: int | None = None  # live only
    live_rate_limited: int | None = None
    live_retries: int | None = None


def _quantile_s(counts: list[int], q: float) -> float | None:
    total = sum(counts)
    if not total:
        return None
    running = 0
    for bound, n in zip((*LATENCY_BUCKETS_S, float("inf")), counts, strict=False):
        running += n
        if running >= q * total:
            return bound
    return float("inf")


def _bucket_label(i: int) -> str:
    if i >= len(LATENCY_BUCKETS_S):
        return f"> {LATENCY_BUCKETS_S[-1]:g} s"
    low = 0.0 if i == 0 else LATENCY_BUCKETS_S[i - 1]
    return f"{low:g}-{LATENCY_BUCKETS_S[i]:g} s"


def model_rows(
    models: dict[str, dict[str, ModelUsage]], aliases: dict[str, str], live: list[CallRow] | None = None
) -> list[ModelRow]:
    """Per stage and model (``models``: from the shard files; ``live``: the workers' figures, per provider)."""
    rows: dict[tuple[str, str], ModelRow] = {}
    for stage, per_model in models.items():
        for model, u in sorted(per_model.items()):
            counts = list(u.latency_counts)
            answered = sum(counts)
            rows[(stage, model)] = ModelRow(
                stage=stage,
                model=model,
                alias=aliases.get(model, ""),
                calls=u.calls,
                retries=u.retries,
                rate_limited=u.rate_limited,
                answered=answered,
                mean_s=u.latency_sum_s / answered if answered else None,
                p50_s=_quantile_s(counts, 0.5),
                p90_s=_quantile_s(counts, 0.9),
                p99_s=_quantile_s(counts, 0.99),
                buckets=[(_bucket_label(i), n) for i, n in enumerate(counts) if n],
            )
    for c in live or []:
        blank = ModelRow(stage=c.stage, model=c.model, alias=aliases.get(c.model, ""))
        row = rows.setdefault((c.stage, c.model), blank)
        row.in_flight = (row.in_flight or 0) + c.in_flight
        row.live_rate_limited = (row.live_rate_limited or 0) + c.rate_limited
        row.live_retries = (row.live_retries or 0) + c.retries
    return [rows[k] for k in sorted(rows)]
