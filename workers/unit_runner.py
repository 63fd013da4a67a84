"""Running one unit: the exactly-once-per-request discipline around a paid provider call.

The order of steps is the delivery guarantee:

1. the response cache (in the store) answers if anyone, in any run, already paid for this request;
2. otherwise the worker takes the request's lease in Redis (fail closed: no Redis, no call);
3. re-checks the cache under the lease (someone may have finished between 1 and 2);
4. calls the provider while a heartbeat keeps the lease alive (bounded retries, validation);
5. writes the answer to the cache with ``if_absent`` (first writer wins; a loser adopts the
   winner's answer, so every shard built from the cache is identical);
6. commits the lease with its fencing token (rejected if the lease was taken over meanwhile).

A request is therefore paid for at most once, plus at most once more for each time a holder died
or stalled past ``lease_ms`` while its call was in flight.
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
)
from punchline.data.requests import ProviderResponse
from punchline.data.response_cache import ResponseCache
from punchline.data.units import UnitResult, UnitSpec
from punchline.schedulers.ledger import Grant, Ledger
from punchline.workers.provider import Provider
from punchline.workers.validators import validator

log = structlog.get_logger("punchline.unit")


class Budget(Protocol):
    def reserve(self, estimate_usd: float) -> bool: ...

    def settle(self, reserved_usd: float, actual_usd: float) -> None: ...

    def record(self, stage: str, model: str, input_tokens: int, output_tokens: int, usd: float) -> None: ...


class CallFn(Protocol):
    async def __call__(self, provider: Provider, request: Any) -> ProviderResponse: ...


class UnitRunner:
    """Runs units for one worker. Dependencies are passed in so tests can run it without Ray."""

    def __init__(
        self,
        *,
        ledger: Ledger,
        cache: ResponseCache,
        providers: dict[str, Provider],
        call: CallFn,
        owner: str,
        lease_ms: int,
        run_id: str,
        stage: str,
        offline: bool = False,
        budget: Budget | None = None,
        estimate_usd: Callable[[Any], float] | None = None,
        max_invalid: int = 2,
        ledger_retry_s: float = 0.5,
    ) -> None:
        self.ledger = ledger
        self.cache = cache
        self.providers = providers
        self.call = call
        self.owner = owner
        self.lease_ms = lease_ms
        self.run_id = run_id
        self.stage = stage
        self.offline = offline
        self.budget = budget
        self.estimate_usd = estimate_usd
        self.max_invalid = max_invalid
        self.ledger_retry_s = ledger_retry_s

    async def _ledger(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Call the ledger, waiting out Redis outages: nothing proceeds without it."""
        delay = self.ledger_retry_s
        while True:
            try:
                return await asyncio.to_thread(fn, *args)
            except LedgerUnavailable as exc:
                log.warning("ledger_unavailable", error=str(exc), retry_in_s=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)

    def _count(self, **kw: float) -> None:
        with contextlib.suppress(LedgerUnavailable):
            self.ledger.count(self.run_id, self.stage, **kw)

    async def run(self, unit: UnitSpec) -> UnitResult:
        key = unit.request.key()
        try:
            while True:
                try:
                    response = await self._obtain(unit, key)
                    break
                except LedgerUnavailable as exc:  # e.g. the rate limiter lost Redis: no call, wait, retry
                    log.warning("ledger_unavailable", unit=unit.unit_id, error=str(exc))
                    await asyncio.sleep(self.ledger_retry_s)
        except BudgetExceeded:
            raise
        except (ProviderError, CacheMiss) as exc:
            reason = f"{type(exc).__name__}: {exc}"
            with contextlib.suppress(LedgerUnavailable):
                self.ledger.record_failure(self.run_id, self.stage, unit.unit_id, reason)
            self._count(units_failed=1)
            log.warning("unit_failed", unit=unit.unit_id, reason=reason)
            return UnitResult(unit_id=unit.unit_id, key=key, error=reason)
        return UnitResult(unit_id=unit.unit_id, key=key, response=response)

    async def _cached(self, key: str) -> ProviderResponse | None:
        hit = await asyncio.to_thread(self.cache.get, key)
        return hit.response if hit else None

    async def _obtain(self, unit: UnitSpec, key: str) -> ProviderResponse:
        hit = await self._cached(key)
        if hit is not None:
            self._count(cache_hits=1)
            return hit
        if self.offline:
            raise CacheMiss(f"offline and not cached: {unit.unit_id} ({unit.request.describe()})")
        while True:
            got = await self._ledger(self.ledger.acquire_request, key, self.owner, self.lease_ms)
            if isinstance(got, Grant):
                return await self._call_under_lease(unit, key, got)
            # Done elsewhere (None) or held by someone else (ms left): the answer will appear in the cache.
            hit = await self._cached(key)
            if hit is not None:
                self._count(cache_hits=1)
                return hit
            wait_ms = 200 if got is None else min(int(got), 1_000)
            await asyncio.sleep(wait_ms / 1000 * (0.5 + random.random()))
            if got is None and not await self._ledger(self.ledger.request_done, key):
                continue
            if got is None:
                # A done-record without a cached answer (e.g. the cache was moved): the ledger and
                # the store disagree, and the store wins. Take the lease by force of a new fence.
                await self._ledger(self.ledger.forget_request, key)

    async def _call_under_lease(self, unit: UnitSpec, key: str, grant: Grant) -> ProviderResponse:
        stop = asyncio.Event()
        heartbeat = asyncio.create_task(self._heartbeat(grant, stop))
        reserved = 0.0
        try:
            hit = await self._cached(key)
            if hit is not None:
                self._count(cache_hits=1)
                await self._ledger(self.ledger.commit_request, grant, self.cache.path(key))
                return hit
            if self.budget is not None and self.estimate_usd is not None:
                reserved = self.estimate_usd(unit.request)
                if not await asyncio.to_thread(self.budget.reserve, reserved):
                    raise BudgetExceeded(f"the next unit ({unit.unit_id}) would exceed the budget")
            response = await self._call_validated(unit)
            actual = self._cost(unit, response)
            if self.budget is not None:
                await asyncio.to_thread(self.budget.settle, reserved, actual)
                reserved = 0.0
                with contextlib.suppress(LedgerUnavailable):
                    await asyncio.to_thread(
                        self.budget.record,
                        self.stage,
                        unit.request.model,
                        response.input_tokens,
                        response.output_tokens,
                        actual,
                    )
            self._count(
                input_tokens=response.input_tokens,
                output_tokens=response.output_tokens,
                cost_usd=actual,
            )
            wrote = await asyncio.to_thread(self.cache.put, unit.request, response)
            if not wrote:  # someone raced us: adopt their answer so every copy is identical
                stored = await self._cached(key)
                response = stored or response
            committed = await self._ledger(self.ledger.commit_request, grant, self.cache.path(key))
            if not committed:
                log.warning("lease_lost_at_commit", unit=unit.unit_id, key=key)
            return response
        except BaseException:
            if self.budget is not None and reserved:
                with contextlib.suppress(Exception):
                    self.budget.settle(reserved, 0.0)
            with contextlib.suppress(LedgerUnavailable):
                self.ledger.release_request(grant)
            raise
        finally:
            stop.set()
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat

    def _cost(self, unit: UnitSpec, response: ProviderResponse) -> float:
        provider = self.providers[unit.request.provider]
        return provider.settings.cost_usd(unit.request.model, response.input_tokens, response.output_tokens)

    async def _call_validated(self, unit: UnitSpec) -> ProviderResponse:
        provider = self.providers.get(unit.request.provider)
        if provider is None:
            raise PunchlineError(f"no provider named {unit.request.provider!r} in this run")
        check = validator(unit.check)
        for attempt in range(self.max_invalid + 1):
            response = await self.call(provider, unit.request)
            try:
                check(response)
                return response
            except RetryableProviderError as exc:
                if attempt == self.max_invalid:
                    raise
                log.info("invalid_answer_retry", unit=unit.unit_id, error=str(exc), attempt=attempt + 1)
        raise AssertionError("unreachable")

    async def _heartbeat(self, grant: Grant, stop: asyncio.Event) -> None:
        period_s = self.lease_ms / 3000
        while not stop.is_set():
            await asyncio.sleep(period_s)
            try:
                ok = await asyncio.to_thread(self.ledger.renew, grant, self.lease_ms)
            except LedgerUnavailable:
                continue
            if not ok:
                log.warning("lease_lost", key=grant.key)
                return
