"""Bounded retries of one provider request: exponential backoff with full jitter, honouring Retry-After.

The SDKs' own retries are off, so this is the only retry loop: it sees every attempt, asks the
cluster-wide rate limiter before each one, and tells the limiter about every 429 so that all workers
slow down together. Fatal errors (bad request, auth, unknown model) are raised at once; retryable ones
are retried at most ``max_retries`` times (malformed bodies at most ``max_malformed_retries`` times),
after which the last error is raised.

Which errors are retried is the provider kind's to say (:attr:`ProviderKind.retryable
<punchline.workers.provider.ProviderKind>`, a predicate over the error); by default
:func:`retried_by_default`, the error's own class (a 429, 408, 409, 425, 5xx, timeout, dropped connection or
malformed body is a :class:`~punchline.data.errors.RetryableProviderError`). An error the kind's rule judges
otherwise than its class is raised as the class of the verdict, so the unit's record says it too (whether a
resume calls it again).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Protocol

import msgspec

from punchline.data.backoff import Backoff
from punchline.data.errors import FatalProviderError, ProviderError, RetryableProviderError
from punchline.data.provider_settings import ProviderSettings
from punchline.data.requests import ProviderRequest, ProviderResponse
from punchline.schedulers.rate_limit import estimate_tokens
from punchline.workers.provider import Provider
from punchline.workers.providers import MalformedResponse, kind_of, wire_calls

RetryRule = Callable[[ProviderError], bool]  # is this error worth another attempt?


def retried_by_default(error: ProviderError) -> bool:
    """The rule of a kind that states none: the error's class says (a provider maps a 429, 408, 409, 425, 5xx,
    a timeout, a dropped connection or a malformed body to :class:`RetryableProviderError`, any other 4xx to
    :class:`FatalProviderError`). A kind's own rule may call it for the cases it does not decide."""
    return error.retryable


def retry_rule(provider: Provider) -> RetryRule:
    """Which errors of ``provider`` are retried: its kind's rule, else :func:`retried_by_default`."""
    return kind_of(provider.settings.kind).retryable or retried_by_default


def judged(error: ProviderError, retried: bool) -> ProviderError:
    """``error`` as the class of the verdict ``retried`` (itself when its class already says so), naming it as its
    cause: what the unit runner records (a failed unit is retryable or not by its error's class)."""
    if error.retryable == retried:
        return error
    as_judged = RetryableProviderError if retried else FatalProviderError
    again = as_judged(str(error), status=error.status, retry_after_s=error.retry_after_s, quoted_rpm=error.quoted_rpm)
    again.__cause__ = error
    return again


class RetryPolicy(msgspec.Struct, frozen=True, kw_only=True):
    max_retries: int = 6
    base_delay_s: float = 0.5
    max_delay_s: float = 30.0
    jitter: bool = True  # full jitter: sleep uniform(0, capped exponential)
    max_malformed_retries: int = 2
    max_retry_after_s: float = 120.0  # a longer Retry-After is clipped to this

    @classmethod
    def from_settings(cls, settings: ProviderSettings, **overrides: float | int | bool) -> RetryPolicy:
        base = cls(max_retries=settings.max_retries, max_malformed_retries=settings.max_malformed_retries)
        return msgspec.structs.replace(base, **overrides) if overrides else base

    def backoff_s(self, retry: int, retry_after_s: float | None = None, rng: random.Random | None = None) -> float:
        """Delay before retry number ``retry`` (0-based); never shorter than the server's Retry-After."""
        delay = Backoff(initial_s=self.base_delay_s, max_s=self.max_delay_s, jitter=self.jitter).delay_s(retry, rng)
        if retry_after_s is not None:
            delay = max(delay, min(retry_after_s, self.max_retry_after_s))
        return delay


class AttemptEvent(msgspec.Struct, kw_only=True):
    """One finished attempt: ``error`` is None on success; ``delay_s`` is the sleep before the next."""

    attempt: int
    provider: str
    model: str
    error: str | None = None
    status: int | None = None
    retryable: bool = False
    delay_s: float = 0.0


class RateLimiter(Protocol):
    async def acquire(self, provider: str, model: str, tokens: int, requests: int = 1) -> None: ...

    async def on_throttled(
        self, provider: str, model: str, retry_after_s: float | None = None, quoted_rpm: float | None = None
    ) -> None: ...


async def call_with_retries(
    provider: Provider,
    request: ProviderRequest,
    policy: RetryPolicy,
    *,
    rate_limiter: RateLimiter | None = None,
    on_attempt: Callable[[AttemptEvent], None] | None = None,
    rng: random.Random | None = None,
    slot_reserved: bool = False,
    pause: Callable[[float], Awaitable[None]] | None = None,
    stopping: Callable[[], bool] | None = None,
) -> ProviderResponse:
    """``slot_reserved``: the first attempt's rate-limit slot was reserved with the request's lease.
    ``pause``: how to wait between attempts (the unit runner gives its call slot to another unit meanwhile).
    ``stopping``: once it says so (the worker's driver is gone), a failed attempt is not retried, nor is one
    whose backoff the driver's end came during: a draining worker finishes the attempt in flight and no more, so
    it ends within one attempt's timeout (the unit runner then records nothing: the next driver asks again)."""
    calls = wire_calls(provider.settings, request)
    tokens = estimate_tokens(request)
    retryable = retry_rule(provider)
    malformed = 0
    retry = 0
    while True:
        if rate_limiter is not None and not (slot_reserved and retry == 0 and malformed == 0):
            await rate_limiter.acquire(provider.name, request.model, tokens, calls)
        try:
            response = await provider.complete(request)
        except (FatalProviderError, RetryableProviderError) as raised:
            exc = judged(raised, retryable(raised))
            if not exc.retryable:
                _report(on_attempt, retry, provider, request, exc, 0.0)
                raise exc from exc.__cause__
            if exc.status == 429 and rate_limiter is not None:
                await rate_limiter.on_throttled(provider.name, request.model, exc.retry_after_s, exc.quoted_rpm)
            if isinstance(exc, MalformedResponse):
                malformed += 1
            exhausted = retry >= policy.max_retries or malformed > policy.max_malformed_retries
            exhausted = exhausted or (stopping is not None and stopping())
            delay = 0.0 if exhausted else policy.backoff_s(retry, exc.retry_after_s, rng)
            _report(on_attempt, retry, provider, request, exc, delay)
            if exhausted:
                raise exc from exc.__cause__
            await (pause or asyncio.sleep)(delay)
            if stopping is not None and stopping():  # the driver ended during the backoff: no new attempt
                raise exc from exc.__cause__
            retry += 1
            continue
        _report(on_attempt, retry, provider, request, None, 0.0)
        return response


def _report(
    on_attempt: Callable[[AttemptEvent], None] | None,
    attempt: int,
    provider: Provider,
    request: ProviderRequest,
    exc: ProviderError | None,
    delay_s: float,
) -> None:
    if on_attempt is None:
        return
    on_attempt(
        AttemptEvent(
            attempt=attempt,
            provider=provider.name,
            model=request.model,
            error=None if exc is None else str(exc),
            status=None if exc is None else exc.status,
            retryable=bool(exc is not None and exc.retryable),
            delay_s=delay_s,
        )
    )
