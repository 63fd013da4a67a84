"""One bound on calls in flight for every worker on every node: a counting semaphore in Redis per provider
(and per model where one sets its own).

``max_concurrency`` of a ``[providers.<name>]`` table is how many calls that provider has in flight at once
across the whole run (every worker, the driver's own and Ray's, on every node; and every run sharing the
ledger, as the rate limit): a provider's concurrency limit is a fact of the account, set once. A model may set
its own ``max_concurrency`` too; a call of it then needs a place under both.

**Slots that expire.** Each scope is a sorted set of holder tokens scored by when they expire (Redis' own
clock). Taking a slot is one Lua script that first drops the expired tokens, then adds the caller's if the
set has room (in every scope of the call at once, or in none). The worker's heartbeat renews the tokens it
holds, as it renews its leases, so a worker killed mid-call gives its slots back when their ``ttl_ms`` (the
run's ``lease_ms``) runs out: a crash never leaks a slot for longer than a lease.

**Few round trips.** A slot a unit gives back goes straight to the next unit of the same worker waiting for
the same scope (no Redis call); only a slot nobody in the worker waits for goes back to Redis, batched with
the others given back within :data:`GIVE_LINGER_S`. A unit that asks before that batch is sent (the
worker's next unit, woken by the call slot the last one freed, takes its place within a few turns of the loop)
gets one of those slots, still held in Redis: no round trip either way (at 200 ms latency, two per call before;
at 0 ms, with the linger, about none per call instead of two). A slot kept that long is still counted against
the bound, so lingering never lets more calls out; it only makes another worker wait up to that long for it.
A worker's waiting units share one poller per
scope, which asks for as many slots as there are waiters in one round trip and, when the scope is full
(other workers hold it), polls again after a backoff (``POLL_FIRST_S`` doubling to ``POLL_MAX_S``, jittered):
one request per worker and scope at most every few ms, however many units wait. Slots are therefore not
shared out evenly between workers (a busy worker keeps handing its slots to its own units); the bound is.

Redis unreachable -> :class:`~punchline.data.errors.LedgerUnavailable` (no slot, no call: fail closed).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import redis.asyncio
import structlog

from punchline.data.provider_settings import ProviderSettings
from punchline.schedulers import keys as redis_keys
from punchline.schedulers import lua
from punchline.schedulers.keys import NAMESPACE
from punchline.schedulers.ledger import ledger_errors
from punchline.schedulers.server.redis_client import is_cluster

log = structlog.get_logger("punchline.inflight")

POLL_FIRST_S = 0.002  # a full scope is asked again after this long, doubling
POLL_MAX_S = 0.05  # up to this (a slot freed by another worker idles at most about this long)
GIVE_LINGER_S = 0.05  # a slot nobody in the worker waits for goes back to Redis after this long, unless taken again

# schedulers/lua/inflight_*.lua (their KEYS, ARGV and replies)
_TAKE = lua.script("inflight_take")
_GIVE = lua.script("inflight_give")
_RENEW = lua.script("inflight_renew")


class Bound(msgspec.Struct, frozen=True):
    """The run-wide bounds of one (provider, model): Redis keys and their limits, provider's first."""

    keys: tuple[str, ...]
    limits: tuple[int, ...]


def bounds_of(settings: ProviderSettings, provider: str, model: str, namespace: str = NAMESPACE) -> Bound:
    """The provider's ``max_concurrency``, plus the model's own when its entry sets one."""
    keys, limits = [redis_keys.inflight(namespace, provider)], [settings.max_concurrency]
    m = settings.price(model)
    if m is not None and m.max_concurrency is not None:
        keys.append(redis_keys.inflight(namespace, provider, model))
        limits.append(m.max_concurrency)
    return Bound(tuple(keys), tuple(limits))


class Ticket(msgspec.Struct, frozen=True):
    """A held slot: present it to :meth:`RunWideSlots.give`."""

    scope: tuple[str, str]  # (provider, model)
    token: str


