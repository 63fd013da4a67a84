"""Waiting out a failure: one backoff rule (exponential, capped, optional full jitter) and one retry
loop with a deadline and an attempt limit, in a sync and an async form.

Every component that waits for a service to come back (the ledger, preflight's service checks, the S3
store, a unit's or shard's commit, a provider request's retries) uses these, so that "how long and how
often do we try again" is decided in one place and reads the same everywhere. The loop raises the last
error when it gives up; callers that turn that into their own error or a False do so around the call.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import msgspec

T = TypeVar("T")

#: called before each wait with the error, the number of failed attempts so far (1-based) and the delay
OnRetry = Callable[[BaseException, int, float], None]


class Backoff(msgspec.Struct, frozen=True, kw_only=True):
    """Delay before retry ``n`` (0-based): ``initial_s * factor**n`` capped at ``max_s``; with ``jitter``,
    uniform in [0, that] (full jitter, so that many waiters do not retry in lockstep)."""

    initial_s: float
    max_s: float
    factor: float = 2.0
    jitter: bool = False

    def delay_s(self, retry: int, rng: random.Random | None = None) -> float:
        cap = min(self.max_s, self.initial_s * self.factor**retry)
        return (rng or random).uniform(0.0, cap) if self.jitter else cap


#: a fixed pause between attempts
def constant(delay_s: float) -> Backoff:
    return Backoff(initial_s=delay_s, max_s=delay_s, factor=1.0)


class _Attempts:
    """The bookkeeping the two loops share: whether to try again, and how long to wait first."""

    def __init__(
        self,
        backoff: Backoff,
        deadline_s: float | None,
        attempts: int | None,
        when: Callable[[BaseException], bool] | None,
        on_retry: OnRetry | None,
        rng: random.Random | None,
    ) -> None:
        self.backoff = backoff
        self.when = when
        self.deadline = None if deadline_s is None else time.monotonic() + deadline_s
        self.attempts = attempts
        self.on_retry = on_retry
        self.rng = rng
        self.failed = 0

    def next_delay_s(self, exc: BaseException) -> float | None:
        """The wait before the next attempt (cut short at the deadline, so the last attempt is made at
        it), or None to give up: ``when`` refuses the error, the deadline has passed or the attempts are spent."""
        if self.when is not None and not self.when(exc):
            return None
        self.failed += 1
        if self.attempts is not None and self.failed >= self.attempts:
            return None
        delay = self.backoff.delay_s(self.failed - 1, self.rng)
        if self.deadline is not None:
            left_s = self.deadline - time.monotonic()
            if left_s <= 0:
                return None
            delay = min(delay, left_s)
        if self.on_retry is not None:
            self.on_retry(exc, self.failed, delay)
        return delay


def retry_sync(
    op: Callable[[], T],
    *,
    retry_on: tuple[type[BaseException], ...],
    backoff: Backoff,
    deadline_s: float | None = None,
    attempts: int | None = None,
    when: Callable[[BaseException], bool] | None = None,
    on_retry: OnRetry | None = None,
    rng: random.Random | None = None,
) -> T:
    """``op()``, tried again after ``retry_on`` errors (those ``when`` accepts, if given) until it
    succeeds, ``attempts`` calls were made, or ``deadline_s`` has passed; then the last error is raised."""
    state = _Attempts(backoff, deadline_s, attempts, when, on_retry, rng)
    while True:
        try:
            return op()
        except retry_on as exc:
            delay = state.next_delay_s(exc)
            if delay is None:
                raise
            time.sleep(delay)


async def retry_async(
    op: Callable[[], Awaitable[T]],
    *,
    retry_on: tuple[type[BaseException], ...],
    backoff: Backoff,
    deadline_s: float | None = None,
    attempts: int | None = None,
    when: Callable[[BaseException], bool] | None = None,
    on_retry: OnRetry | None = None,
    rng: random.Random | None = None,
) -> T:
    """:func:`retry_sync` for coroutines (``op`` makes a fresh awaitable per attempt)."""
    state = _Attempts(backoff, deadline_s, attempts, when, on_retry, rng)
    while True:
        try:
            return await op()
        except retry_on as exc:
            delay = state.next_delay_s(exc)
            if delay is None:
                raise
            await asyncio.sleep(delay)
