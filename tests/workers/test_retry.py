"""call_with_retries over HTTP against the fake provider: exact call counts for every failure kind."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest

from punchline.data.errors import FatalProviderError, ProviderError, RetryableProviderError
from punchline.data.provider_settings import ProviderSettings
from punchline.data.requests import ProviderResponse
from punchline.pipelines.puns.data.completions import greedy_request
from punchline.workers.calls.retry import AttemptEvent, RetryPolicy, call_with_retries
from punchline.workers.fake.server import FakeProviderServer
from punchline.workers.providers import MalformedResponse, make_provider
from tests.fixtures.kinds import install_kind

MODEL = "meta-llama/Meta-Llama-3.1-70B-Instruct-Turbo"
FAST = RetryPolicy(max_retries=3, base_delay_s=0.01, max_delay_s=0.05, max_malformed_retries=2)


def _run(
    fake: FakeProviderServer, policy: RetryPolicy = FAST, kind: str = "openai", timeout_s: float = 5.0
) -> tuple[ProviderResponse | ProviderError, list[AttemptEvent], float]:
    events: list[AttemptEvent] = []

    async def go() -> ProviderResponse | ProviderError:
        provider = make_provider("fake", fake.provider_settings(kind, timeout_s=timeout_s))  # type: ignore[arg-type]
        try:
            return await call_with_retries(
                provider,
                greedy_request("fake", MODEL, "The dentist liked his job because it was"),
                policy,
                on_attempt=events.append,
            )
        except ProviderError as exc:
            return exc
        finally:
            await provider.aclose()

    started = time.monotonic()
    out = asyncio.run(go())
    return out, events, time.monotonic() - started


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_fail_first_attempts_then_success(fake: FakeProviderServer, kind: str) -> None:
    fake.configure(fail_first_attempts=2, fail_status=503)
    out, events, _ = _run(fake, kind=kind)
    assert isinstance(out, ProviderResponse) and out.texts
    assert fake.stats().total_calls == 3 and fake.stats().faults["fail_first"] == 2
    assert [e.error is None for e in events] == [False, False, True]
    assert [e.status for e in events[:2]] == [503, 503]


def test_429_honours_retry_after(fake: FakeProviderServer) -> None:
    fake.configure(fail_first_attempts=1, fail_status=429, fail_retry_after_s=0.4)
    out, events, elapsed = _run(fake)
    assert isinstance(out, ProviderResponse)
    assert fake.stats().total_calls == 2
    assert events[0].delay_s >= 0.4 and elapsed >= 0.4


@pytest.mark.parametrize(
    ("knobs", "status"),
    [({"error_500_rate": 1.0}, 500), ({"error_503_rate": 1.0}, 503), ({"truncated_body_rate": 1.0}, None)],
)
def test_exhausted_retries_raise_last_error(fake: FakeProviderServer, knobs: dict, status: int | None) -> None:
    fake.configure(**knobs)
    out, events, _ = _run(fake)
    assert isinstance(out, RetryableProviderError) and out.status == status
    assert fake.stats().total_calls == FAST.max_retries + 1
    assert len(events) == 4 and events[-1].delay_s == 0.0


def test_hang_past_timeout_is_retried_and_bounded(fake: FakeProviderServer) -> None:
    fake.configure(hang_rate=1.0, hang_s=10.0)
    policy = RetryPolicy(max_retries=1, base_delay_s=0.01, max_delay_s=0.01)
    out, events, elapsed = _run(fake, policy, timeout_s=0.25)
    assert isinstance(out, RetryableProviderError) and "timed out" in str(out)
    assert len(events) == 2  # an event per attempt: the first and its one retry
    assert elapsed < 10.0  # two attempts cut at 0.25 s each, not one 10 s hang
    # the second attempt reaches the server's handler when a busy machine gets to it (the client may have given up
    # on it before): wait for the server to have seen both, with a guard against a hang, not a timing
    deadline = time.monotonic() + 30.0
    while fake.stats().faults.get("hang", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fake.stats().faults["hang"] == 2


def test_malformed_bodies_have_their_own_bound(fake: FakeProviderServer) -> None:
    fake.configure(malformed_rate=1.0)
    policy = RetryPolicy(max_retries=6, base_delay_s=0.01, max_delay_s=0.01, max_malformed_retries=2)
    out, _, _ = _run(fake, policy)
    assert isinstance(out, MalformedResponse)
    assert fake.stats().total_calls == 3


@pytest.mark.parametrize("status", [401, 404])
def test_fatal_errors_raise_at_once(fake: FakeProviderServer, status: int) -> None:
    fake.configure(status_for_model={MODEL: status})
    out, events, _ = _run(fake)
    assert isinstance(out, FatalProviderError) and out.status == status
    assert fake.stats().total_calls == 1 and len(events) == 1


def test_split_requests_retry_until_every_call_succeeds(fake: FakeProviderServer) -> None:
    """supports_n=false: each of the n calls fails its first attempt, and a retry repeats the calls
    that succeeded before (1 + 2 + 3 + 3 calls over 4 attempts)."""
    fake.configure(fail_first_attempts=1)
    req = greedy_request("fake", MODEL, "Split me into")
    req = req.__class__(**{**{f: getattr(req, f) for f in req.__struct_fields__}, "n": 3, "temperature": 0.8})

    async def go() -> ProviderResponse:
        provider = make_provider("fake", fake.provider_settings("openai", supports_n=False, timeout_s=5))
        try:
            return await call_with_retries(provider, req, FAST)
        finally:
            await provider.aclose()

    out = asyncio.run(go())
    assert len(out.texts) == 3
    assert fake.stats().total_calls == 9 and fake.stats().ok == 6


def test_backoff_is_bounded_and_jittered() -> None:
    policy = RetryPolicy(base_delay_s=1.0, max_delay_s=8.0, max_retry_after_s=20.0)
    rng = random.Random(1)
    delays = [policy.backoff_s(r, rng=rng) for r in range(10)]
    assert all(0 <= d <= 8.0 for d in delays) and len(set(delays)) == 10
    assert policy.backoff_s(0, retry_after_s=50.0, rng=rng) == 20.0
    fixed = RetryPolicy(base_delay_s=1.0, max_delay_s=8.0, jitter=False)
    assert [fixed.backoff_s(r) for r in range(5)] == [1.0, 2.0, 4.0, 8.0, 8.0]
    assert RetryPolicy.from_settings(ProviderSettings(max_retries=9)).max_retries == 9


def test_a_driver_gone_during_a_backoff_starts_no_new_attempt(fake: FakeProviderServer) -> None:
    """Issue 39: ``stopping`` turns true while a failed attempt waits out its backoff (the driver was killed
    meanwhile): the loop raises that attempt's error instead of calling again, so a draining worker's calls
    end with the attempts that were in flight at its driver's end."""
    fake.configure(fail_first_attempts=5, fail_status=500)
    gone = False

    async def pause(delay_s: float) -> None:
        nonlocal gone
        gone = True  # the driver dies while this unit waits to retry

    async def go() -> ProviderResponse | ProviderError:
        provider = make_provider("fake", fake.provider_settings("openai", timeout_s=5.0))
        try:
            return await call_with_retries(
                provider, greedy_request("fake", MODEL, "A backoff ___"), FAST, pause=pause, stopping=lambda: gone
            )
        except ProviderError as exc:
            return exc
        finally:
            await provider.aclose()

    out = asyncio.run(go())
    assert isinstance(out, RetryableProviderError) and out.status == 500
    assert fake.stats().total_calls == 1  # the backoff's end brought no second attempt


