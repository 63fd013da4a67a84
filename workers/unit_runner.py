"""Running one unit: the exactly-once-per-request discipline around a paid provider call.

The order of steps is the delivery guarantee:

1. the response cache (in the store) answers if anyone, in any run, already paid for this request
   (the shard worker looks up a whole shard's units at once when it claims the shard);
2. otherwise the worker takes the request's lease in Redis (fail closed: no Redis, no call), with its
   rate-limit slot and, under a cost cap, its cost reservation: one round trip, shared by the worker's units
   that ask in the same moment (:mod:`punchline.schedulers.lease_groups`). If the request's
   holder committed it moments ago, the answer is a *done marker* naming the pack that holds it;
3. re-checks the cache under the lease (someone may have finished between 1 and 2): in memory, from
   the worker's index of response-cache packs, refreshed when older than the markers cover;
4. calls the provider while the worker's heartbeat keeps the lease alive (bounded retries, validation),
   then gives up its call slot;
5. hands the answer to the worker's group commit (:mod:`punchline.workers.group_commit`), which writes
   the answers of a short spell as one pack (an answer already stored by someone else is adopted, so
   every shard built from the cache is identical; a store down past its outage bound gets the answers
   kept in the node's spool instead, ``data/storage/response_spool.py``, committed on resume) and, once the
   pack is durable,
6. commits their leases with their fencing tokens in one script call, settling costs and returning
   unused tokens; each lease becomes a done marker for ``MARKER_MS``, then nothing of the request stays
   in Redis: the store has the answer.

A request is therefore paid for at most once, plus at most once more for each time a holder died or
stalled past ``lease_ms`` while its call was in flight. Progress and usage are tallied in the shard
(:class:`~punchline.data.units.ShardUsage`) and reach Redis with the shard's commit, not per unit.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import structlog

from punchline.data.backoff import constant, retry_async
from punchline.data.errors import (
    BudgetExceeded,
    CacheMiss,
    LedgerUnavailable,
    ProviderError,
    PunchlineError,
    RetryableProviderError,
)
from punchline.data.requests import ProviderResponse
from punchline.data.storage.response_cache import CachedResponse, ResponseCache
from punchline.data.storage.response_spool import ResponseSpool
from punchline.data.units import ShardUsage, UnitResult, UnitSpec
from punchline.schedulers.inflight import RunWideSlots, Ticket
from punchline.schedulers.lease_groups import LeaseGroups
from punchline.schedulers.leases import Answered, Grant, Held, Leases, NotYet, Settle
from punchline.schedulers.rate_limit import RateScope, estimate_tokens
from punchline.workers.calls.validators import validator
from punchline.workers.driver_watch import DriverGone
from punchline.workers.group_commit import GroupCommit, LeaseBook
from punchline.workers.held_leases import LeaseLost
from punchline.workers.provider import Provider
from punchline.workers.providers import wire_calls

log = structlog.get_logger("punchline.unit")
# units of one worker that may wait on requests held by others with their call slots given back
MAX_ASIDE = 64
# how often a unit waiting for a call place looks whether its driver is gone
STOP_LOOK_S = 0.25
# how long a unit waits for an unreachable ledger before its worker gives up (the driver's own patience,
# ``schedulers/ledger.patiently``): no lease, no call, so nothing is paid meanwhile
LEDGER_WAIT_S = 600.0


class CallFn(Protocol):
    async def __call__(
        self,
        provider: Provider,
        request: Any,
        usage: ShardUsage,
        slot_reserved: bool,
        pause: Callable[[float], Awaitable[None]] | None = None,
        retries: bool = True,
    ) -> ProviderResponse: ...


class Slot:
    """A unit's place in the worker's window and, separately, among its calls in flight.

    The window (``limit``) is taken before the unit's lease; the call slot (``calls``) only once the lease
    is granted and the cache has said no, right before the provider is called. So the worker keeps exactly
    its in-flight bound of calls at the provider while a few more units take their leases (a Redis round
    trip and its fsync) beside them, instead of each call slot idling through its unit's lease. Both are
    given up as soon as the answer is in hand (the group commit that follows needs neither). Giving them up
    twice is harmless.

    ``run_wide``: after the worker's call slot, the unit takes a place under its provider's (and model's)
    run-wide bound (:mod:`punchline.schedulers.inflight`), and gives it up as soon as its call returns or
    pauses for a retry's backoff.

    ``on_free`` tells the worker the unit no longer counts against its window (it may claim more); it is
    called once, when the slot is freed or when the unit first steps aside. The slot also carries what the
    unit's call took (``latency_s``, ``retries``) to its :class:`UnitResult`."""

    def __init__(
        self,
        limit: asyncio.Semaphore | None = None,
        on_free: Callable[[], None] | None = None,
        calls: asyncio.Semaphore | None = None,
        run_wide: RunWideSlots | None = None,
    ) -> None:
        self.limit = limit
        self.on_free = on_free
        self.calls = calls
        self.run_wide = run_wide
        self.scope: tuple[str, str] | None = None  # (provider, model) of the unit's call
        self.ticket: Ticket | None = None  # its place under the run-wide bound, while it calls
        self.held = False
        self.calling = False
        self.freed = False
        self.counted = True  # the unit still counts against the worker's window (on_free not called yet)
        self.latency_s: float | None = None  # first attempt to accepted answer (None: no call answered it)
        self.retries = 0  # failed attempts tried again, malformed and invalid answers included

    async def take(self) -> None:
        if self.limit is not None and not self.held and not self.freed:
            await self.limit.acquire()
            self.held = True

    async def call(self, provider: str | None = None, model: str | None = None) -> None:
        """Wait for a call slot (the unit holds its lease by now), then for a run-wide place of (provider, model)."""
        if provider is not None and model is not None:
            self.scope = (provider, model)
        if self.calls is not None and not self.calling and not self.freed:
            await self.calls.acquire()
            self.calling = True
        if self.run_wide is not None and self.scope is not None and self.ticket is None and not self.freed:
            self.ticket = await self.run_wide.take(*self.scope)

    def called(self) -> None:
        """The call returned: its run-wide place goes to the next call at once (the unit's commit needs none)."""
        if self.ticket is not None and self.run_wide is not None:
            self.run_wide.give(self.ticket)
        self.ticket = None

    async def pause(self, delay_s: float) -> None:
        """Wait out a retry's backoff without the call slots (another unit calls meanwhile), then take them again."""
        calling = self.calling or self.ticket is not None
        if self.calling and self.calls is not None:
            self.calls.release()
            self.calling = False
        self.called()
        await asyncio.sleep(delay_s)
        if calling:
            await self.call()

    def step_aside(self) -> None:
        """Give the window back while the unit waits on a request someone else holds (the worker may claim
        other shards meanwhile); :meth:`take` gets a place again."""
        self._release()
        self._uncount()

    def free(self) -> None:
        self._release()
        if not self.freed:
            self.freed = True
            self._uncount()

    def _release(self) -> None:
        if self.held and self.limit is not None:
            self.limit.release()
        if self.calling and self.calls is not None:
            self.calls.release()
        self.called()
        self.held = self.calling = False

    def _uncount(self) -> None:
        if self.counted:
            self.counted = False
            if self.on_free is not None:
                self.on_free()


class UnitRunner:
    """Runs units for one worker. Dependencies are passed in so tests can run it without Ray."""

    def __init__(
        self,
        *,
        leases: Leases,
        cache: ResponseCache,
        providers: dict[str, Provider],
        call: CallFn,
        book: LeaseBook,
        owner: str,
        lease_ms: int,
        commits: GroupCommit | None = None,
        rate_scope: Callable[[str, str], RateScope | None] = lambda provider, model: None,
        offline: bool = False,
        estimate_usd: Callable[[Any], float] | None = None,
        max_invalid: int = 2,
        ledger_retry_s: float = 0.5,
        spool: ResponseSpool | None = None,
        max_aside: int = MAX_ASIDE,
        ledger_wait_s: float = LEDGER_WAIT_S,
        stopping: Callable[[], bool] = lambda: False,
    ) -> None:
        self.leases = leases
        self.cache = cache
        self.providers = providers
        self.call = call
        self.book = book
        self.owner = owner
        self.lease_ms = lease_ms
        self._commits = commits
        self._takes: LeaseGroups | None = None
        self.rate_scope = rate_scope
        self.offline = offline
        self.estimate_usd = estimate_usd
        self.max_invalid = max_invalid
        self.ledger_retry_s = ledger_retry_s
        self.spool = spool  # where a paid answer goes when the store cannot take it (committed on resume)
        self.max_aside = max_aside
        # the ledger's outage is waited out for ledger_wait_s at most, and not at all once the driver is gone
        # (stopping): a worker whose driver was killed must end even if its ledger never comes back
        self.ledger_wait_s = ledger_wait_s
        self.stopping = stopping
        self.aside = 0  # units waiting on a request someone else holds, their slots given back

    @property
    def commits(self) -> GroupCommit:
        """The worker's group commit (made on first use, inside the running event loop)."""
        if self._commits is None:
            self._commits = GroupCommit(
                self.cache, self.leases, self.book, ledger_retry_s=self.ledger_retry_s, spool=self.spool
            )
        return self._commits

    @property
    def takes(self) -> LeaseGroups:
        """The worker's gathered lease takes (made on first use, inside the running event loop)."""
        if self._takes is None:
            self._takes = LeaseGroups(self.leases)
        return self._takes

    async def run(
        self, unit: UnitSpec, usage: ShardUsage, cached: ProviderResponse | None = None, *, slot: Slot | None = None
    ) -> UnitResult:
        """The unit's result; ``cached`` is the answer the shard's look-up already found, if any.
        Raises :class:`BudgetExceeded` when the run's cap stops it before its call, and instead of a failure that
        must not be recorded: :class:`DriverGone` once the driver is gone (a draining worker retries nothing, so
        its failures say nothing of the request), :class:`LeaseLost` when the request's lease was lost under the
        call. Either way its shard goes back unwritten and the unit is asked again."""
        key = unit.request.key()
        slot = slot or Slot()
        try:
            if cached is not None:
                usage.cache_hits += 1
                usage.units_ok += 1
                return UnitResult(unit_id=unit.unit_id, key=key, response=cached)
            await slot.take()
            try:
                response = await retry_async(  # no Redis, no call: wait and try again
                    lambda: self._obtain(unit, key, usage, slot),
                    retry_on=(LedgerUnavailable,),
                    backoff=constant(self.ledger_retry_s),
                    deadline_s=self.ledger_wait_s,
                    when=lambda _exc: not self.stopping(),
                    on_retry=lambda exc, _n, _d: log.warning("ledger_unavailable", unit=unit.unit_id, error=str(exc)),
                )
            except LedgerUnavailable as exc:  # nothing was paid: no lease was taken, or it was given back
                if self.stopping():
                    raise DriverGone(f"the driver is gone while the ledger is unreachable ({exc})") from exc
                raise
            except (ProviderError, CacheMiss) as exc:
                if self.stopping():  # a draining worker retries nothing: the failure may be only the drain's
                    raise DriverGone(f"the driver is gone: {unit.unit_id} failed ({exc}), left to the next") from exc
                reason = f"{type(exc).__name__}: {exc}"
                usage.units_failed += 1
                usage.add_unit(unit.request.model, None, slot.retries)
                log.warning("unit_failed", unit=unit.unit_id, reason=reason)
                # a resume calls it again unless the error is permanent (or the unit asked for no retries)
                retryable = isinstance(exc, ProviderError) and exc.retryable and unit.retries
                return UnitResult(
                    unit_id=unit.unit_id, key=key, error=reason, retries=slot.retries, retryable=retryable
                )
            usage.units_ok += 1
            return UnitResult(
                unit_id=unit.unit_id, key=key, response=response, latency_s=slot.latency_s, retries=slot.retries
            )
        finally:
            slot.free()

    async def _indexed(self, key: str) -> ProviderResponse | None:
        """The answer if a pack holds it, refreshing an index too old for the done markers to cover;
        in memory (no thread hop) unless a pack must be read."""
        if self.cache.stale():
            await asyncio.to_thread(self.cache.refresh)
        if self.cache.in_memory(key):
            hit = self.cache.indexed(key)
        else:
            hit = await asyncio.to_thread(self.cache.indexed, key)
        return hit.response if hit else None

    async def _answered(self, key: str, pack: str) -> ProviderResponse | None:
        """The answer a done marker points at."""
        if self.cache.pack_of(key) != pack:
            await asyncio.to_thread(self.cache.load, pack)
        return await self._indexed(key)

    async def _obtain(self, unit: UnitSpec, key: str, usage: ShardUsage, slot: Slot) -> ProviderResponse:
        if self.offline:
            hit = await asyncio.to_thread(self.cache.get, key)
            if hit is not None:
                usage.cache_hits += 1
                return hit.response
            raise CacheMiss(f"offline and not cached: {unit.unit_id} ({unit.request.describe()})")
        request = unit.request
        provider = self.providers.get(request.provider)
        if provider is None:
            raise PunchlineError(f"no provider named {request.provider!r} in this run")
        rate = self.rate_scope(request.provider, request.model)
        tokens = estimate_tokens(request)
        estimate = self.estimate_usd(request) if self.estimate_usd is not None else 0.0
        while True:
            got = await self.takes.take(
                key,
                self.owner,
                self.lease_ms,
                rate=rate,
                requests=wire_calls(provider.settings, request),
                tokens=tokens,
                estimate_usd=estimate,
            )
            if isinstance(got, Grant):
                return await self._call_under_lease(unit, key, got, rate, tokens, usage, slot)
            if isinstance(got, Answered):  # its holder committed it moments ago
                answer = await self._answered(key, got.pack)
                if answer is not None:
                    usage.cache_hits += 1
                    return answer
                wait_ms = 500
            elif isinstance(got, Held):
                wait_ms = got.wait_ms
            elif isinstance(got, NotYet):  # the rate limit's next slots went to others of its group: soon
                await asyncio.sleep(got.wait_ms / 1000 * (0.5 + random.random()))
                if self.stopping():
                    raise DriverGone(f"the driver is gone while {unit.unit_id} waited for a rate-limit slot")
                continue
            else:
                raise BudgetExceeded(f"the next unit ({unit.unit_id}) would exceed the budget")
            # Someone else holds it: their answer will appear in the cache (or their lease lapses: a dead
            # holder's lasts up to lease_ms). The unit waits without its call slot, so the worker's other
            # units (and shards) go on meanwhile.
            await self._wait_aside(slot, min(wait_ms, 1_000) / 1000 * (0.5 + random.random()))
            if self.stopping():  # a draining worker starts nothing new: the next driver asks again
                raise DriverGone(f"the driver is gone while {unit.unit_id} waited for its request's holder")

    async def _wait_aside(self, slot: Slot, wait_s: float) -> None:
        """Sleep ``wait_s`` with the call slot given back (up to ``max_aside`` units at once: beyond them a
        worker would claim shard after shard of requests held by others), then take a slot again."""
        aside = self.aside < self.max_aside
        if aside:
            slot.step_aside()
            self.aside += 1
        try:
            await asyncio.sleep(wait_s)
        finally:
            if aside:
                self.aside -= 1
        await slot.take()

    async def _call_under_lease(
        self,
        unit: UnitSpec,
        key: str,
        grant: Grant,
        rate: RateScope | None,
        tokens: int,
        usage: ShardUsage,
        slot: Slot,
    ) -> ProviderResponse:
        self.book.hold(grant)
        committed = False
        try:
            hit = await self._indexed(key)  # someone may have finished between the shard's look-up and now
            if hit is not None:
                usage.cache_hits += 1
                pack = self.cache.pack_of(key) or ""
                self.book.closing(grant)
                await self.leases.commit(grant, rate=rate, unused_tokens=tokens, pack=pack)
                committed = True
                return hit
            if grant.wait_s > 0:  # the rate-limit slot reserved with the lease
                await asyncio.sleep(grant.wait_s)
            await self._wait_for_call(slot, unit)
            response = await self._call_validated(unit, usage, slot, slot_reserved=rate is not None)
            slot.called()
            if self.commits.has_room():  # the answer is in hand: the next unit may call while it is stored
                slot.free()
            actual = self._cost(unit, response)
            usage.add_call(unit.request.model, response.input_tokens, response.output_tokens, actual)
            usage.add_unit(unit.request.model, slot.latency_s, slot.retries)
            used = response.input_tokens + response.output_tokens
            entry = CachedResponse(request=unit.request, response=response)
            settle = Settle(grant, rate, max(0, tokens - used) if used else 0, actual)
            stored, ok = await self.commits.submit(entry, settle)
            if not ok:
                log.warning("lease_lost_at_commit", unit=unit.unit_id, key=key)
            committed = True
            return stored.response  # the cache's answer, whoever holds the lease now: the same bytes for all
        except ProviderError as exc:
            if self.book.lost(grant):  # expired or taken over under the call: its next holder answers it
                raise LeaseLost(f"{unit.unit_id}: its request's lease was lost while it called ({exc})") from exc
            raise
        finally:
            slot.called()  # a call that failed (or was never made) gives its run-wide place back at once
            self.book.drop(grant)
            if not committed:
                self.book.closing(grant)
                with contextlib.suppress(LedgerUnavailable):
                    await self.leases.release(grant)

    async def _wait_for_call(self, slot: Slot, unit: UnitSpec) -> None:
        """Wait for a call slot and a run-wide place, looking at the driver meanwhile: the places may all be held
        by other workers for a long time, and a unit of a draining worker must not keep it alive waiting for one
        it would not use (the look before the call would refuse it anyway). Leaves the lease to the next driver."""
        waiting = asyncio.ensure_future(slot.call(unit.request.provider, unit.request.model))
        while True:
            done, _ = await asyncio.wait({waiting}, timeout=STOP_LOOK_S)
            if done:
                waiting.result()
                return
            if self.stopping():
                waiting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await waiting
                raise DriverGone(f"the driver is gone: {unit.unit_id} waited for a call place, left unpaid")

    def _cost(self, unit: UnitSpec, response: ProviderResponse) -> float:
        provider = self.providers[unit.request.provider]
        return provider.settings.cost_usd(unit.request.model, response.input_tokens, response.output_tokens)

    async def _call_validated(
        self, unit: UnitSpec, usage: ShardUsage, slot: Slot, *, slot_reserved: bool
    ) -> ProviderResponse:
        provider = self.providers[unit.request.provider]
        check = validator(unit.check)
        started = time.monotonic()
        for attempt in range(self.max_invalid + 1):
            # the last look before money is spent: a driver killed while this unit took its lease or waited for a
            # call slot starts no call (on its machine the pid says so at once); the lease is given back
            if self.stopping():
                raise DriverGone(f"the driver is gone: {unit.unit_id} is left to the next driver, unpaid")
            own = ShardUsage()  # this unit's attempts, then added to its shard's (shared by its units in flight)
            try:
                response = await self.call(
                    provider, unit.request, own, slot_reserved and attempt == 0, slot.pause, retries=unit.retries
                )
            finally:
                usage.add(own)
                slot.retries += own.provider_retries
            try:
                check(response)
                slot.latency_s = time.monotonic() - started
                return response
            except RetryableProviderError as exc:
                if attempt == self.max_invalid:
                    raise
                slot.retries += 1
                log.info("invalid_answer_retry", unit=unit.unit_id, error=str(exc), attempt=attempt + 1)
        raise AssertionError("unreachable")
