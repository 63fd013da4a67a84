"""Units, shards and stage plans: what the coordinator hands out and the workers hand back.

A stage's plan is a pure function of the config and earlier artifacts: its units come in strictly
increasing ``unit_id`` order, so they are cut into shards at the same boundaries on every node and every
resume without anyone holding the whole plan. The coordinator streams them into *plan pages* in the store
(``shards_per_page`` shards each); a worker reads just the page of the shard it claimed. These records
cross processes (Ray) and files (the store).
"""

from __future__ import annotations

import bisect
import hashlib
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Literal

import msgspec

from punchline.data.errors import PunchlineError
from punchline.data.requests import ProviderRequest, ProviderResponse
from punchline.data.storage.run_layout import RunLayout


class UnitSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One deterministic provider request of a stage. ``check`` names the pipeline's own response validator,
    ``"package.module:function"`` or ``"package.module:function:ARG"`` (``punchline/workers/calls/validators.py``;
    ``""``: a non-empty answer), run before the answer is accepted, so that a malformed answer is retried instead of
    cached. ``retries = False``: a failed attempt (429, 5xx, timeout, malformed body) fails the unit at once instead of
    being retried, for a stage that reproduces a caller that never retries."""

    unit_id: str
    request: ProviderRequest
    check: str = ""
    retries: bool = True


class UnitResult(msgspec.Struct, kw_only=True):
    """A unit's outcome as its shard file keeps it. ``latency_s``: seconds from its first provider attempt to
    the accepted answer (retries and their backoff included; None: answered from the cache, or no call was
    made, or a record written before it was kept); ``retries``: its attempts that failed and were tried again
    (429s, 5xx, timeouts, malformed or invalid answers). ``retryable``: the unit failed with an error that
    another attempt may cure (a 429 or 5xx, a timeout, a dropped connection, a malformed or invalid answer) and
    it asks for retries (``UnitSpec.retries``): a resume calls it again (``cluster/records/retry_failed.py``), while a
    permanent failure (a 400, an unknown model) waits for ``retry-failed`` (False in records written before it
    was kept: those too wait for ``retry-failed``)."""

    unit_id: str
    key: str
    response: ProviderResponse | None = None
    error: str | None = None
    latency_s: float | None = None
    retries: int = 0
    retryable: bool = False


#: upper bounds (seconds) of the latency buckets a shard keeps per model (``ModelUsage.latency_counts``; the
#: last count is above the last bound): what ``/metrics`` exports as a histogram and the viewer's distribution
LATENCY_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


def latency_bucket(latency_s: float) -> int:
    """The index in ``latency_counts`` of the bucket a latency falls in (le: at or below the bound)."""
    return bisect.bisect_left(LATENCY_BUCKETS_S, latency_s)


def _histogram(counts: list[int]) -> list[int]:
    return counts or [0] * (len(LATENCY_BUCKETS_S) + 1)


def count_latency(counts: list[int], latency_s: float) -> list[int]:
    """``counts`` (made when empty: a row that answered nothing keeps no histogram) with one answer counted in its
    latency bucket. With :func:`add_latency_counts`, the one place the shards' usage and the workers' call figures
    count latencies."""
    counts = _histogram(counts)
    counts[latency_bucket(latency_s)] += 1
    return counts


def add_latency_counts(into: list[int], other: list[int]) -> list[int]:
    """``into`` with another histogram's answered units added, bucket by bucket (unchanged when ``other`` is empty)."""
    if not other:
        return into
    into = _histogram(into)
    for i, n in enumerate(other[: len(into)]):
        into[i] += n
    return into