PICKY_KIND = """
from punchline.plugin import ProviderKind, retried_by_default


def retryable(error):
    \"\"\"This API's 400 saying "injected failure" passes on a second try; its 503 never does.\"\"\"
    if error.status == 400 and "injected failure" in str(error):
        return True
    if error.status == 503:
        return False
    return retried_by_default(error)


# the OpenAI wire and client; only which errors are retried differs
KIND = ProviderKind("picky", "punchline.workers.providers.openai_http:OpenAIProvider", retryable=retryable)
"""


@pytest.mark.parametrize(
    ("kind", "status", "calls", "outcome"),
    [
        ("openai", 400, 1, FatalProviderError),  # today's rule: a 400 is permanent...
        ("picky", 400, 2, ProviderResponse),  # ...this kind's says this one is worth another try
        ("openai", 503, 2, ProviderResponse),  # today's rule: a 503 is retried...
        ("picky", 503, 1, FatalProviderError),  # ...this kind's says it never passes
    ],
)
def test_a_kind_says_which_errors_are_retried(
    fake: FakeProviderServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
    status: int,
    calls: int,
    outcome: type,
) -> None:
    install_kind(tmp_path, monkeypatch, "picky", "picky_kind", PICKY_KIND)
    fake.configure(fail_first_attempts=1, fail_status=status)
    settings = ProviderSettings(kind=kind, base_url=fake.openai_base_url, timeout_s=5)
    events: list[AttemptEvent] = []

    async def go() -> ProviderResponse | ProviderError:
        provider = make_provider("fake", settings)
        try:
            return await call_with_retries(
                provider, greedy_request("fake", MODEL, "Retried or not:"), FAST, on_attempt=events.append
            )
        except ProviderError as exc:
            return exc
        finally:
            await provider.aclose()

    out = asyncio.run(go())
    assert isinstance(out, outcome) and fake.stats().total_calls == calls
    assert events[0].status == status and events[0].retryable == (outcome is ProviderResponse)
    if isinstance(out, FatalProviderError):  # the verdict is the error's class: the unit's record says it
        assert out.status == status and "injected failure" in str(out) and not out.retryable
