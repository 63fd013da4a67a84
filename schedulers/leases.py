"""Leases as a worker takes them: one asynchronous round trip per step of the unit path.

Two kinds of lease, each with a fencing token from one global counter (so a token is never reused):

* a **request lease** (global, keyed by the request's content hash, shared by every run): a worker may
  call a paid provider only while it holds it, so two overlapping runs never pay twice. Taking it is one
  Lua script that also reserves the call's rate-limit slot (:data:`~punchline.schedulers.rate_limit.GCRA_LUA`)
  and, when the run has a cost cap, the call's estimated cost (:data:`~punchline.schedulers.budget.BUDGET_LUA`).
  Committing it is one script that deletes the lease, settles the cost and gives back unused tokens.
  Nothing is left behind: the answer is in the store, and the store is the truth.
* a **shard lease** (per run and stage): which worker processes which shard. Claims are O(log N)
  (see :mod:`punchline.schedulers.ledger`); the commit also adds the shard's counters and usage, so
  progress costs no round trip per unit.

A commit carries ``owner|token`` and is rejected if anyone has taken the lease since (the holder was
presumed dead and replaced), so a zombie can never release a successor's lease.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import msgspec
import redis
import redis.asyncio

from punchline.data.storage.response_cache import MARKER_MS
from punchline.schedulers import keys as redis_keys
from punchline.schedulers import lua
from punchline.schedulers.keys import NAMESPACE, UNLIMITED_RATE, BudgetKeys, StageKeys
from punchline.schedulers.ledger import ledger_errors, unavailable
from punchline.schedulers.rate_limit import RateScope

# The scripts (schedulers/lua/<name>.lua: their KEYS, ARGV and replies); acquire and commit include the rate
# limiter's and the budget's, so a lease, its rate slot and its cost are one round trip.
_ACQUIRE = lua.script("lease_acquire")
_COMMIT = lua.script("lease_commit")
_RELEASE = lua.script("lease_release")
_RENEW_REQUESTS = lua.script("lease_renew")
_CLAIM = lua.script("shard_claim")
_RENEW_SHARDS = lua.script("shard_renew")
_COMMIT_SHARD = lua.script("shard_commit")
_RELEASE_SHARD = lua.script("shard_release")


class Grant(msgspec.Struct, frozen=True):
    """A held request lease: present it when renewing or committing."""

    key: str  # the request's content hash
    owner: str
    token: int
    wait_s: float = 0.0  # how long to wait for the rate-limit slot reserved with it
    reserved_usd: float = 0.0

    @property
    def holder(self) -> str:
        return f"{self.owner}|{self.token}"


class Settle(NamedTuple):
    """One request lease to commit: its grant, rate scope, unused tokens, actual cost, answer's pack."""

    grant: Grant
    rate: RateScope | None = None
    unused_tokens: int = 0
    actual_usd: float = 0.0
    pack: str = ""


class Claim(msgspec.Struct, frozen=True):
    """A held shard lease."""

    shard: int
    owner: str
    token: int

    @property
    def holder(self) -> str:
        return f"{self.owner}|{self.token}"


class NoClaim(enum.IntEnum):
    """Why :meth:`Leases.claim` handed out no shard, other than a wait (the claim script's markers)."""

    DRAINED = -1  # nothing left to claim: every shard is committed
    STAGE_UNKNOWN = -2  # Redis does not know the stage (wiped): the coordinator rebuilds it from the store


class Held(msgspec.Struct, frozen=True):
    """Someone else holds the request: ``wait_ms`` left on their lease."""

    wait_ms: int


class Answered(msgspec.Struct, frozen=True):
    """The request's holder committed it moments ago: its answer is in the response cache's ``pack``."""

    pack: str


class OverBudget(msgspec.Struct, frozen=True):
    """The run's cost cap would be exceeded by this call."""


class BudgetTerms(msgspec.Struct, frozen=True, kw_only=True):
    """A run's cost cap as the lease scripts take it (no cap: nothing is reserved or settled)."""

    run_id: str
    cap_usd: float | None = None
    holder: str = ""
    ttl_ms: int = 900_000