class _Scope:
    """A worker's side of one (provider, model): the tokens it holds and its units waiting for one."""

    def __init__(self, bound: Bound) -> None:
        self.bound = bound
        self.held: set[str] = set()
        self.waiters: deque[asyncio.Future[Ticket]] = deque()
        self.poller: asyncio.Task[None] | None = None
        self.giving: list[str] = []  # given back, not yet sent to Redis


class RunWideSlots:
    """A worker's client of the run-wide bounds (one per worker, over its ``redis.asyncio`` client).

    ``take`` waits for a place in every bound of a (provider, model); ``give`` hands it to the next unit of
    this worker waiting for the same, else back to Redis. ``renew`` (the worker's heartbeat) keeps the held
    tokens from expiring while their calls run. A provider this client was not told about is not bounded."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        providers: Mapping[str, ProviderSettings],
        *,
        owner: str,
        ttl_ms: int,
        namespace: str = NAMESPACE,
        linger_s: float = GIVE_LINGER_S,
    ) -> None:
        self.r = client
        self.linger_s = linger_s
        self._hurry: asyncio.Event | None = None  # flushed() sends the slots given back without the linger
        self.providers = dict(providers)
        self.owner = owner
        self.ttl_ms = ttl_ms
        self.ns = namespace
        self._take = client.register_script(_TAKE)
        self._give = client.register_script(_GIVE)
        self._renew = client.register_script(_RENEW)
        self.cluster = is_cluster(client)
        self._scopes: dict[tuple[str, str], _Scope | None] = {}
        self._serial = itertools.count(1)
        self._flushing: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def _scope(self, provider: str, model: str) -> _Scope | None:
        key = (provider, model)
        if key not in self._scopes:
            settings = self.providers.get(provider)
            self._scopes[key] = None if settings is None else _Scope(bounds_of(settings, provider, model, self.ns))
        return self._scopes[key]

    def bounded(self, provider: str, model: str) -> bool:
        return self._scope(provider, model) is not None

    def held(self) -> int:
        """Slots this worker holds right now (its calls in flight, and those handed on)."""
        return sum(len(s.held) for s in self._scopes.values() if s is not None)

    async def take(self, provider: str, model: str) -> Ticket | None:
        """Wait for a slot of (provider, model); None when nothing bounds it."""
        scope = self._scope(provider, model)
        if scope is None:
            return None
        if scope.giving and not scope.waiters:  # given back this turn, not yet sent: still ours in Redis
            token = scope.giving.pop()
            scope.held.add(token)
            return Ticket((provider, model), token)
        fut: asyncio.Future[Ticket] = asyncio.get_running_loop().create_future()
        scope.waiters.append(fut)
        if scope.poller is None or scope.poller.done():
            scope.poller = asyncio.create_task(self._poll((provider, model), scope))
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self.give(fut.result())  # handed to us as we were cancelled: pass it on
            else:
                with contextlib.suppress(ValueError):
                    scope.waiters.remove(fut)
            raise

    async def _poll(self, name: tuple[str, str], scope: _Scope) -> None:
        """Ask Redis for as many slots as units wait; when the scope is full, again after a backoff."""
        delay = POLL_FIRST_S
        while True:
            while scope.waiters and scope.waiters[0].done():
                scope.waiters.popleft()
            if not scope.waiters:
                return
            tokens = [f"{self.owner}#{next(self._serial)}" for _ in scope.waiters]
            try:
                with ledger_errors():
                    got = int(
                        await self._take(
                            keys=list(scope.bound.keys),
                            args=[self.ttl_ms, len(tokens), *scope.bound.limits, *tokens],
                        )
                    )
            except Exception as exc:  # every waiter hears it (LedgerUnavailable: the unit waits it out)
                for fut in scope.waiters:
                    if not fut.done():
                        fut.set_exception(exc)
                scope.waiters.clear()
                return
            for token in tokens[:got]:
                scope.held.add(token)
                if not self._hand(name, scope, token):  # its unit stopped waiting meanwhile
                    self.give(Ticket(name, token))
            if got:
                delay = POLL_FIRST_S
                continue
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, POLL_MAX_S)

    def _hand(self, name: tuple[str, str], scope: _Scope, token: str) -> bool:
        """Give a held token to the first unit still waiting; False if none waits."""
        while scope.waiters:
            fut = scope.waiters.popleft()
            if not fut.done():
                fut.set_result(Ticket(name, token))
                return True
        return False

    def give(self, ticket: Ticket | None) -> None:
        """Give a slot up (never waits): to this worker's next unit waiting for it, else back to Redis soon."""
        if ticket is None:
            return
        scope = self._scope(*ticket.scope)
        if scope is None or ticket.token not in scope.held:
            return
        if self._hand(ticket.scope, scope, ticket.token):
            return
        scope.held.discard(ticket.token)
        scope.giving.append(ticket.token)
        if self._flushing is None or self._flushing.done():
            self._flushing = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        """Send the tokens given back within ``linger_s`` in one round trip. If Redis cannot take them, they
        expire by themselves within ``ttl_ms``."""
        if self._hurry is None:
            self._hurry = asyncio.Event()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._hurry.wait(), self.linger_s)
        while True:  # until none is left: more are given back while a round trip is on its way
            groups = []
            for scope in self._scopes.values():
                if scope is not None and scope.giving:
                    tokens, scope.giving = scope.giving, []
                    groups.append((list(scope.bound.keys), tokens))
            if not groups:
                return
            try:
                with ledger_errors():
                    if len(groups) == 1:  # one script call (a pipeline asks SCRIPT EXISTS first)
                        await self._give(keys=groups[0][0], args=groups[0][1])
                    elif self.cluster:  # one call per provider (slot), sent together (see renew)
                        await asyncio.gather(*(self._give(keys=keys, args=tokens) for keys, tokens in groups))
                    else:
                        pipe = self.r.pipeline(transaction=False)
                        for keys, tokens in groups:
                            await self._give(keys=keys, args=tokens, client=pipe)
                        await pipe.execute()
            except Exception as exc:
                log.warning("inflight_give_failed", error=f"{type(exc).__name__}: {exc}")

    async def flushed(self) -> None:
        """Wait until the places given back so far have reached Redis (a worker's work call ends with it)."""
        while self._flushing is not None and not self._flushing.done():
            if self._hurry is not None:
                self._hurry.set()
            await asyncio.shield(self._flushing)
        if self._hurry is not None:
            self._hurry.clear()

    async def renew(self) -> int:
        """Extend every held token by ``ttl_ms`` (one round trip); returns how many Redis no longer had (their
        holder stalled past ``ttl_ms``: the bound may have been exceeded by that many meanwhile)."""
        groups = [(s, sorted(s.held)) for s in self._scopes.values() if s is not None and s.held]
        if not groups:
            return 0
        results: Sequence[Any]
        if self.cluster:  # a script call alone loads it on a master that lacks it (a replica just promoted)
            with ledger_errors():
                results = await asyncio.gather(
                    *(self._renew(keys=list(s.bound.keys), args=[self.ttl_ms, *tokens]) for s, tokens in groups)
                )
        else:
            pipe = self.r.pipeline(transaction=False)
            for scope, tokens in groups:
                await self._renew(keys=list(scope.bound.keys), args=[self.ttl_ms, *tokens], client=pipe)
            with ledger_errors():
                results = await pipe.execute()
        lost = 0
        for (scope, tokens), renewed in zip(groups, results, strict=True):
            # a token given back while the renewal ran is not lost
            lost += max(0, len([t for t in tokens if t in scope.held]) - int(renewed))
        return lost