class ModelUsage(msgspec.Struct, kw_only=True):
    """What one model's calls of a shard cost, how long its answered units waited for their answer and how
    often they were retried (the last four are zero in shards written before they were kept)."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    retries: int = 0  # failed attempts tried again (429s, 5xx, timeouts, malformed or invalid answers)
    rate_limited: int = 0  # attempts the provider answered with 429
    latency_sum_s: float = 0.0  # over the answered units' latency_s
    latency_counts: list[int] = []  # answered units per LATENCY_BUCKETS_S bucket (+ one above the last bound)

    def add_latency(self, latency_s: float) -> None:
        self.latency_counts = count_latency(self.latency_counts, latency_s)
        self.latency_sum_s += latency_s

    def add(self, other: ModelUsage) -> None:
        self.calls += other.calls
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cost_usd += other.cost_usd
        self.retries += other.retries
        self.rate_limited += other.rate_limited
        self.latency_sum_s += other.latency_sum_s
        self.latency_counts = add_latency_counts(self.latency_counts, other.latency_counts)


class ShardUsage(msgspec.Struct, kw_only=True):
    """What a shard's units did and cost, kept in its shard file: the store, not Redis, is the record of
    progress and spend (a wiped ledger loses its counters, never this)."""

    units_ok: int = 0
    units_failed: int = 0
    cache_hits: int = 0
    provider_requests: int = 0
    provider_retries: int = 0
    models: dict[str, ModelUsage] = {}

    def add_call(self, model: str, input_tokens: int, output_tokens: int, cost_usd: float) -> None:
        m = self.models.setdefault(model, ModelUsage())
        m.calls += 1
        m.input_tokens += input_tokens
        m.output_tokens += output_tokens
        m.cost_usd += cost_usd

    def throttled(self, model: str) -> None:
        """A 429 from the provider, per model."""
        self.models.setdefault(model, ModelUsage()).rate_limited += 1

    def add_unit(self, model: str, latency_s: float | None, retries: int) -> None:
        """An answered (or failed) unit's latency and retries, per model."""
        if latency_s is None and not retries:
            return
        m = self.models.setdefault(model, ModelUsage())
        m.retries += retries
        if latency_s is not None:
            m.add_latency(latency_s)

    def add(self, other: ShardUsage) -> None:
        self.units_ok += other.units_ok
        self.units_failed += other.units_failed
        self.cache_hits += other.cache_hits
        self.provider_requests += other.provider_requests
        self.provider_retries += other.provider_retries
        for model, m in other.models.items():
            self.models.setdefault(model, ModelUsage()).add(m)

    def counters(self) -> dict[str, float]:
        """The ledger counters this shard adds (``status`` sums them)."""
        return {
            "units_done": self.units_ok,
            "units_failed": self.units_failed,
            "cache_hits": self.cache_hits,
            "provider_requests": self.provider_requests,
            "provider_retries": self.provider_retries,
            "input_tokens": sum(m.input_tokens for m in self.models.values()),
            "output_tokens": sum(m.output_tokens for m in self.models.values()),
            "cost_usd": sum(m.cost_usd for m in self.models.values()),
        }


class ShardOutput(msgspec.Struct, kw_only=True):
    """The committed output of one shard: written once (``if_absent``) to the store."""

    stage: str
    shard: int
    results: list[UnitResult]
    usage: ShardUsage | None = None


class StageManifest(msgspec.Struct, kw_only=True):
    """``<run>/stages/<stage>/manifest.json``: the stage finished with no failed unit; a resume skips it
    and takes its artifacts from here. ``usage``: the sum of its shard files' usage, so a reader (the viewer's
    models page, ``/metrics``) need not read every shard file again (None in manifests written before it was kept;
    a manifest is dropped whenever one of its shards is, so it never disagrees with them)."""

    stage: str
    units: int
    shards: int
    failed: int
    artifacts: list[str]
    usage: ShardUsage | None = None


#: a run's state in its record: running, then finished / failed (units failed, or an error) / budget (the
#: cap stopped it) / interrupted (its driver was stopped or is gone)
RunState = Literal["running", "finished", "failed", "budget", "interrupted"]


class PlanPage(msgspec.Struct, kw_only=True):
    """Consecutive shards of a plan, as stored: ``shards[i]`` is shard ``first_shard + i``."""

    stage: str
    first_shard: int
    shards: list[list[UnitSpec]]


class StagePlan(msgspec.Struct, frozen=True, kw_only=True):
    """What a stage's plan is, without its units (they are in the store's plan pages): small enough to
    hand every worker, whatever the number of units."""

    run_id: str
    stage: str
    shard_size: int
    shards_per_page: int
    units_total: int
    shards_total: int
    digest: str  # sha256 over the units, in order: a changed plan invalidates earlier shards

    def shard_count(self) -> int:
        return self.shards_total

    def page_of(self, shard: int) -> int:
        return shard // self.shards_per_page


def stage_prefix(run_id: str, stage: str) -> str:
    return RunLayout(run_id).stage(stage)


def shard_key(run_id: str, stage: str, shard: int) -> str:
    return RunLayout(run_id).shard(stage, shard)


def plan_page_key(run_id: str, stage: str, page: int) -> str:
    return RunLayout(run_id).plan_page(stage, page)


def in_unit_order(units: Iterable[UnitSpec]) -> list[UnitSpec]:
    """A stage that builds its units in another order returns them through this."""
    return sorted(units, key=lambda u: u.unit_id)


class PlanOrderError(PunchlineError):
    """A stage listed its units out of ``unit_id`` order, or twice: a bug in the stage."""


def ordered(stage: str, units: Iterable[UnitSpec]) -> Iterator[UnitSpec]:
    """The units, checked to come in strictly increasing ``unit_id`` order (so duplicates are caught too)."""
    previous: str | None = None
    for unit in units:
        if previous is not None and unit.unit_id <= previous:
            what = "twice" if unit.unit_id == previous else f"after {previous!r}"
            raise PlanOrderError(f"stage {stage}: unit {unit.unit_id!r} listed {what} (plans go in unit_id order)")
        previous = unit.unit_id
        yield unit


