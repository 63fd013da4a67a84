"""A worker's provider calls right now: how many are in flight and how many 429s came back, per stage,
provider and model, published to the ledger about once a second for the driver's ``/metrics``.

What a shard did reaches Redis only with its commit (:class:`~punchline.data.units.ShardUsage`), and its
file in the store; that is minutes late for "how many calls are out right now" and "is the provider
throttling us". So each worker keeps them in memory (with its retries and its answers' latency) and writes them, whole,
as one JSON value of its own (``<ns>:run:<run>:calls:<worker>``, listed in the run's sorted set
``<ns>:run:<run>:calls``, scored by when it was written; how they are stored is
:mod:`punchline.schedulers.call_figures`): one round trip a second per worker, nothing per call. The reader sums
every worker's figures; figures not refreshed for :data:`STALE_S` (a worker that ended or died) count no calls in
flight, while their 429s still count (a Prometheus counter does not go down when a worker leaves).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

import msgspec
import structlog

from punchline.data.errors import LedgerUnavailable
from punchline.data.units import add_latency_counts, count_latency
from punchline.schedulers import call_figures
from punchline.schedulers import keys as redis_keys
from punchline.schedulers.server.redis_client import ClientError

log = structlog.get_logger("punchline.worker")
PUBLISH_S = 1.0  # how often a worker writes its figures
STALE_S = 10.0  # a hash older than this: its worker is gone, its calls are not in flight

Scope = tuple[str, str, str]  # stage, provider, model


# The sorted set of the run's workers' figures, and one worker's (:mod:`punchline.schedulers.keys`).
run_key = redis_keys.calls
worker_key = redis_keys.worker_calls


class CallRow(msgspec.Struct, kw_only=True):
    """One (stage, provider, model): a worker's figures, or their sum over a run's workers. ``calls``: units
    whose provider call ended (answered or not); ``latency_*``: of the answered ones, first attempt to answer
    (retries and backoff included), in :data:`~punchline.data.units.LATENCY_BUCKETS_S` buckets."""

    stage: str
    provider: str
    model: str
    in_flight: int = 0
    calls: int = 0
    rate_limited: int = 0
    retries: int = 0
    latency_sum_s: float = 0.0
    latency_counts: list[int] = []

    def scope(self) -> Scope:
        return (self.stage, self.provider, self.model)

    def add(self, other: CallRow, *, in_flight: bool = True) -> None:
        if in_flight:
            self.in_flight += max(0, other.in_flight)
        self.calls += other.calls
        self.rate_limited += other.rate_limited
        self.retries += other.retries
        self.latency_sum_s += other.latency_sum_s
        self.latency_counts = add_latency_counts(self.latency_counts, other.latency_counts)


class _Figures(msgspec.Struct, kw_only=True):
    updated_at: float
    rows: list[CallRow]


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(_Figures).decode


class CallStats:
    """One worker's tally. :meth:`calling` brackets a unit's provider call (its retries included, their
    backoff bracketed by :meth:`pausing`: not in flight); :meth:`throttled` counts a 429, :meth:`retried` a
    failed attempt tried again, :meth:`answered` an answer and how long it took."""

    def __init__(self) -> None:
        self.rows: dict[Scope, CallRow] = {}

    def _row(self, scope: Scope) -> CallRow:
        row = self.rows.get(scope)
        if row is None:
            row = self.rows[scope] = CallRow(stage=scope[0], provider=scope[1], model=scope[2])
        return row

    @contextlib.contextmanager
    def calling(self, scope: Scope) -> Iterator[None]:
        row = self._row(scope)
        row.in_flight += 1
        try:
            yield
        finally:
            row.in_flight -= 1
            row.calls += 1

    @contextlib.contextmanager
    def pausing(self, scope: Scope) -> Iterator[None]:
        """A retry's backoff: the unit has no call out meanwhile."""
        row = self._row(scope)
        row.in_flight -= 1
        try:
            yield
        finally:
            row.in_flight += 1

    def throttled(self, scope: Scope) -> None:
        self._row(scope).rate_limited += 1

    def retried(self, scope: Scope) -> None:
        self._row(scope).retries += 1

    def answered(self, scope: Scope, latency_s: float) -> None:
        row = self._row(scope)
        row.latency_counts = count_latency(row.latency_counts, latency_s)
        row.latency_sum_s += latency_s

    def blob(self, now_s: float | None = None) -> bytes:
        return _encode(_Figures(updated_at=time.time() if now_s is None else now_s, rows=list(self.rows.values())))

    async def publish(self, r: Any, namespace: str, run_id: str, worker_id: str) -> None:
        """Write this worker's figures now (``r``: an asynchronous Redis client)."""
        await call_figures.publish(r, namespace, run_id, worker_id, self.blob())

    async def publish_every(
        self, r: Any, namespace: str, run_id: str, worker_id: str, period_s: float = PUBLISH_S
    ) -> None:
        """Publish until cancelled, and once more then (the last figures: nothing in flight any more)."""
        said = False
        me = asyncio.current_task()
        try:
            while True:
                try:
                    await self.publish(r, namespace, run_id, worker_id)
                except (LedgerUnavailable, ClientError) as exc:  # figures only: the next second tries again,
                    if not said:  # and they never stop the worker
                        log.warning("call_stats_not_published", error=f"{type(exc).__name__}: {exc}"[:300])
                        said = True
                # a cancellation that arrives inside the Redis client's call can be lost there (it returns as if
                # nothing happened): the task still says it was asked to stop (Python 3.11+), so stop
                if me is not None and getattr(me, "cancelling", lambda: 0)():
                    return
                await asyncio.sleep(period_s)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.publish(r, namespace, run_id, worker_id), timeout=2.0)


def read(r: Any, namespace: str, run_id: str, now_s: float | None = None) -> list[CallRow]:
    """The run's figures summed over its workers, per (stage, provider, model), sorted: calls in flight from
    fresh figures only, the rest from all. ``r``: a synchronous Redis client."""
    now = time.time() if now_s is None else now_s
    blobs = call_figures.read_all(r, namespace, run_id)
    rows: dict[Scope, CallRow] = {}
    for blob in blobs:
        if not blob:
            continue
        try:
            figures = _decode(blob)
        except (msgspec.DecodeError, ValueError):
            continue
        fresh = now - figures.updated_at <= STALE_S
        for row in figures.rows:
            scope = row.scope()
            mine = rows.setdefault(scope, CallRow(stage=scope[0], provider=scope[1], model=scope[2]))
            mine.add(row, in_flight=fresh)
    return [rows[s] for s in sorted(rows)]
