"""The Redis ledger: leases with fencing tokens, done-records, the shard queue and progress counters.

Two kinds of lease live here, with the same Lua primitives:

* a **request lease** (global, keyed by the request's content hash, shared by every run): a worker
  may call a paid provider only while it holds it, so two overlapping runs never pay twice;
* a **shard lease** (per run and stage): which worker is processing which shard. A shard whose
  worker died becomes claimable again when its lease expires.

Every acquisition increments a fencing token. A commit carries the token it was granted and is
rejected if anyone acquired the same lease since (the holder was presumed dead and replaced), so a
zombie worker can never double-count or overwrite a takeover's commit.

Redis is not the source of truth for results: the checkpoint store is. If Redis is wiped, the queue
is rebuilt from the store (see ``init_stage``) and the response cache prevents paying again.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import msgspec
import redis

from punchline.data.errors import LedgerUnavailable

# KEYS: lease, fence, done ; ARGV: owner, ttl_ms
_ACQUIRE = """
if redis.call('EXISTS', KEYS[3]) == 1 then return {2, 0} end
if redis.call('EXISTS', KEYS[1]) == 1 then return {0, redis.call('PTTL', KEYS[1])} end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. token, 'PX', ARGV[2])
return {1, token}
"""

# KEYS: lease ; ARGV: owner, token, ttl_ms
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] .. '|' .. ARGV[2] then
  redis.call('PEXPIRE', KEYS[1], ARGV[3]) return 1
end
return 0
"""

# A commit is valid if nobody acquired the lease after us: the fence still equals our token and the
# lease is ours or has lapsed without a successor.
# KEYS: lease, fence, done ; ARGV: owner, token, value
_COMMIT = """
local fence = redis.call('GET', KEYS[2])
if fence ~= ARGV[2] then return 0 end
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] .. '|' .. ARGV[2] then return 0 end
redis.call('SET', KEYS[3], ARGV[3])
redis.call('DEL', KEYS[1])
return 1
"""

# KEYS: lease ; ARGV: owner, token
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] .. '|' .. ARGV[2] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# Claim the first shard of the stage's to-do set that nobody holds.
# KEYS: todo, meta ; ARGV: prefix, owner, ttl_ms
# returns {1, shard, token} | {0, min_pttl} (all held by others) | {-1} (nothing to do) | {-2} (no stage meta)
_CLAIM = """
if redis.call('EXISTS', KEYS[2]) == 0 then return {-2} end
local todo = redis.call('SMEMBERS', KEYS[1])
if #todo == 0 then return {-1} end
table.sort(todo, function(a, b) return tonumber(a) < tonumber(b) end)
local wait = -1
for _, shard in ipairs(todo) do
  local lease = ARGV[1] .. shard .. ':lease'
  local pttl = redis.call('PTTL', lease)
  if pttl < 0 then
    local token = redis.call('INCR', ARGV[1] .. shard .. ':fence')
    redis.call('SET', lease, ARGV[2] .. '|' .. token, 'PX', ARGV[3])
    return {1, tonumber(shard), token}
  end
  if wait < 0 or pttl < wait then wait = pttl end
end
return {0, wait}
"""

# KEYS: lease, fence, todo, done_set ; ARGV: owner, token, shard
_COMMIT_SHARD = """
local fence = redis.call('GET', KEYS[2])
if fence ~= ARGV[2] then return 0 end
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] .. '|' .. ARGV[2] then return 0 end
redis.call('SREM', KEYS[3], ARGV[3])
redis.call('SADD', KEYS[4], ARGV[3])
redis.call('DEL', KEYS[1])
return 1
"""


class Grant(msgspec.Struct, frozen=True):
    """A held lease: present the token when renewing or committing."""

    key: str
    owner: str
    token: int


class Claim(msgspec.Struct, frozen=True):
    shard: int
    grant: Grant


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


