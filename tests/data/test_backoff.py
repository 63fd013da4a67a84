"""The one backoff rule and retry loop (data/backoff.py) every waiting component uses."""

from __future__ import annotations

import asyncio
import random

import pytest

from punchline.data.backoff import Backoff, constant, retry_async, retry_sync
from punchline.data.errors import LedgerUnavailable


def test_delays_double_up_to_the_cap_and_jitter_stays_below_it() -> None:
    b = Backoff(initial_s=0.5, max_s=3.0)
    assert [b.delay_s(n) for n in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert [constant(1.5).delay_s(n) for n in range(3)] == [1.5, 1.5, 1.5]
    jittered = Backoff(initial_s=0.5, max_s=3.0, jitter=True)
    rng = random.Random(1)
    draws = [jittered.delay_s(n, rng) for n in range(40)]
    assert all(0.0 <= d <= min(3.0, 0.5 * 2**n) for n, d in enumerate(draws))
    assert len(set(draws)) == len(draws)  # spread, not lockstep


class Flaky:
    """Fails ``failures`` times with ``error``, then answers 'ok'."""

    def __init__(self, failures: int, error: BaseException) -> None:
        self.failures, self.error, self.calls = failures, error, 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "ok"


def test_sync_retries_until_success_and_reports_each_wait() -> None:
    op, seen = Flaky(3, LedgerUnavailable("down")), []
    got = retry_sync(
        op,
        retry_on=(LedgerUnavailable,),
        backoff=Backoff(initial_s=0.001, max_s=0.004),
        on_retry=lambda exc, n, d: seen.append((str(exc), n, d)),
    )
    assert got == "ok" and op.calls == 4
    assert seen == [("down", 1, 0.001), ("down", 2, 0.002), ("down", 3, 0.004)]


def test_attempts_and_deadline_end_with_the_last_error() -> None:
    op = Flaky(100, LedgerUnavailable("down"))
    with pytest.raises(LedgerUnavailable):
        retry_sync(op, retry_on=(LedgerUnavailable,), backoff=constant(0.0), attempts=5)
    assert op.calls == 5
    op = Flaky(10_000, LedgerUnavailable("down"))
    with pytest.raises(LedgerUnavailable):
        retry_sync(op, retry_on=(LedgerUnavailable,), backoff=constant(0.01), deadline_s=0.05)
    assert 2 <= op.calls < 10_000  # tried again, then gave up at the deadline


def test_errors_not_retried_are_raised_at_once() -> None:
    op = Flaky(1, ValueError("bad"))
    with pytest.raises(ValueError):
        retry_sync(op, retry_on=(LedgerUnavailable,), backoff=constant(0.0))
    op = Flaky(1, LedgerUnavailable("permanent"))
    with pytest.raises(LedgerUnavailable):
        retry_sync(op, retry_on=(LedgerUnavailable,), backoff=constant(0.0), when=lambda e: "permanent" not in str(e))
    assert op.calls == 1


def test_async_form_behaves_the_same() -> None:
    op = Flaky(2, LedgerUnavailable("down"))

    async def attempt() -> str:
        return op()

    got = asyncio.run(retry_async(attempt, retry_on=(LedgerUnavailable,), backoff=constant(0.001)))
    assert got == "ok" and op.calls == 3
    op = Flaky(100, LedgerUnavailable("down"))
    with pytest.raises(LedgerUnavailable):
        asyncio.run(retry_async(attempt, retry_on=(LedgerUnavailable,), backoff=constant(0.0), attempts=4))
    assert op.calls == 4
