"""The cluster-wide GCRA limiter in a real Redis: spacing, tokens, AIMD, fail-closed, and over HTTP."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from punchline.data.errors import LedgerUnavailable, RetryableProviderError
from punchline.pipelines.puns.data.completions import greedy_request
from punchline.schedulers.rate_limit import Limits, RateLimitSettings, RedisRateLimiter
from punchline.schedulers.server.redis_client import connect
from punchline.services.redis_server import free_port
from punchline.workers.calls.retry import RetryPolicy, call_with_retries
from punchline.workers.fake.server import FakeProviderServer
from punchline.workers.providers import make_provider


def _url(client: redis.Redis) -> str:
    kw = client.connection_pool.connection_kwargs
    auth = f":{kw['password']}@" if kw.get("password") else ""  # the embedded server asks for its password
    return f"redis://{auth}{kw['host']}:{kw['port']}/{kw.get('db', 0)}"


def _timed(reserve: Callable[[], float]) -> tuple[float, float]:
    """Bounds ``(earliest, latest)`` on the local-clock instant of a granted slot: the wait is counted from
    the moment Redis ran the script, which lies somewhere inside the call."""
    before = time.monotonic()
    wait = reserve()
    return before + wait, time.monotonic() + wait


def test_reservations_are_evenly_spaced_across_limiters(redis_client: redis.Redis) -> None:
    limits = {"p": Limits(requests_per_minute=600)}  # one slot per 100 ms (without the 1 % headroom)
    exact = RateLimitSettings(headroom=1.0)
    limiters = [RedisRateLimiter(connect(_url(redis_client)), limits, exact) for _ in range(3)]

    def grab(lim: RedisRateLimiter) -> list[tuple[float, float]]:
        return [_timed(lambda: lim.reserve("p", "m")) for _ in range(10)]

    with ThreadPoolExecutor(3) as pool:
        per_limiter = list(pool.map(grab, limiters))
    slots = [s for batch in per_limiter for s in batch]
    assert len(slots) == 30
    # 30 slots 100 ms apart span 2.9 s, whatever the scheduling delays around each call
    assert max(hi for _, hi in slots) - min(lo for lo, _ in slots) >= 2.9 - 1e-3
    assert max(lo for lo, _ in slots) - min(hi for _, hi in slots) <= 2.9 + 1e-3
    # each limiter's consecutive slots are at least one interval apart
    for batch in per_limiter:
        for (lo_a, _), (_, hi_b) in itertools.pairwise(batch):
            assert hi_b - lo_a >= 0.1 - 1e-3
    # the limit is the provider's: another model of it waits for the same cell
    assert limiters[0].reserve("p", "other") > 0.0
    # a provider without limits is never delayed
    assert limiters[0].reserve("unlimited", "m") == 0.0


def test_token_limit(redis_client: redis.Redis) -> None:
    lim = RedisRateLimiter(  # 100 tokens/s, burst 100
        redis_client, {"p": Limits(tokens_per_minute=6000)}, RateLimitSettings(headroom=1.0)
    )
    started = time.monotonic()
    waits = []
    for _ in range(4):
        waits.append(lim.reserve("p", "m", tokens=50))
        elapsed = time.monotonic() - started
    assert waits[0] == 0.0 and waits[1] == 0.0
    # the waits are 0.5 s and 1 s counted from the first call, less the time that has passed since
    assert 0.5 - elapsed - 1e-3 <= waits[2] <= 0.5 + 1e-3
    assert 1.0 - elapsed - 1e-3 <= waits[3] <= 1.0 + 1e-3
    assert waits[3] - waits[2] >= 0.5 - elapsed - 1e-3


def test_throttle_lowers_rate_once_per_cooldown_then_recovers(redis_client: redis.Redis) -> None:
    settings = RateLimitSettings(
        recover_window_s=0.2, increase_step=0.25, throttle_cooldown_s=0.5, decrease_factor=0.5, headroom=1.0
    )
    a = RedisRateLimiter(redis_client, {"p": Limits(requests_per_minute=600)}, settings)
    b = RedisRateLimiter(connect(_url(redis_client)), {"p": Limits(requests_per_minute=600)}, settings)
    assert a.throttled("p", "m") == 0.5
    assert b.throttled("p", "m") == 0.5  # the same burst of 429s seen by another worker
    assert b.factor("p", "m") == 0.5
    # at half rate, slots are 200 ms apart
    first = _timed(lambda: a.reserve("p", "m"))
    second = _timed(lambda: a.reserve("p", "m"))
    assert second[1] - first[0] >= 0.2 - 1e-3 and second[0] - first[1] <= 0.2 + 1e-3
    time.sleep(0.45)
    a.reserve("p", "m")  # recovery is applied by the next reservation: two windows -> +0.5
    assert a.factor("p", "m") == 1.0


def test_acquire_waits_and_survives_script_flush(redis_client: redis.Redis) -> None:
    lim = RedisRateLimiter(redis_client, {"p": Limits(requests_per_minute=1200)})  # 50 ms apart

    async def go() -> float:
        started = time.monotonic()
        for _ in range(5):
            await lim.acquire("p", "m", tokens=10)
        return time.monotonic() - started

    redis_client.script_flush()
    assert asyncio.run(go()) >= 0.19


def test_unreachable_redis_fails_closed() -> None:
    client = redis.Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    lim = RedisRateLimiter(client, {"p": Limits(requests_per_minute=60)})
    with pytest.raises(LedgerUnavailable):
        asyncio.run(lim.acquire("p", "m"))
    with pytest.raises(LedgerUnavailable):
        lim.throttled("p", "m")


def test_settings_from_env() -> None:
    s = RateLimitSettings.from_env({"PUNCHLINE_RATE_RECOVER_WINDOW_S": "2.5", "PUNCHLINE_RATE_NAMESPACE": "x"})
    assert s.recover_window_s == 2.5 and s.namespace == "x" and s.decrease_factor == 0.9


def test_workers_sharing_the_limiter_get_no_429(redis_client: redis.Redis, fake: FakeProviderServer) -> None:
    """Four workers, each with its own client, against a fake provider limited to 600/min."""
    fake.configure(requests_per_minute=600)  # GCRA with one second of burst, like real providers
    settings = fake.provider_settings("openai", timeout_s=5, requests_per_minute=600)
    policy = RetryPolicy(max_retries=0)

    async def worker(i: int) -> int:
        provider = make_provider("fake", settings)
        lim = RedisRateLimiter(connect(_url(redis_client)), {"fake": settings})
        errors = 0
        try:
            for j in range(5):
                try:
                    await call_with_retries(
                        provider, greedy_request("fake", "m-8b", f"Worker {i} asks {j}"), policy, rate_limiter=lim
                    )
                except RetryableProviderError:
                    errors += 1
        finally:
            await provider.aclose()
        return errors

    async def main() -> list[int]:
        return await asyncio.gather(*(worker(i) for i in range(4)))

    started = time.monotonic()
    errors = asyncio.run(main())
    elapsed = time.monotonic() - started
    stats = fake.stats()
    assert sum(errors) == 0 and stats.faults["rate_limited"] == 0
    assert stats.ok == 20
    assert elapsed >= 1.8  # 20 requests at 10/s


def test_a_429_pauses_every_worker_once_and_a_quoted_limit_caps_the_rate(redis_client: redis.Redis) -> None:
    """The provider's answer is believed: Retry-After holds every worker's next slot back that long, and a
    limit it quotes below the configured one becomes the rate at once (no halving, no recovery above it)."""
    settings = RateLimitSettings(headroom=1.0, recover_window_s=0.05, increase_step=0.5)
    a = RedisRateLimiter(redis_client, {"p": Limits(requests_per_minute=600)}, settings)
    b = RedisRateLimiter(connect(_url(redis_client)), {"p": Limits(requests_per_minute=600)}, settings)
    assert a.throttled("p", "m", retry_after_s=0.5, quoted_rpm=300) == 0.5
    wait = b.reserve("p", "m")  # another worker's next slot waits out the Retry-After
    assert 0.4 <= wait <= 0.5 + 1e-3
    time.sleep(0.2)
    b.reserve("p", "m")  # many recovery windows have passed: the factor stays at the quoted cap
    assert b.factor("p", "m") == 0.5
    # a 429 without a quoted limit lowers the rate by decrease_factor (0.9), not by half
    c = RedisRateLimiter(redis_client, {"q": Limits(requests_per_minute=600)})
    assert c.throttled("q", "m") == 0.9


def test_workers_stay_under_a_provider_that_counts_a_window(
    redis_client: redis.Redis, fake: FakeProviderServer
) -> None:
    """A provider that admits at most 30 calls in any sliding 3 s window (600/min): paced under its limit
    from the first call, four workers do not push a window over. A window's margin is (1 - headroom) x its
    length and must exceed how late a call can arrive after its slot: 0.6 s for the default 1 % of a 60 s
    window; this short window gets 10 % (300 ms), and a call that a loaded machine delays past even that is
    retried after the provider's Retry-After, which pauses every worker once."""
    fake.configure(requests_per_minute=600, rate_limit_window_s=3.0, latency_ms_min=1, latency_ms_max=30)
    settings = fake.provider_settings("openai", timeout_s=5, requests_per_minute=600)
    policy = RetryPolicy(max_retries=3)

    async def worker(i: int) -> None:
        provider = make_provider("fake", settings)
        lim = RedisRateLimiter(connect(_url(redis_client)), {"fake": settings}, RateLimitSettings(headroom=0.9))
        try:
            for j in range(15):
                await call_with_retries(
                    provider, greedy_request("fake", "m-8b", f"Worker {i} asks {j}"), policy, rate_limiter=lim
                )
        finally:
            await provider.aclose()

    async def main() -> None:
        await asyncio.gather(*(worker(i) for i in range(4)))

    asyncio.run(main())
    stats = fake.stats()
    assert stats.ok == 60
    assert stats.faults["rate_limited"] <= 2, stats.faults
