"""Leases as workers take them, against a real redis-server: exclusivity, fencing, O(log N) claims,
one-round-trip heartbeats, and the rate-limit slot and cost reservation taken with a request's lease."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
import redis
import redis.asyncio

from punchline.data.errors import LedgerUnavailable
from punchline.data.storage.response_cache import MARKER_MS
from punchline.schedulers.budget import Budget
from punchline.schedulers.keys import request as request_key
from punchline.schedulers.leases import (
    Answered,
    BudgetTerms,
    Claim,
    Grant,
    Held,
    Leases,
    NoClaim,
    OverBudget,
    Settle,
)
from punchline.schedulers.ledger import Ledger, StageKeys
from punchline.schedulers.rate_limit import Limits, RateLimitSettings, RateScope
from tests.fixtures.redis import client_url

T = TypeVar("T")


def run(make: Callable[[Leases], Awaitable[T]], client: redis.Redis, **budget: Any) -> T:
    async def go() -> T:
        aclient = redis.asyncio.Redis.from_url(client_url(client))
        try:
            return await make(Leases(aclient, budget=BudgetTerms(run_id="r", holder="h1", **budget)))
        finally:
            await aclient.aclose()

    return asyncio.run(go())


def test_request_lease_is_exclusive_and_leaves_nothing_behind(redis_client: redis.Redis) -> None:
    async def go(leases: Leases) -> None:
        g = await leases.acquire("k1", "w1", 5_000)
        assert isinstance(g, Grant) and g.wait_s == 0
        other = await leases.acquire("k1", "w2", 5_000)
        assert isinstance(other, Held) and 0 < other.wait_ms <= 5_000
        assert await leases.commit(g)
        # the store has the answer now: Redis keeps nothing of the request
        assert [k for k in redis_client.keys("pl:req:*")] == []
        again = await leases.acquire("k1", "w2", 5_000)
        assert isinstance(again, Grant) and again.token > g.token  # tokens are never reused

    run(go, redis_client)


def test_expired_lease_is_taken_over_and_the_zombie_cannot_release_it(redis_client: redis.Redis) -> None:
    async def go(leases: Leases) -> None:
        zombie = await leases.acquire("k2", "w1", 300)
        assert isinstance(zombie, Grant)
        await asyncio.sleep(0.4)
        fresh = await leases.acquire("k2", "w2", 5_000)
        assert isinstance(fresh, Grant) and fresh.token > zombie.token
        lost, _ = await leases.renew(5_000, requests=[zombie, fresh])
        assert lost == [zombie]
        assert not await leases.commit(zombie)  # the zombie's commit does not touch the successor's lease
        await leases.release(zombie)
        assert isinstance(await leases.acquire("k2", "w3", 5_000), Held)
        assert await leases.commit(fresh)

    run(go, redis_client)


def test_shard_claims_come_in_order_and_dead_workers_shards_come_back(redis_client: redis.Redis) -> None:
    Ledger(redis_client).init_stage("r", "s", pending=[2, 0, 1], shards_total=3, units_total=9, shards_done=0)
    keys = StageKeys("pl", "r", "s")

    async def go(leases: Leases) -> None:
        assert await leases.claim(StageKeys("pl", "r", "unknown"), "w1", 5_000) is NoClaim.STAGE_UNKNOWN
        c0 = await leases.claim(keys, "w1", 300)
        c1 = await leases.claim(keys, "w2", 5_000)
        c2 = await leases.claim(keys, "w3", 5_000)
        assert isinstance(c0, Claim) and isinstance(c1, Claim) and isinstance(c2, Claim)
        assert [c0.shard, c1.shard, c2.shard] == [0, 1, 2]
        wait = await leases.claim(keys, "w4", 5_000)
        assert isinstance(wait, int) and 0 < wait <= 300
        counts = {"units_done": 3, "cost_usd": 0.25, "provider_requests": 3}
        assert await leases.commit_shard(keys, c1, counters=counts, usage={"s\x1fm\x1fusd": 0.25, "s\x1fm\x1fin": 7})
        assert await leases.commit_shard(keys, c2, counters=counts, usage={})
        await asyncio.sleep(0.4)  # w1 died holding shard 0
        _, lost = await leases.renew(300, shards={keys: [c0]})
        assert lost == []  # lapsed, but nobody took it yet: a slow worker may still renew and commit
        await asyncio.sleep(0.4)  # and now it is dead for good
        again = await leases.claim(keys, "w4", 5_000)
        assert isinstance(again, Claim) and again.shard == 0 and again.token > c0.token
        assert not await leases.commit_shard(keys, c0, counters={"units_done": 3}, usage={})  # the zombie
        assert await leases.commit_shard(keys, again, counters={"units_done": 3}, usage={})
        assert await leases.claim(keys, "w4", 5_000) is NoClaim.DRAINED

    run(go, redis_client)
    c = Ledger(redis_client).counters("r", "s")
    # the zombie's calls were made, so its counters count; the shard is done once
    assert (c.shards_done, c.units_done, c.provider_requests) == (3, 12, 6)
    assert c.cost_usd == pytest.approx(0.5)
    assert Budget(redis_client, "r", None).usage()[0].input_tokens == 7
    # a finished stage leaves no per-shard state
    assert redis_client.zcard(keys.todo) == redis_client.zcard(keys.leased) == redis_client.hlen(keys.holders) == 0


def test_a_released_shard_goes_back_to_the_queue(redis_client: redis.Redis) -> None:
    Ledger(redis_client).init_stage("r", "s", pending=[0, 1], shards_total=2, units_total=2, shards_done=0)
    keys = StageKeys("pl", "r", "s")

    async def go(leases: Leases) -> list[int]:
        c = await leases.claim(keys, "w1", 5_000)
        assert isinstance(c, Claim) and c.shard == 0
        await leases.release_shard(keys, c)
        got = [await leases.claim(keys, "w2", 5_000) for _ in range(2)]
        return [g.shard for g in got if isinstance(g, Claim)]

    assert run(go, redis_client) == [0, 1]


def test_claim_cost_does_not_grow_with_the_queue(redis_client: redis.Redis) -> None:
    """Claims pop from a sorted set: the 100,000th shard is claimed as fast as the 100th (bench/ has figures).
    Here only the shape: ten claims on a 100k-shard queue touch ten shards, whatever is left."""
    Ledger(redis_client).init_stage(
        "r", "big", pending=range(100_000), shards_total=100_000, units_total=1, shards_done=0
    )
    keys = StageKeys("pl", "r", "big")

    async def go(leases: Leases) -> list[int]:
        claims = [await leases.claim(keys, "w", 60_000) for _ in range(10)]
        return [c.shard for c in claims if isinstance(c, Claim)]

    assert run(go, redis_client) == list(range(10))
    assert redis_client.zcard(keys.todo) == 99_990 and redis_client.zcard(keys.leased) == 10


def test_the_lease_takes_the_provider_wide_rate_slot(redis_client: redis.Redis) -> None:
    """600/min on the provider: two models share it, so their slots are 100 ms apart, and unused tokens
    come back at commit."""
    limits = Limits(requests_per_minute=600, tokens_per_minute=60_000)
    a = RateScope("pl", "p", "model-a", limits, RateLimitSettings())
    b = RateScope("pl", "p", "model-b", limits, RateLimitSettings())

    async def go(leases: Leases) -> list[tuple[float, float, float]]:
        slots = []  # each grant's slot, bracketed: (sent + wait, answered + wait) on this process's clock
        for i in range(4):
            sent = time.monotonic()
            g = await leases.acquire(f"k{i}", "w", 5_000, rate=a if i % 2 else b, tokens=100)
            answered = time.monotonic()
            assert isinstance(g, Grant)
            slots.append((sent + g.wait_s, answered + g.wait_s, g.wait_s))
            assert await leases.commit(g, rate=a if i % 2 else b, unused_tokens=90)
        return slots

    slots = run(go, redis_client)
    assert slots[0][2] == 0.0  # the first goes at once
    # the slots are 100 ms apart across both models, whatever the time between the acquires (a loaded machine)
    for (early_lo, early_hi, _), (late_lo, late_hi, _) in itertools.pairwise(slots):
        assert late_lo - early_hi - 0.003 <= 0.1 <= late_hi - early_lo + 0.003, (slots,)  # waits are in whole ms
    assert redis_client.exists("pl:rl:{p}:req") and not redis_client.exists("pl:rl:{p}:m:model-a:req")


def test_a_models_own_limit_is_a_separate_cell(redis_client: redis.Redis) -> None:
    limits = Limits(requests_per_minute=6000, models={"slow": (60.0, 0.0)})
    slow = RateScope("pl", "p", "slow", limits, RateLimitSettings())
    fast = RateScope("pl", "p", "fast", limits, RateLimitSettings())

    async def go(leases: Leases) -> tuple[float, float]:
        for i in range(2):
            g = await leases.acquire(f"s{i}", "w", 5_000, rate=slow)
            assert isinstance(g, Grant)
            last_slow = g.wait_s
        g = await leases.acquire("f", "w", 5_000, rate=fast)
        assert isinstance(g, Grant)
        return last_slow, g.wait_s

    slow_wait, fast_wait = run(go, redis_client)
    assert slow_wait > 0.5  # the slow model: one a second
    assert fast_wait < 0.5  # the provider's cell is far from full


def test_the_lease_reserves_the_cost_under_a_cap(redis_client: redis.Redis) -> None:
    async def go(leases: Leases) -> None:
        grants = []
        for i in range(3):
            g = await leases.acquire(f"c{i}", "w", 5_000, estimate_usd=0.3)
            assert isinstance(g, Grant)
            grants.append(g)
        assert isinstance(await leases.acquire("c3", "w", 5_000, estimate_usd=0.3), OverBudget)
        assert not redis_client.exists(request_key("pl", "c3"))  # refused: no lease taken
        assert await leases.commit(grants[0], actual_usd=0.05)  # cheaper than estimated
        await leases.release(grants[1])  # failed: nothing spent
        assert isinstance(await leases.acquire("c3", "w", 5_000, estimate_usd=0.3), Grant)

    run(go, redis_client, cap_usd=1.0)
    b = Budget(redis_client, "r", 1.0)
    assert b.spent_usd() == pytest.approx(0.05)
    assert b.reserved_usd() == pytest.approx(0.6)


def test_without_a_cap_nothing_is_written_for_the_budget(redis_client: redis.Redis) -> None:
    async def go(leases: Leases) -> None:
        g = await leases.acquire("n", "w", 5_000, estimate_usd=5.0)
        assert isinstance(g, Grant) and g.reserved_usd == 0
        assert await leases.commit(g, actual_usd=1.0)

    run(go, redis_client)
    assert redis_client.keys("pl:{run:*}:budget:*") == []


def test_heartbeat_renews_everything_in_one_round_trip(redis_client: redis.Redis) -> None:
    Ledger(redis_client).init_stage("r", "h", pending=[0, 1], shards_total=2, units_total=2, shards_done=0)
    keys = StageKeys("pl", "r", "h")

    async def go(leases: Leases) -> tuple[list[Grant], list[Claim]]:
        grants = [await leases.acquire(f"h{i}", "w", 400) for i in range(3)]
        claims = [await leases.claim(keys, "w", 400) for _ in range(2)]
        held = [g for g in grants if isinstance(g, Grant)]
        shards = [c for c in claims if isinstance(c, Claim)]
        for _ in range(3):
            await asyncio.sleep(0.2)
            lost = await leases.renew(400, requests=held, shards={keys: shards})
            assert lost == ([], [])
        assert isinstance(await leases.acquire("h0", "other", 400), Held)  # still ours after 600 ms
        assert await leases.claim(keys, "other", 400) != -1 and redis_client.zcard(keys.todo) == 0
        return held, shards

    run(go, redis_client)


def test_unreachable_redis_fails_closed() -> None:
    from punchline.services.redis_server import free_port

    async def go() -> None:
        client = redis.asyncio.Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=0.2)
        leases = Leases(client, budget=BudgetTerms(run_id="r"))
        with pytest.raises(LedgerUnavailable):
            await leases.acquire("k", "w", 1_000)
        with pytest.raises(LedgerUnavailable):
            await leases.claim(StageKeys("pl", "r", "s"), "w", 1_000)
        await client.aclose()

    started = time.monotonic()
    asyncio.run(go())
    assert time.monotonic() - started < 30


def test_a_commit_with_its_pack_leaves_a_short_done_marker(redis_client: redis.Redis) -> None:
    """Committing with the pack that holds the answer turns the lease into a marker naming it: whoever asks
    for the lease next is told where the answer is; a renewal does not keep it; it goes by itself."""

    async def go(leases: Leases) -> None:
        g = await leases.acquire("k9", "w1", 5_000)
        assert isinstance(g, Grant)
        [ok] = await leases.commit_many([Settle(g, pack="_cache/packs/0001-ab-000001.pack")])
        assert ok
        got = await leases.acquire("k9", "w2", 5_000)
        assert got == Answered("_cache/packs/0001-ab-000001.pack")
        lost, _ = await leases.renew(5_000, requests=[g])
        assert lost == [g]  # the marker is nobody's lease
        assert 0 < redis_client.pttl(request_key("pl", "k9")) <= MARKER_MS
        redis_client.pexpire(request_key("pl", "k9"), 1)  # as if MARKER_MS had passed
        await asyncio.sleep(0.05)
        assert isinstance(await leases.acquire("k9", "w2", 5_000), Grant)

    run(go, redis_client)
