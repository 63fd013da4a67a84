"""The Redis ledger as the coordinator sees it: a stage's shard queue, its progress counters, its failures.

Workers take and commit leases through :mod:`punchline.schedulers.leases` (asynchronous, one round trip per
step); this module builds the queue those leases come from and reads what they left behind, for the
coordinator, the driver and ``status``. Key names of both live in :mod:`punchline.schedulers.keys`.

A stage's queue is two sorted sets, so every claim is O(log N) whatever the number of shards:
``todo`` (shards nobody has claimed, scored by shard number) and ``leased`` (claimed shards, scored by
their lease deadline in ms); ``holders`` maps a leased shard to ``owner|token``. A claim takes the
leased shard whose deadline passed longest ago, else pops the lowest ``todo`` shard. A commit removes
the shard from both, so a finished stage leaves only its counters behind.

A rebuild (a resume) queues the shards a dead holder may still hold *after* the untouched ones (scored
``DEFERRED + shard``): their requests' leases stay held until ``lease_ms`` has passed since the holder's
last renewal, and nobody may pay for them before (the guarantee), so a resume that took them first
would wait that long for its first call. Those are the shards whose lease was live in ``leased`` when
the queue was rebuilt, and those a previous rebuild deferred and nobody has claimed since.

Redis is not the source of truth for results: the checkpoint store is. If Redis is wiped, the queue
is rebuilt from the store (see :meth:`Ledger.init_stage`) and the response cache prevents paying again.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from typing import Any

import msgspec
import redis
import structlog

from punchline.data.backoff import Backoff, retry_sync
from punchline.data.errors import LedgerUnavailable
from punchline.data.units import ShardUsage
from punchline.schedulers import keys as redis_keys
from punchline.schedulers.keys import NAMESPACE, StageKeys
from punchline.schedulers.server.redis_client import SCRIPTS_MISSING, ScriptsNotLoaded

LEDGER_BACKOFF = Backoff(initial_s=0.2, max_s=5.0)  # waiting out a Redis outage
_INIT_CHUNK = 10_000  # shards per ZADD when (re)building a queue
# score offset of the shards a rebuild queues last (a dead holder may still hold their requests); far above
# any shard number, and exact in a sorted set's double score
DEFERRED = 2**40


# The keys live in :mod:`punchline.schedulers.keys`; these names stay for the modules and tests that use them.
request_key = redis_keys.request
fence_key = redis_keys.fence


class StageCounters(msgspec.Struct, kw_only=True):
    """Progress of one stage of one run, as ``status`` shows it."""

    shards_total: int = 0
    shards_done: int = 0
    units_total: int = 0
    units_done: int = 0
    units_failed: int = 0
    cache_hits: int = 0
    provider_requests: int = 0
    provider_retries: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    started_at: float = 0.0
    updated_at: float = 0.0


_FLOAT_COUNTERS = frozenset({"cost_usd", "started_at", "updated_at"})


def with_store_totals(counters: StageCounters, usage: ShardUsage) -> StageCounters:
    """The ledger's counters corrected by what the shard files record: a wiped ledger forgets what was
    done before the wipe, the store does not. Units come from the store; calls, tokens and dollars take
    the larger figure (the ledger also counts calls of workers that died before writing their shard)."""
    store = usage.counters()
    out = msgspec.structs.replace(counters)
    out.units_done = int(store["units_done"])
    out.units_failed = int(store["units_failed"])
    out.shards_done = max(out.shards_done, out.shards_total) if out.shards_total else out.shards_done
    for name in ("cache_hits", "provider_requests", "provider_retries", "input_tokens", "output_tokens"):
        setattr(out, name, max(int(getattr(out, name)), int(store[name])))
    out.cost_usd = max(out.cost_usd, float(store["cost_usd"]))
    return out


@contextlib.contextmanager
def ledger_errors() -> Iterator[None]:
    """Redis down or not ready yet (loading its AOF, busy with a script) becomes :class:`LedgerUnavailable`,
    which callers wait out; any other reply error is a bug and goes up as it is."""
    try:
        yield
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
        raise unavailable(exc) from None
    except (redis.exceptions.NoScriptError, redis.exceptions.NoPermissionError) as exc:
        # a pipeline that runs a script the server has lost (restarted, not given its scripts again yet) tries a
        # SCRIPT LOAD the run's user may not send: not ready, like LOADING (ScriptsNotLoaded outside a pipeline)
        if isinstance(exc, redis.exceptions.NoScriptError) or "script|load" in str(exc):
            raise LedgerUnavailable(f"{SCRIPTS_MISSING}: {exc}") from None
        raise
    except redis.exceptions.ResponseError as exc:
        if "LOADING" in str(exc) or "BUSY" in str(exc):
            raise LedgerUnavailable(f"Redis is not ready: {exc}") from None
        raise


def unavailable(exc: BaseException) -> LedgerUnavailable:
    if isinstance(exc, ScriptsNotLoaded):
        return LedgerUnavailable(str(exc))
    return LedgerUnavailable(f"Redis is unreachable: {type(exc).__name__}: {exc}")


class Ledger:
    """The coordinator's view of the ledger. Every Redis failure surfaces as :class:`LedgerUnavailable`."""

    def __init__(self, client: redis.Redis, *, namespace: str = NAMESPACE) -> None:
        self.r = client
        self.ns = namespace

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        with ledger_errors():
            return fn(*args, **kwargs)

    def keys(self, run_id: str, stage: str) -> StageKeys:
        return StageKeys(self.ns, run_id, stage)

    def ping(self) -> None:
        self._call(self.r.ping)

    # --- stages and shards -----------------------------------------------------------------------

    def init_stage(
        self, run_id: str, stage: str, *, pending: Iterable[int], shards_total: int, units_total: int, shards_done: int
    ) -> None:
        """(Re)build the stage's queue from what the store says is still missing, the shards a dead
        holder may still hold last (:meth:`maybe_held`)."""
        k = self.keys(run_id, stage)
        held = self.maybe_held(run_id, stage)
        pipe = self.r.pipeline(transaction=True)
        for key in (k.todo, k.leased, k.holders, k.failed):
            pipe.pexpire(key, 0)  # removes it at once: the run's user may not DEL (schedulers/server/ledger_access.py)
        chunk: dict[str, int] = {}
        for shard in pending:
            chunk[str(shard)] = DEFERRED + shard if shard in held else shard
            if len(chunk) >= _INIT_CHUNK:
                pipe.zadd(k.todo, chunk)
                chunk = {}
        if chunk:
            pipe.zadd(k.todo, chunk)
        pipe.hset(k.meta, mapping={"shards_total": shards_total, "units_total": units_total})
        pipe.hsetnx(k.counters, "started_at", time.time())
        pipe.hset(
            k.counters,
            mapping={"shards_total": shards_total, "units_total": units_total, "shards_done": shards_done},
        )
        self._call(pipe.execute)

    def maybe_held(self, run_id: str, stage: str) -> set[int]:
        """Shards whose requests a holder may still hold: leased under a lease that has not lapsed, or
        deferred by an earlier rebuild and not claimed since (that rebuild's run may have been killed
        before its leases lapsed). Their request leases are renewed with their shard's, by one heartbeat."""
        k = self.keys(run_id, stage)
        pipe = self.r.pipeline(transaction=False)
        pipe.zrangebyscore(k.leased, int(time.time() * 1000), "+inf")
        pipe.zrangebyscore(k.todo, DEFERRED, "+inf")
        live, deferred = self._call(pipe.execute)
        return {int(m) for m in (*live, *deferred)}

    def stage_initialized(self, run_id: str, stage: str) -> bool:
        return bool(self._call(self.r.exists, self.keys(run_id, stage).meta))

    def pending_shards(self, run_id: str, stage: str) -> int:
        """Shards not committed yet: waiting in the queue or held by a worker."""
        k = self.keys(run_id, stage)
        pipe = self.r.pipeline(transaction=False)
        pipe.zcard(k.todo)
        pipe.zcard(k.leased)
        return int(sum(self._call(pipe.execute)))

    def leased_shards(self, run_id: str, stage: str) -> int:
        """Shards held under a live lease right now."""
        now_ms = int(time.time() * 1000)
        return int(self._call(self.r.zcount, self.keys(run_id, stage).leased, now_ms, "+inf"))

    # --- counters ----------------------------------------------------------------------------------

    def count(self, run_id: str, stage: str, **increments: float) -> None:
        key = self.keys(run_id, stage).counters
        pipe = self.r.pipeline(transaction=False)
        for name, value in increments.items():
            if name in _FLOAT_COUNTERS:
                pipe.hincrbyfloat(key, name, float(value))
            else:
                pipe.hincrby(key, name, int(value))
        pipe.hset(key, "updated_at", time.time())
        self._call(pipe.execute)

    def counters(self, run_id: str, stage: str) -> StageCounters:
        raw = self._call(self.r.hgetall, self.keys(run_id, stage).counters)
        values: dict[str, Any] = {}
        for k, v in raw.items():
            name = k.decode() if isinstance(k, bytes) else k
            text = v.decode() if isinstance(v, bytes) else v
            if name in StageCounters.__struct_fields__:
                values[name] = float(text) if name in _FLOAT_COUNTERS else int(float(text))
        return StageCounters(**values)

    def record_failure(self, run_id: str, stage: str, unit_id: str, reason: str) -> None:
        self._call(self.r.hset, self.keys(run_id, stage).failed, unit_id, reason[:500])

    def failures(self, run_id: str, stage: str) -> dict[str, str]:
        raw = self._call(self.r.hgetall, self.keys(run_id, stage).failed)
        return {
            (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
            for k, v in raw.items()
        }


def patiently(fn: Any, *args: Any, max_wait_s: float = 600.0, **kwargs: Any) -> Any:
    """Call a ledger method, waiting out a Redis outage (fail closed: nothing proceeds without it).

    Gives up with :class:`LedgerUnavailable` after ``max_wait_s`` so a run whose Redis is gone for
    good stops with a clear error instead of hanging forever.
    """
    log = structlog.get_logger("punchline.ledger")
    return retry_sync(
        lambda: fn(*args, **kwargs),
        retry_on=(LedgerUnavailable,),
        backoff=LEDGER_BACKOFF,
        deadline_s=max_wait_s,
        on_retry=lambda exc, _n, delay: log.warning("ledger_unavailable", error=str(exc), retry_in_s=delay),
    )
