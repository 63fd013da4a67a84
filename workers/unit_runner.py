"""Running one unit: the exactly-once-per-request discipline around a paid provider call.

The order of steps is the delivery guarantee:

1. the response cache (in the store) answers if anyone, in any run, already paid for this request
   (the shard worker looks up a whole shard's units at once when it claims the shard);
2. otherwise the worker takes the request's lease in Redis (fail closed: no Redis, no call), with its
   rate-limit slot and, under a cost cap, its cost reservation: one round trip;
3. re-checks the cache under the lease (someone may have finished between 1 and 2);
4. calls the provider while the worker's heartbeat keeps the lease alive (bounded retries, validation);
5. writes the answer to the cache with ``if_absent`` (first writer wins; a loser adopts the winner's
   answer, so every shard built from the cache is identical); a store down past its outage bound gets
   the answer kept in the node's spool instead (``data/response_spool.py``), committed on resume;
6. commits the lease with its fencing token, settling the cost and returning unused tokens: one round
   trip. Nothing of the request stays in Redis: the store has the answer.

A request is therefore paid for at most once, plus at most once more for each time a holder died or
stalled past ``lease_ms`` while its call was in flight. Progress and usage are tallied in the shard
(:class:`~punchline.data.units.ShardUsage`) and reach Redis with the shard's commit, not per unit.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable
from typing import Any, Protocol

import structlog

from punchline.data.errors import (
    BudgetExceeded,
    CacheMiss,
    LedgerUnavailable,
    ProviderError,
    PunchlineError,
    RetryableProviderError,
    StoreError,
)
from punchline.data.requests import ProviderResponse
from punchline.data.response_cache import ResponseCache
from punchline.data.response_spool import ResponseSpool
from punchline.data.units import ShardUsage, UnitResult, UnitSpec
from punchline.schedulers.leases import Grant, Held, Leases
from punchline.schedulers.rate_limit import RateScope, estimate_tokens
from punchline.workers.provider import Provider
from punchline.workers.validators import validator

log = structlog.get_logger("punchline.unit")


class CallFn(Protocol):
    async def __call__(
        self, provider: Provider, request: Any, usage: ShardUsage, slot_reserved: bool
    ) -> ProviderResponse: ...


class LeaseBook(Protocol):
    """Where a unit registers the request lease it holds, so the worker's one heartbeat renews it."""

    def hold(self, grant: Grant) -> None: ...

    def drop(self, grant: Grant) -> None: ...


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
        rate_scope: Callable[[str, str], RateScope | None] = lambda provider, model: None,
        offline: bool = False,
        estimate_usd: Callable[[Any], float] | None = None,
        max_invalid: int = 2,
        ledger_retry_s: float = 0.5,
        spool: ResponseSpool | None = None,
    ) -> None:
        self.leases = leases
        self.cache = cache
        self.providers = providers
        self.call = call
        self.book = book
        self.owner = owner
        self.lease_ms = lease_ms
        self.rate_scope = rate_scope
        self.offline = offline
        self.estimate_usd = estimate_usd
        self.max_invalid = max_invalid
        self.ledger_retry_s = ledger_retry_s
        self.spool = spool  # where a paid answer goes when the store cannot take it (committed on resume)

    async def run(self, unit: UnitSpec, usage: ShardUsage, cached: ProviderResponse | None = None) -> UnitResult:
        """The unit's result; ``cached`` is the answer the shard's look-up already found, if any.
        Raises :class:`BudgetExceeded` when the run's cap stops it before its call."""
        key = unit.request.key()
        if cached is not None:
            usage.cache_hits += 1
            usage.units_ok += 1
            return UnitResult(unit_id=unit.unit_id, key=key, response=cached)
        try:
            while True:
                try:
                    response = await self._obtain(unit, key, usage)
                    break
                except LedgerUnavailable as exc:  # no Redis, no call: wait and try again
                    log.warning("ledger_unavailable", unit=unit.unit_id, error=str(exc))
                    await asyncio.sleep(self.ledger_retry_s)
        except (ProviderError, CacheMiss) as exc:
            reason = f"{type(exc).__name__}: {exc}"
            usage.units_failed += 1
            log.warning("unit_failed", unit=unit.unit_id, reason=reason)
            return UnitResult(unit_id=unit.unit_id, key=key, error=reason)
        usage.units_ok += 1
        return UnitResult(unit_id=unit.unit_id, key=key, response=response)

    async def _cached(self, key: str) -> ProviderResponse | None:
        hit = await asyncio.to_thread(self.cache.get, key)
        return hit.response if hit else None

    async def _obtain(self, unit: UnitSpec, key: str, usage: ShardUsage) -> ProviderResponse:
        if self.offline:
            hit = await self._cached(key)
            if hit is not None:
                usage.cache_hits += 1
                return hit
            raise CacheMiss(f"offline and not cached: {unit.unit_id} ({unit.request.describe()})")
        request = unit.request
        provider = self.providers.get(request.provider)
        if provider is None:
            raise PunchlineError(f"no provider named {request.provider!r} in this run")
        from punchline.workers.providers import wire_calls

        rate = self.rate_scope(request.provider, request.model)
        tokens = estimate_tokens(request)
        estimate = self.estimate_usd(request) if self.estimate_usd is not None else 0.0
        while True:
            got = await self.leases.acquire(
                key,
                self.owner,
                self.lease_ms,
                rate=rate,
                requests=wire_calls(provider.settings, request),
                tokens=tokens,
                estimate_usd=estimate,
            )
            if isinstance(got, Grant):
                return await self._call_under_lease(unit, key, got, rate, tokens, usage)
            if not isinstance(got, Held):
                raise BudgetExceeded(f"the next unit ({unit.unit_id}) would exceed the budget")
            # Someone else holds it: their answer will appear in the cache (or their lease lapses).
            await asyncio.sleep(min(got.wait_ms, 1_000) / 1000 * (0.5 + random.random()))
            hit = await self._cached(key)
            if hit is not None:
                usage.cache_hits += 1
                return hit

    async def _call_under_lease(
        self, unit: UnitSpec, key: str, grant: Grant, rate: RateScope | None, tokens: int, usage: ShardUsage
    ) -> ProviderResponse:
        self.book.hold(grant)
        committed = False
        try:
            hit = await self._cached(key)
            if hit is not None:
                usage.cache_hits += 1
                committed = await self._commit(grant, rate, tokens, 0.0)
                return hit
            if grant.wait_s > 0:  # the rate-limit slot reserved with the lease
                await asyncio.sleep(grant.wait_s)
            response = await self._call_validated(unit, usage, slot_reserved=rate is not None)
            actual = self._cost(unit, response)
            usage.add_call(unit.request.model, response.input_tokens, response.output_tokens, actual)
            try:
                wrote = await asyncio.to_thread(self.cache.put, unit.request, response)
            except StoreError:  # the store stayed down past its bound: keep the paid answer on this disk
                if self.spool is not None:
                    await asyncio.to_thread(self.spool.keep, unit.request, response)
                    log.error("answer_spooled", unit=unit.unit_id, key=key, folder=str(self.spool.folder))
                raise
            if not wrote:  # someone raced us: adopt their answer so every copy is identical
                response = (await self._cached(key)) or response
            used = response.input_tokens + response.output_tokens
            committed = await self._commit(grant, rate, max(0, tokens - used) if used else 0, actual)
            if not committed:
                log.warning("lease_lost_at_commit", unit=unit.unit_id, key=key)
            committed = True
            return response
        finally:
            self.book.drop(grant)
            if not committed:
                with contextlib.suppress(LedgerUnavailable):
                    await self.leases.release(grant)

    async def _commit(self, grant: Grant, rate: RateScope | None, unused_tokens: int, actual_usd: float) -> bool:
        """Commit, waiting out a short Redis outage; after that the lease simply lapses (the answer is
        stored, so whoever takes the lease next finds it)."""
        delay = self.ledger_retry_s
        for _ in range(8):
            try:
                return await self.leases.commit(grant, rate=rate, unused_tokens=unused_tokens, actual_usd=actual_usd)
            except LedgerUnavailable as exc:
                log.warning("ledger_unavailable", key=grant.key, error=str(exc), retry_in_s=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
        return False

    def _cost(self, unit: UnitSpec, response: ProviderResponse) -> float:
        provider = self.providers[unit.request.provider]
        return provider.settings.cost_usd(unit.request.model, response.input_tokens, response.output_tokens)

    async def _call_validated(self, unit: UnitSpec, usage: ShardUsage, *, slot_reserved: bool) -> ProviderResponse:
        provider = self.providers[unit.request.provider]
        check = validator(unit.check)
        for attempt in range(self.max_invalid + 1):
            response = await self.call(provider, unit.request, usage, slot_reserved and attempt == 0)
            try:
                check(response)
                return response
            except RetryableProviderError as exc:
                if attempt == self.max_invalid:
                    raise
                log.info("invalid_answer_retry", unit=unit.unit_id, error=str(exc), attempt=attempt + 1)
        raise AssertionError("unreachable")