_NO_RATE = [0, 0, 0, 0, 0, 0, 1, 1, 0, 1, 1]
_NO_RATE_KEYS = list(UNLIMITED_RATE)


class Leases:
    """A worker's lease client over ``redis.asyncio``: no thread hop, no blocking call on the event loop."""

    def __init__(self, client: redis.asyncio.Redis, *, budget: BudgetTerms, namespace: str = NAMESPACE) -> None:
        self.r = client
        self.ns = namespace
        self.budget = budget
        self._budget = BudgetKeys(namespace, budget.run_id)
        self._budget_keys = self._budget.scripted
        self._fence = redis_keys.fence(namespace)
        self._acquire = client.register_script(_ACQUIRE)
        self._commit = client.register_script(_COMMIT)
        self._release = client.register_script(_RELEASE)
        self._renew_requests = client.register_script(_RENEW_REQUESTS)
        self._claim = client.register_script(_CLAIM)
        self._renew_shards = client.register_script(_RENEW_SHARDS)
        self._commit_shard = client.register_script(_COMMIT_SHARD)
        self._release_shard = client.register_script(_RELEASE_SHARD)

    async def _run(self, script: Any, keys: Sequence[str], args: Sequence[Any]) -> Any:
        with ledger_errors():
            return await script(keys=list(keys), args=list(args))

    @property
    def _cap(self) -> float:
        return -1.0 if self.budget.cap_usd is None else float(self.budget.cap_usd)

    # --- request leases ----------------------------------------------------------------------------

    async def acquire(
        self,
        key: str,
        owner: str,
        lease_ms: int,
        *,
        rate: RateScope | None = None,
        requests: int = 1,
        tokens: int = 0,
        estimate_usd: float = 0.0,
    ) -> Grant | Held | Answered | OverBudget:
        """Take a request's lease, its rate-limit slot and (with a cap) its cost reservation at once."""
        rate_keys = rate.keys if rate is not None else _NO_RATE_KEYS
        rate_args = rate.args(requests, tokens) if rate is not None else _NO_RATE
        est = estimate_usd if self.budget.cap_usd is not None else 0.0
        res = await self._run(
            self._acquire,
            [redis_keys.request(self.ns, key), self._fence, *rate_keys, *self._budget_keys],
            [owner, lease_ms, *rate_args, self.budget.holder, repr(est), repr(self._cap), self.budget.ttl_ms],
        )
        if res[0] == 1:
            return Grant(key, owner, int(res[1]), wait_s=max(0, int(res[2])) / 1000, reserved_usd=est)
        if res[0] == 0:
            return Held(max(int(res[1]), 1))
        if res[0] == 2:
            raw = res[1]
            return Answered(raw.decode() if isinstance(raw, bytes) else str(raw))
        return OverBudget()

    async def commit(
        self,
        grant: Grant,
        *,
        rate: RateScope | None = None,
        unused_tokens: int = 0,
        actual_usd: float = 0.0,
        pack: str = "",
    ) -> bool:
        """Release the lease after the answer is stored, settle its cost, give back unused tokens; with
        ``pack`` (where the answer is) the lease becomes a short-lived done marker naming it.
        False if the lease was no longer ours (the answer is stored either way)."""
        return (await self.commit_many([Settle(grant, rate, unused_tokens, actual_usd, pack)]))[0]

    async def commit_many(self, settles: Sequence[Settle]) -> list[bool]:
        """Commit many request leases in one round trip (the answers of a group commit)."""
        if not settles:
            return []
        pipe = self.r.pipeline(transaction=False)
        for st in settles:
            rate = st.rate
            await self._commit(
                keys=[
                    redis_keys.request(self.ns, st.grant.key),
                    *(rate.keys if rate is not None else _NO_RATE_KEYS),
                    *self._budget_keys,
                ],
                args=[
                    st.grant.holder,
                    *(rate.args(0, 0) if rate is not None else _NO_RATE),
                    max(0, st.unused_tokens) if rate is not None else 0,
                    self.budget.holder,
                    repr(st.grant.reserved_usd),
                    repr(st.actual_usd),
                    repr(self._cap),
                    self.budget.ttl_ms,
                    st.pack,
                    MARKER_MS,
                ],
                client=pipe,
            )
        with ledger_errors():
            results = await pipe.execute()
        return [bool(r) for r in results]

    async def release(self, grant: Grant) -> None:
        """Give a lease back without an answer (the call failed); a held cost reservation is dropped."""
        if grant.reserved_usd and self.budget.cap_usd is not None:
            await self.commit(grant, actual_usd=0.0)
            return
        await self._run(self._release, [redis_keys.request(self.ns, grant.key)], [grant.holder])

    # --- shard leases -----------------------------------------------------------------------------

    async def claim(self, keys: StageKeys, owner: str, lease_ms: int) -> Claim | NoClaim | int:
        """A :class:`Claim`, a :class:`NoClaim`, or the ms to wait (> 0) until a held lease expires."""
        res = await self._run(
            self._claim, [keys.todo, keys.leased, keys.holders, keys.meta, self._fence], [owner, lease_ms]
        )
        if res[0] == 1:
            return Claim(int(res[1]), owner, int(res[2]))
        if res[0] == 0:
            return max(int(res[1]), 1)
        return NoClaim(int(res[0]))

    async def commit_shard(
        self, keys: StageKeys, claim: Claim, *, counters: Mapping[str, float], usage: Mapping[str, float]
    ) -> bool:
        args: list[Any] = [claim.shard, claim.holder, len(counters)]
        for name, value in counters.items():
            args += [name, repr(float(value)) if name == "cost_usd" else int(value)]
        for field, value in usage.items():
            args += [field, repr(float(value)) if field.endswith("usd") else int(value)]
        res = await self._run(self._commit_shard, [keys.leased, keys.holders, keys.counters, self._budget.usage], args)
        return bool(res)

    async def record_failures(self, keys: StageKeys, failures: Mapping[str, str]) -> None:
        """Failed units with their reasons, for ``status`` (the shard file has them too)."""
        mapping: Any = dict(failures)
        try:
            await self.r.hset(keys.failed, mapping=mapping)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
            raise unavailable(exc) from None

    async def release_shard(self, keys: StageKeys, claim: Claim) -> None:
        await self._run(self._release_shard, [keys.todo, keys.leased, keys.holders], [claim.shard, claim.holder])

    # --- heartbeats -------------------------------------------------------------------------------

    async def renew(
        self, lease_ms: int, *, requests: Sequence[Grant] = (), shards: Mapping[StageKeys, Sequence[Claim]] = {}
    ) -> tuple[list[Grant], list[Claim]]:
        """Extend every lease a worker holds in one round trip; returns the ones it has lost."""
        pipe = self.r.pipeline(transaction=False)
        if requests:
            await self._renew_requests(
                keys=[redis_keys.request(self.ns, g.key) for g in requests],
                args=[lease_ms, *[g.holder for g in requests]],
                client=pipe,
            )
        groups = [(k, list(c)) for k, c in shards.items() if c]
        for k, claims in groups:
            pairs: list[Any] = []
            for c in claims:
                pairs += [c.shard, c.holder]
            await self._renew_shards(keys=[k.leased, k.holders], args=[lease_ms, *pairs], client=pipe)
        if not requests and not groups:
            return [], []
        with ledger_errors():
            results = await pipe.execute()
        lost_requests: list[Grant] = []
        lost_shards: list[Claim] = []
        idx = 0
        if requests:
            lost_requests = [g for g, ok in zip(requests, results[0], strict=True) if not ok]
            idx = 1
        for (_, claims), oks in zip(groups, results[idx:], strict=True):
            lost_shards += [c for c, ok in zip(claims, oks, strict=True) if not ok]
        return lost_requests, lost_shards


def now_ms() -> int:
    return int(time.time() * 1000)
