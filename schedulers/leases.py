"""Leases as a worker takes them: one asynchronous round trip per step, for a group of units at a time.

Two kinds of lease, each with a fencing token from one global counter (so a token is never reused; a worker
takes its request leases' tokens from it in blocks of :data:`TOKEN_BLOCK`, so they are unique, not in order: a
commit or renewal compares the lease's whole value ``owner|token`` for equality, never tokens by size):

* a **request lease** (global, keyed by the request's content hash, shared by every run): a worker may
  call a paid provider only while it holds it, so two overlapping runs never pay twice. Taking it is one
  Lua script (``lua/lease_take.lua``) that also reserves the call's rate-limit slot
  (:data:`~punchline.schedulers.rate_limit.GCRA_LUA`) and, when the run has a cost cap, holds the call's
  estimated cost (:data:`~punchline.schedulers.budget.BUDGET_LUA`), for one unit or for a group of them
  (:meth:`Leases.acquire_many`; :mod:`punchline.schedulers.lease_groups` gathers the units of a worker that ask
  together): one ``SET NX`` per unit, one fencing ``INCRBY``, one rate reservation and one budget hold per group.
  Committing is one script for a group of leases (``lua/lease_settle.lua``): each lease, fenced by its token,
  becomes a done marker (one ``SET ... IFEQ``), and the group's costs are settled and unused tokens given back.
  Nothing is left behind: the answer is in the store, and the store is the truth.
* a **shard lease** (per run and stage): which worker processes which shard. Claims are O(log N)
  (see :mod:`punchline.schedulers.ledger`); the commit also adds the shard's counters and usage, so
  progress costs no round trip per unit.

A commit carries ``owner|token`` and is rejected if anyone has taken the lease since (the holder was
presumed dead and replaced), so a zombie can never release a successor's lease.

On a Redis Cluster a script may touch one slot only, and a group's request leases (slot groups by hash:
:func:`~punchline.schedulers.keys.request_group`), its provider's rate cells and its run's budget are in different
slots: there the take is the leases' ``SET NX`` (pipelined, their tokens from each group's own fence), then the
rate slots (``lua/rate_reserve_group.lua``), then the cost holds (``lua/budget_hold_group.lua``), then the leases
of the units that got no slot or hold are released; a commit settles the budget and refunds the rate first, then
marks the leases per slot group (``lua/lease_mark.lua``). The guarantee rests on the lease alone (no call without
it, no commit without its token), and each step is taken before the call and given back after it, so a crash
between two steps holds something a little longer (a lease until ``lease_ms``, a hold until its TTL), never pays.
"""

from __future__ import annotations

import asyncio
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
from punchline.schedulers.server.redis_client import is_cluster

# The scripts (schedulers/lua/<name>.lua: their KEYS, ARGV and replies); take and settle include the rate
# limiter's and the budget's, so a group's leases, rate slots and costs are one round trip.
_TAKE = lua.script("lease_take")
_SETTLE = lua.script("lease_settle")
_RELEASE = lua.script("lease_release")
_RENEW_REQUESTS = lua.script("lease_renew")
_CLAIM = lua.script("shard_claim")
_RENEW_SHARDS = lua.script("shard_renew")
_COMMIT_SHARD = lua.script("shard_commit")
_RELEASE_SHARD = lua.script("shard_release")
# a Redis Cluster's steps (see the module's docstring)
_RATE_GROUP = lua.script("rate_reserve_group")
_BUDGET_GROUP = lua.script("budget_hold_group")
_MARK = lua.script("lease_mark")
_RATE_REFUND = lua.script("rate_refund")
_BUDGET_SETTLE = lua.script("budget_settle")


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


class NotYet(msgspec.Struct, frozen=True):
    """The rate limit has no slot for this call soon (others of its group took them): ask again in ``wait_ms``.
    Nothing is held for it."""

    wait_ms: int


class Take(NamedTuple):
    """One unit's ask in a group take: its request's key, its wire calls and estimated tokens (the rate limit's),
    and the most it may cost (the budget's hold)."""

    key: str
    requests: int = 1
    tokens: int = 0
    estimate_usd: float = 0.0