class Ledger:
    """All Redis state of the engine. Every Redis failure surfaces as :class:`LedgerUnavailable`."""

    def __init__(self, client: redis.Redis, *, namespace: str = "pl") -> None:
        self.r = client
        self.ns = namespace
        self._acquire = client.register_script(_ACQUIRE)
        self._renew = client.register_script(_RENEW)
        self._commit = client.register_script(_COMMIT)
        self._release = client.register_script(_RELEASE)
        self._claim = client.register_script(_CLAIM)
        self._commit_shard = client.register_script(_COMMIT_SHARD)

    # --- helpers ---------------------------------------------------------------------------------

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            raise LedgerUnavailable(f"Redis is unreachable: {exc}") from None
        except redis.exceptions.ResponseError as exc:
            if "LOADING" in str(exc) or "BUSY" in str(exc):
                raise LedgerUnavailable(f"Redis is not ready: {exc}") from None
            raise

    def _req(self, key: str) -> list[str]:
        base = f"{self.ns}:req:{key}"
        return [f"{base}:lease", f"{base}:fence", f"{base}:done"]

    def _stage(self, run_id: str, stage: str) -> str:
        return f"{self.ns}:run:{run_id}:stage:{stage}"

    def ping(self) -> None:
        self._call(self.r.ping)

    # --- request leases --------------------------------------------------------------------------

    def acquire_request(self, key: str, owner: str, lease_ms: int) -> Grant | int | None:
        """A :class:`Grant`, or the ms left on someone else's lease, or None if the request is done."""
        status, value = self._call(self._acquire, keys=self._req(key), args=[owner, lease_ms])
        if status == 1:
            return Grant(key, owner, int(value))
        if status == 2:
            return None
        return max(int(value), 1)

    def renew(self, grant: Grant, lease_ms: int, *, lease_key: str | None = None) -> bool:
        lk = lease_key or self._req(grant.key)[0]
        return bool(self._call(self._renew, keys=[lk], args=[grant.owner, grant.token, lease_ms]))

    def commit_request(self, grant: Grant, pointer: str) -> bool:
        """Mark the request done (pointing at its stored result); False if our lease was taken over."""
        return bool(self._call(self._commit, keys=self._req(grant.key), args=[grant.owner, grant.token, pointer]))

    def release_request(self, grant: Grant) -> None:
        self._call(self._release, keys=[self._req(grant.key)[0]], args=[grant.owner, grant.token])

    def forget_request(self, key: str) -> None:
        """Drop a done-record whose result the store does not have (the store is the truth)."""
        self._call(self.r.delete, self._req(key)[2])

    def request_done(self, key: str) -> bool:
        return bool(self._call(self.r.exists, self._req(key)[2]))

    # --- stages and shards -----------------------------------------------------------------------

    def init_stage(
        self, run_id: str, stage: str, *, pending: Iterable[int], shards_total: int, units_total: int, shards_done: int
    ) -> None:
        """(Re)build the stage's queue from what the store says is still missing."""
        base = self._stage(run_id, stage)
        pending = list(pending)
        pipe = self.r.pipeline(transaction=True)
        pipe.delete(f"{base}:todo", f"{base}:failed")
        if pending:
            pipe.sadd(f"{base}:todo", *[str(s) for s in pending])
        pipe.hset(f"{base}:meta", mapping={"shards_total": shards_total, "units_total": units_total})
        pipe.hsetnx(f"{base}:counters", "started_at", time.time())
        pipe.hset(
            f"{base}:counters",
            mapping={"shards_total": shards_total, "units_total": units_total, "shards_done": shards_done},
        )
        self._call(pipe.execute)

    def stage_initialized(self, run_id: str, stage: str) -> bool:
        return bool(self._call(self.r.exists, f"{self._stage(run_id, stage)}:meta"))

    def claim_shard(self, run_id: str, stage: str, owner: str, lease_ms: int) -> Claim | int:
        """A :class:`Claim`, or: ``>0`` ms to wait (all held), ``-1`` nothing left, ``-2`` stage unknown."""
        base = self._stage(run_id, stage)
        res = self._call(self._claim, keys=[f"{base}:todo", f"{base}:meta"], args=[f"{base}:shard:", owner, lease_ms])
        if res[0] == 1:
            shard = int(res[1])
            return Claim(shard, Grant(f"{base}:shard:{shard}", owner, int(res[2])))
        if res[0] == 0:
            return max(int(res[1]), 1)
        return int(res[0])

    def renew_shard(self, grant: Grant, lease_ms: int) -> bool:
        return self.renew(grant, lease_ms, lease_key=f"{grant.key}:lease")

    def commit_shard(self, run_id: str, stage: str, claim: Claim) -> bool:
        base = self._stage(run_id, stage)
        g = claim.grant
        ok = self._call(
            self._commit_shard,
            keys=[f"{g.key}:lease", f"{g.key}:fence", f"{base}:todo", f"{base}:done"],
            args=[g.owner, g.token, claim.shard],
        )
        if ok:
            self._call(self.r.hincrby, f"{base}:counters", "shards_done", 1)
        return bool(ok)

    def release_shard(self, claim: Claim) -> None:
        self._call(self._release, keys=[f"{claim.grant.key}:lease"], args=[claim.grant.owner, claim.grant.token])

    def pending_shards(self, run_id: str, stage: str) -> set[int]:
        return {int(s) for s in self._call(self.r.smembers, f"{self._stage(run_id, stage)}:todo")}

    def leased_shards(self, run_id: str, stage: str) -> int:
        base = self._stage(run_id, stage)
        pending = self.pending_shards(run_id, stage)
        if not pending:
            return 0
        pipe = self.r.pipeline(transaction=False)
        for s in pending:
            pipe.exists(f"{base}:shard:{s}:lease")
        return sum(self._call(pipe.execute))

    # --- counters ----------------------------------------------------------------------------------

    def count(self, run_id: str, stage: str, **increments: float) -> None:
        key = f"{self._stage(run_id, stage)}:counters"
        pipe = self.r.pipeline(transaction=False)
        for name, value in increments.items():
            if name == "cost_usd":
                pipe.hincrbyfloat(key, name, float(value))
            else:
                pipe.hincrby(key, name, int(value))
        pipe.hset(key, "updated_at", time.time())
        self._call(pipe.execute)

    def counters(self, run_id: str, stage: str) -> StageCounters:
        raw = self._call(self.r.hgetall, f"{self._stage(run_id, stage)}:counters")
        values: dict[str, Any] = {}
        for k, v in raw.items():
            name = k.decode() if isinstance(k, bytes) else k
            text = v.decode() if isinstance(v, bytes) else v
            if name in StageCounters.__struct_fields__:
                values[name] = float(text) if name in ("cost_usd", "started_at", "updated_at") else int(float(text))
        return StageCounters(**values)

    def record_failure(self, run_id: str, stage: str, unit_id: str, reason: str) -> None:
        self._call(self.r.hset, f"{self._stage(run_id, stage)}:failed", unit_id, reason[:500])

    def clear_failure(self, run_id: str, stage: str, unit_id: str) -> None:
        self._call(self.r.hdel, f"{self._stage(run_id, stage)}:failed", unit_id)

    def failures(self, run_id: str, stage: str) -> dict[str, str]:
        raw = self._call(self.r.hgetall, f"{self._stage(run_id, stage)}:failed")
        return {
            (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
            for k, v in raw.items()
        }


def patiently(fn: Any, *args: Any, max_wait_s: float = 600.0, **kwargs: Any) -> Any:
    """Call a ledger method, waiting out a Redis outage (fail closed: nothing proceeds without it).

    Gives up with :class:`LedgerUnavailable` after ``max_wait_s`` so a run whose Redis is gone for
    good stops with a clear error instead of hanging forever.
    """
    import structlog

    deadline = time.monotonic() + max_wait_s
    delay = 0.2
    while True:
        try:
            return fn(*args, **kwargs)
        except LedgerUnavailable as exc:
            if time.monotonic() + delay > deadline:
                raise
            structlog.get_logger("punchline.ledger").warning("ledger_unavailable", error=str(exc), retry_in_s=delay)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