_unit_encoder = msgspec.msgpack.Encoder(order="deterministic")
_page_encoder = msgspec.msgpack.Encoder()
_page_decoder = msgspec.msgpack.Decoder(PlanPage)


class PlanShape(msgspec.Struct, kw_only=True):
    """One pass over a stage's units: how many, how cut, their digest and each shard's first unit id."""

    units_total: int = 0
    shards_total: int = 0
    digest: str = ""
    first_ids: list[str] = []


def cut(
    stage: str,
    units: Iterable[UnitSpec],
    shard_size: int,
    shards_per_page: int,
    on_page: Callable[[PlanPage], None] | None = None,
) -> PlanShape:
    """Cut units (in order) into shards and pages, streaming: memory is one page, not the plan."""
    h = hashlib.sha256(f"{stage}\x00{shard_size}\x00".encode())
    shape = PlanShape()
    page = PlanPage(stage=stage, first_shard=0, shards=[])
    shard: list[UnitSpec] = []

    def close_shard() -> None:
        nonlocal page
        page.shards.append(list(shard))
        shard.clear()
        shape.shards_total += 1
        if len(page.shards) == shards_per_page:
            if on_page is not None:
                on_page(page)
            page = PlanPage(stage=stage, first_shard=shape.shards_total, shards=[])

    for unit in ordered(stage, units):
        if not shard:
            shape.first_ids.append(unit.unit_id)
        shard.append(unit)
        h.update(_unit_encoder.encode(unit))
        shape.units_total += 1
        if len(shard) == shard_size:
            close_shard()
    if shard:
        close_shard()
    if page.shards and on_page is not None:
        on_page(page)
    shape.digest = h.hexdigest()
    return shape


def encode_page(page: PlanPage) -> bytes:
    """A page as stored: zlib over msgpack (prompts repeat, so a page is a fraction of its units' size)."""
    return zlib.compress(_page_encoder.encode(page), 6)


def decode_page(raw: bytes) -> PlanPage:
    """A stored page; pages written before compression (plain msgpack, a map) still read."""
    return _page_decoder.decode(zlib.decompress(raw) if raw[:1] == b"\x78" else raw)


class ShardResults(Mapping[str, UnitResult]):
    """A finished stage's results, read shard by shard from the store as a reduce step asks for them.

    Units are sorted, so ``first_ids`` (each shard's first unit id) locates any unit with a binary
    search; a few decoded shards are kept, and a reduce that walks the plan in order reads each once.
    Memory stays at a few shards however large the stage. Each shard's usage is kept as it is read, so
    :meth:`usage` (what the stage cost, from the store) costs no second pass over shards already read.
    """

    def __init__(
        self, load: Callable[[int], ShardOutput], first_ids: list[str], units_total: int, keep_shards: int = 64
    ) -> None:
        self._load = load
        self._first_ids = first_ids
        self._units_total = units_total
        self._keep = keep_shards
        self._cache: OrderedDict[int, dict[str, UnitResult]] = OrderedDict()
        # the usage of shards 0 .. _usage_next - 1, added in index order (the same sum, to the last bit, as one pass
        # over every shard), and of the shards read ahead of that: no usage kept per shard once it is summed
        self._usage_total = ShardUsage()
        self._usage_next = 0
        self._usage_ahead: dict[int, ShardUsage] = {}

    def _shard(self, index: int) -> dict[str, UnitResult]:
        hit = self._cache.get(index)
        if hit is not None:
            self._cache.move_to_end(index)
            return hit
        output = self._load(index)
        if index >= self._usage_next:
            self._usage_ahead.setdefault(index, output.usage or ShardUsage())
            while self._usage_next in self._usage_ahead:
                self._usage_total.add(self._usage_ahead.pop(self._usage_next))
                self._usage_next += 1
        loaded = {r.unit_id: r for r in output.results}
        self._cache[index] = loaded
        if len(self._cache) > self._keep:
            self._cache.popitem(last=False)
        return loaded

    def __getitem__(self, unit_id: str) -> UnitResult:
        index = bisect.bisect_right(self._first_ids, unit_id) - 1
        if index < 0:
            raise KeyError(unit_id)
        return self._shard(index)[unit_id]

    def __iter__(self) -> Iterator[str]:
        for index in range(len(self._first_ids)):
            yield from self._shard(index)

    def __len__(self) -> int:
        return self._units_total

    def failed(self) -> dict[str, str]:
        """Failed unit -> reason, in unit order."""
        return {uid: str(r.error) for uid in self for r in [self[uid]] if r.error is not None}

    def usage(self) -> ShardUsage:
        """What the stage's shards did and cost, as their files record it."""
        for index in range(self._usage_next, len(self._first_ids)):
            if index >= self._usage_next and index not in self._usage_ahead:
                self._shard(index)
        assert self._usage_next == len(self._first_ids)
        return self._usage_total