class BudgetTerms(msgspec.Struct, frozen=True, kw_only=True):
    """A run's cost cap as the lease scripts take it (no cap: nothing is reserved or settled)."""

    run_id: str
    cap_usd: float | None = None
    holder: str = ""
    ttl_ms: int = 900_000


_NO_RATE = [0, 0, 0, 0, 0, 0, 1, 1, 0, 1, 1]
_NO_RATE_KEYS = list(UNLIMITED_RATE)
# a group take grants the rate-limit slots due within this long of its first call's; the rest ask again then
TAKE_AHEAD_MS = 1_000
# request-lease tokens a client takes from the fence at once (one INCRBY per this many leases, not one per lease)
TOKEN_BLOCK = 1_024
Taken = Grant | Held | Answered | OverBudget | NotYet


class Leases:
    """A worker's lease client over ``redis.asyncio``: no thread hop, no blocking call on the event loop."""

    def __init__(self, client: redis.asyncio.Redis, *, budget: BudgetTerms, namespace: str = NAMESPACE) -> None:
        self.r = client
        self.ns = namespace
        self.budget = budget
        self._budget = BudgetKeys(namespace, budget.run_id)
        self._budget_keys = self._budget.scripted
        self.cluster = is_cluster(client)
        # the request leases' tokens this client took from a fence: (next, end) per fence (one on a single Redis,
        # one per request group on a cluster)
        self._blocks: dict[str | None, tuple[int, int]] = {}
        self._ifeq: bool | None = None  # whether the server knows SET ... IFEQ (None: not asked yet)
        self._take = client.register_script(_TAKE)
        self._settle = client.register_script(_SETTLE)
        self._release = client.register_script(_RELEASE)
        self._renew_requests = client.register_script(_RENEW_REQUESTS)
        self._claim = client.register_script(_CLAIM)
        self._renew_shards = client.register_script(_RENEW_SHARDS)
        self._commit_shard = client.register_script(_COMMIT_SHARD)
        self._release_shard = client.register_script(_RELEASE_SHARD)
        self._rate_group = client.register_script(_RATE_GROUP)
        self._budget_group = client.register_script(_BUDGET_GROUP)
        self._mark = client.register_script(_MARK)
        self._rate_refund = client.register_script(_RATE_REFUND)
        self._budget_settle = client.register_script(_BUDGET_SETTLE)

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
    ) -> Taken:
        """Take a request's lease, its rate-limit slot and (with a cap) its cost reservation at once."""
        [got] = await self.acquire_many(owner, lease_ms, [Take(key, requests, tokens, estimate_usd)], rate=rate)
        return got

    async def acquire_many(
        self, owner: str, lease_ms: int, takes: Sequence[Take], *, rate: RateScope | None = None
    ) -> list[Taken]:
        """Take the leases of a group of units under one rate scope, in one round trip: each answer is what
        :meth:`acquire` would have answered for it asked alone, in order, at this instant, except that the rate
        limit grants only the calls due within :data:`TAKE_AHEAD_MS` of the first's (the others get
        :class:`NotYet` and hold nothing). Without a rate limit or a cost cap there is nothing to reserve: the
        leases are plain ``SET NX`` commands, pipelined (no script to run: a third of the server's time)."""
        if not takes:
            return []
        if self.cluster:
            return await self._take_cluster(owner, lease_ms, takes, rate)
        first = await self._tokens(len(takes))
        if rate is None and self.budget.cap_usd is None:
            return await self._take_plain(owner, lease_ms, takes, list(range(first, first + len(takes))))
        capped = self.budget.cap_usd is not None
        args: list[Any] = [
            owner,
            lease_ms,
            *(rate.args(0, 0) if rate is not None else _NO_RATE),
            self.budget.holder,
            repr(self._cap),
            self.budget.ttl_ms,
            TAKE_AHEAD_MS,
            first,
        ]
        for t in takes:
            args += [t.requests, t.tokens, repr(t.estimate_usd if capped else 0.0)]
        res = await self._run(
            self._take,
            [
                *(rate.keys if rate is not None else _NO_RATE_KEYS),
                *self._budget_keys,
                *(redis_keys.request(self.ns, t.key) for t in takes),
            ],
            args,
        )
        out: list[Taken] = []
        for i, t in enumerate(takes):
            code, value, wait = res[3 * i], res[3 * i + 1], res[3 * i + 2]
            if code == 1:
                est = t.estimate_usd if capped else 0.0
                out.append(Grant(t.key, owner, int(value), wait_s=max(0, int(wait)) / 1000, reserved_usd=est))
            elif code == 0:
                out.append(Held(max(int(value), 1)))
            elif code == 2:
                out.append(Answered(_text(value)))
            elif code == 3:
                out.append(OverBudget())
            else:
                out.append(NotYet(max(int(value), 1)))
        return out

    async def _tokens(self, n: int, group: str | None = None) -> int:
        """The first of ``n`` fresh tokens for request leases, from this client's block of ``group``'s fence (a
        new block of :data:`TOKEN_BLOCK` from the fence when it has fewer left: one ``INCRBY`` per that many)."""
        nxt, end = self._blocks.get(group, (0, 0))
        if end - nxt < n:
            size = max(n, TOKEN_BLOCK)
            with ledger_errors():
                last = int(await self.r.incrby(redis_keys.fence(self.ns, group), size))
            first = last - size + 1
            self._blocks[group] = (first + n, last + 1)
            return first
        self._blocks[group] = (nxt + n, end)
        return nxt

    async def _take_plain(self, owner: str, lease_ms: int, takes: Sequence[Take], tokens: Sequence[int]) -> list[Taken]:
        """The leases alone: one ``SET NX GET`` each (what it held, if anything: a done marker, or another's
        lease, whose time left one ``PTTL`` more tells)."""
        keys = [redis_keys.request(self.ns, t.key) for t in takes]
        pipe = self.r.pipeline(transaction=False)
        for key, token in zip(keys, tokens, strict=True):
            pipe.set(key, f"{owner}|{token}", nx=True, px=lease_ms, get=True)
        with ledger_errors():
            olds = await pipe.execute()
        held = [i for i, old in enumerate(olds) if old is not None and not _text(old).startswith("=")]
        left: dict[int, int] = {}
        if held:
            pipe = self.r.pipeline(transaction=False)
            for i in held:
                pipe.pttl(keys[i])
            with ledger_errors():
                left = dict(zip(held, await pipe.execute(), strict=True))
        out: list[Taken] = []
        for i, (t, old) in enumerate(zip(takes, olds, strict=True)):
            if old is None:
                out.append(Grant(t.key, owner, tokens[i]))
            elif i in left:
                out.append(Held(max(int(left[i]), 1)))
            else:
                out.append(Answered(_text(old)[1:]))
        return out

    async def _take_cluster(
        self, owner: str, lease_ms: int, takes: Sequence[Take], rate: RateScope | None
    ) -> list[Taken]:
        """:meth:`acquire_many` on a Redis Cluster: the leases (tokens from each request group's fence), then the
        rate slots, then the cost holds, one call each; the leases of the units that got neither are released."""
        tokens = [0] * len(takes)
        for group, indexes in _by_group([t.key for t in takes]).items():
            first = await self._tokens(len(indexes), group)
            for j, i in enumerate(indexes):
                tokens[i] = first + j
        # under a rate limit a lease is taken for TAKE_AHEAD_MS more (lease_take's pad: its slot's wait)
        pad = TAKE_AHEAD_MS if rate is not None else 0
        out = await self._take_plain(owner, lease_ms + pad, takes, tokens)
        granted = [i for i, got in enumerate(out) if isinstance(got, Grant)]
        if not granted or (rate is None and self.budget.cap_usd is None):
            return out
        drop: list[int] = []
        waits: dict[int, int] = {}
        if rate is not None:
            args: list[Any] = [*rate.args(0, 0), TAKE_AHEAD_MS]
            for i in granted:
                args += [takes[i].requests, takes[i].tokens]
            res = await self._run(self._rate_group, rate.keys, args)
            for i, wait in zip(granted, res, strict=True):
                if int(wait) < 0:
                    out[i] = NotYet(TAKE_AHEAD_MS)
                    drop.append(i)
                else:
                    waits[i] = int(wait)
            granted = [i for i in granted if i in waits]
        if self.budget.cap_usd is not None and granted:
            args = [self.budget.holder, repr(self._cap), self.budget.ttl_ms]
            args += [repr(takes[i].estimate_usd) for i in granted]
            fits = await self._run(self._budget_group, self._budget_keys, args)
            over = [i for i, fit in zip(granted, fits, strict=True) if not int(fit)]
            for i in over:
                out[i] = OverBudget()
                drop.append(i)
            if over and rate is not None:  # their rate tokens go back (their request slots are spent)
                unused = sum(max(0, takes[i].tokens) for i in over)
                await self._run(self._rate_refund, rate.keys, [*rate.args(0, 0), unused])
            granted = [i for i in granted if i not in over]
        for i in granted:
            got = out[i]
            assert isinstance(got, Grant)
            est = takes[i].estimate_usd if self.budget.cap_usd is not None else 0.0
            out[i] = Grant(got.key, owner, got.token, wait_s=max(0, waits.get(i, 0)) / 1000, reserved_usd=est)
        longer = [i for i in granted if waits.get(i, 0) > pad]
        if longer:
            pipe = self.r.pipeline(transaction=False)
            for i in longer:
                pipe.pexpire(redis_keys.request(self.ns, takes[i].key), lease_ms + waits[i])
            with ledger_errors():
                await pipe.execute()
        if drop:
            await asyncio.gather(
                *(
                    self._run(self._release, [redis_keys.request(self.ns, takes[i].key)], [f"{owner}|{tokens[i]}"])
                    for i in drop
                )
            )
        return out

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
        """Commit many request leases (the answers of a group commit): one script call per rate scope among them,
        or, with no rate limit and no cost cap (nothing to settle) and a server that knows ``SET ... IFEQ``
        (Valkey 8.1, Redis 8.4), one such command per lease, pipelined."""
        if self.cluster:
            return await self._settle_cluster(settles)
        if (
            self.budget.cap_usd is None
            and self._ifeq is not False
            and all(st.rate is None and st.pack for st in settles)
        ):
            plain = await self._settle_plain(settles)
            if plain is not None:
                return plain
        groups: dict[int, list[int]] = {}
        for i, st in enumerate(settles):
            groups.setdefault(id(st.rate), []).append(i)
        out = [False] * len(settles)
        for indexes in groups.values():
            for i, ok in zip(indexes, await self._settle_group([settles[i] for i in indexes]), strict=True):
                out[i] = ok
        return out

    async def _settle_plain(self, settles: Sequence[Settle]) -> list[bool] | None:
        """Each lease becomes its done marker if it is still its holder's (fenced: ``IFEQ owner|token``); None if
        the server does not know ``IFEQ`` (nothing was changed: every SET was refused)."""
        pipe = self.r.pipeline(transaction=False)
        for st in settles:
            key = redis_keys.request(self.ns, st.grant.key)
            pipe.execute_command("SET", key, f"={st.pack}", "IFEQ", st.grant.holder, "PX", MARKER_MS)
        with ledger_errors():
            res = await pipe.execute(raise_on_error=False)
        errors = [r for r in res if isinstance(r, redis.exceptions.ResponseError)]
        if errors:
            if "syntax" in str(errors[0]).lower() and len(errors) == len(res):
                self._ifeq = False
                return None
            raise errors[0]
        self._ifeq = True
        return [r is not None for r in res]

    async def _settle_cluster(self, settles: Sequence[Settle]) -> list[bool]:
        """:meth:`commit_many` on a Redis Cluster: the budget settled and the rate tokens given back first (a crash
        after them leaves leases that lapse, and their next holders find the answers in the cache: nothing is paid
        or counted twice), then the leases marked done, fenced, one call per slot group."""
        if self.budget.cap_usd is not None:
            reserved = sum(st.grant.reserved_usd for st in settles)
            actual = sum(st.actual_usd for st in settles)
            if reserved or actual:
                await self._run(
                    self._budget_settle,
                    self._budget_keys,
                    [self.budget.holder, repr(reserved), repr(actual), self.budget.ttl_ms],
                )
        scopes: dict[int, list[Settle]] = {}
        for st in settles:
            if st.rate is not None and st.unused_tokens > 0:
                scopes.setdefault(id(st.rate), []).append(st)
        for group in scopes.values():
            rate = group[0].rate
            assert rate is not None
            unused = sum(max(0, st.unused_tokens) for st in group)
            await self._run(self._rate_refund, rate.keys, [*rate.args(0, 0), unused])
        if self._ifeq is not False and all(st.pack for st in settles):
            plain = await self._settle_plain(settles)
            if plain is not None:
                return plain
        out = [False] * len(settles)
        groups = _by_group([st.grant.key for st in settles])

        async def mark(indexes: list[int]) -> None:
            args: list[Any] = [MARKER_MS]
            for i in indexes:
                args += [settles[i].grant.holder, settles[i].pack]
            keys = [redis_keys.request(self.ns, settles[i].grant.key) for i in indexes]
            for i, ok in zip(indexes, await self._run(self._mark, keys, args), strict=True):
                out[i] = bool(ok)

        await asyncio.gather(*(mark(indexes) for indexes in groups.values()))
        return out

    async def _settle_group(self, settles: Sequence[Settle]) -> list[bool]:
        rate = settles[0].rate
        args: list[Any] = [
            *(rate.args(0, 0) if rate is not None else _NO_RATE),
            sum(max(0, st.unused_tokens) for st in settles) if rate is not None else 0,
            self.budget.holder,
            repr(sum(st.grant.reserved_usd for st in settles)),
            repr(sum(st.actual_usd for st in settles)),
            repr(self._cap),
            self.budget.ttl_ms,
            MARKER_MS,
        ]
        for st in settles:
            args += [st.grant.holder, st.pack]
        res = await self._run(
            self._settle,
            [
                *(rate.keys if rate is not None else _NO_RATE_KEYS),
                *self._budget_keys,
                *(redis_keys.request(self.ns, st.grant.key) for st in settles),
            ],
            args,
        )
        return [bool(r) for r in res]

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
            self._claim, [keys.todo, keys.leased, keys.holders, keys.meta, keys.fence], [owner, lease_ms]
        )
        if res[0] == 1:
            return Claim(int(res[1]), owner, int(res[2]))
        if res[0] == 0:
            return max(int(res[1]), 1)
        return NoClaim(int(res[0]))

    async def commit_shard(
        self, keys: StageKeys, claim: Claim, *, counters: Mapping[str, float], usage: Mapping[str, float]
    ) -> bool:
        # a zero adds nothing: not sent (a reader takes a missing field for 0), one command fewer each
        counters = {name: value for name, value in counters.items() if value}
        args: list[Any] = [claim.shard, claim.holder, len(counters)]
        for name, value in counters.items():
            args += [name, repr(float(value)) if name == "cost_usd" else int(value)]
        for field, value in usage.items():
            if value:
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
        if self.cluster:
            return await self._renew_cluster(lease_ms, requests, shards)
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

    async def _renew_cluster(
        self, lease_ms: int, requests: Sequence[Grant], shards: Mapping[StageKeys, Sequence[Claim]]
    ) -> tuple[list[Grant], list[Claim]]:
        """:meth:`renew` on a Redis Cluster: one script call per request group and per stage, sent together (not
        pipelined: a script call alone loads the script on a master that lacks it, a replica just promoted)."""
        lost_requests: list[Grant] = []
        lost_shards: list[Claim] = []

        async def renew_requests(grants: list[Grant]) -> None:
            oks = await self._run(
                self._renew_requests,
                [redis_keys.request(self.ns, g.key) for g in grants],
                [lease_ms, *[g.holder for g in grants]],
            )
            lost_requests.extend(g for g, ok in zip(grants, oks, strict=True) if not ok)

        async def renew_shards(k: StageKeys, claims: list[Claim]) -> None:
            pairs: list[Any] = []
            for c in claims:
                pairs += [c.shard, c.holder]
            oks = await self._run(self._renew_shards, [k.leased, k.holders], [lease_ms, *pairs])
            lost_shards.extend(c for c, ok in zip(claims, oks, strict=True) if not ok)

        groups = _by_group([g.key for g in requests])
        await asyncio.gather(
            *(renew_requests([requests[i] for i in indexes]) for indexes in groups.values()),
            *(renew_shards(k, list(c)) for k, c in shards.items() if c),
        )
        return lost_requests, lost_shards


def _by_group(keys: Sequence[str]) -> dict[str, list[int]]:
    """The indexes of ``keys`` (request hashes) by slot group, in order."""
    groups: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(redis_keys.request_group(key), []).append(i)
    return groups


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def now_ms() -> int:
    return int(time.time() * 1000)
