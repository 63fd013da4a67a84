"""Request leases taken and committed a group at a time (``lua/lease_take.lua``, ``lua/lease_settle.lua``, and the
plain ``SET NX`` / ``SET IFEQ`` path without a rate limit or a cap), against a real server: a group grants what each
unit would have been granted alone, never more of the rate limit or the budget; a stale fence commits nothing; a
worker that dies between a group's take and its commit leaves every lease to lapse and be taken again, and each
request is committed once."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
import redis
import redis.asyncio

from punchline.schedulers.budget import Budget
from punchline.schedulers.keys import fence as fence_key
from punchline.schedulers.keys import request as request_key
from punchline.schedulers.lease_groups import LeaseGroups
from punchline.schedulers.leases import (
    TAKE_AHEAD_MS,
    TOKEN_BLOCK,
    Answered,
    BudgetTerms,
    Grant,
    Held,
    Leases,
    NotYet,
    OverBudget,
    Settle,
    Take,
)
from punchline.schedulers.rate_limit import Limits, RateLimitSettings, RateScope
from tests.fixtures.redis import client_url

T = TypeVar("T")
PACK = "_cache/packs/0001-ab-000001.pack"


def run(make: Callable[[redis.asyncio.Redis], Awaitable[T]], client: redis.Redis) -> T:
    async def go() -> T:
        aclient = redis.asyncio.Redis.from_url(client_url(client))
        try:
            return await make(aclient)
        finally:
            await aclient.aclose()

    return asyncio.run(go())


def leases_of(client: redis.asyncio.Redis, holder: str = "h1", **budget: Any) -> Leases:
    return Leases(client, budget=BudgetTerms(run_id="r", holder=holder, **budget))


def grants(got: list[Any]) -> list[Grant]:
    return [g for g in got if isinstance(g, Grant)]


def test_a_group_take_under_a_rate_limit_takes_only_the_slots_due_soon(redis_client: redis.Redis) -> None:
    """600 a minute (one every ~101 ms): of 15 units asking at once, the ten due within TAKE_AHEAD_MS of the first
    are granted, each with the wait it would have had alone; the other five hold nothing (no lease, no slot), so
    the next unit to ask waits behind the ten, not behind fifteen."""
    rate = RateScope("pl", "p", "m", Limits(requests_per_minute=600), RateLimitSettings())
    interval_ms = 60_000 / (600 * RateLimitSettings().headroom)

    async def go(client: redis.asyncio.Redis) -> tuple[list[Any], Any]:
        leases = leases_of(client)
        got = await leases.acquire_many("w", 5_000, [Take(f"r{i}") for i in range(15)], rate=rate)
        after = await leases.acquire("late", "w", 5_000, rate=rate)
        return got, after

    got, after = run(go, redis_client)
    granted = grants(got)
    assert len(granted) == int(TAKE_AHEAD_MS // interval_ms) + 1 == 10
    assert got[:10] == granted  # a prefix, in order
    for i, g in enumerate(granted):  # what each would have waited alone, asked one after the other
        assert abs(g.wait_s * 1000 - i * interval_ms) <= 2 + 0.02 * i * interval_ms, (i, g.wait_s)
        assert (
            redis_client.pttl(request_key("pl", f"r{i}")) > 5_000 + g.wait_s * 1000 - 500
        )  # the lease covers its wait
    assert all(isinstance(x, NotYet) and x.wait_ms > 0 for x in got[10:])
    assert not any(redis_client.exists(request_key("pl", f"r{i}")) for i in range(10, 15))  # nothing held for them
    assert isinstance(after, Grant) and after.wait_s * 1000 >= 10 * interval_ms - 50  # behind the ten, not fifteen


def test_group_takes_never_pass_the_limit_however_many_ask(redis_client: redis.Redis) -> None:
    """60 a minute: groups of 8 asked again and again grant one slot a second between them, never more."""
    rate = RateScope("pl", "p", "m", Limits(requests_per_minute=60), RateLimitSettings())
    interval_s = 60 / (60 * RateLimitSettings().headroom)

    async def go(client: redis.asyncio.Redis) -> list[tuple[float, float]]:
        leases = leases_of(client)
        slots: list[tuple[float, float]] = []  # each grant's slot, bracketed by when its call went and came back
        for r in range(4):
            sent = time.monotonic()
            got = await leases.acquire_many("w", 30_000, [Take(f"g{r}-{i}") for i in range(8)], rate=rate)
            answered = time.monotonic()
            slots += [(sent + g.wait_s, answered + g.wait_s) for g in grants(got)]
            assert sum(isinstance(x, NotYet) for x in got) == 8 - len(grants(got))
        return slots

    slots = run(go, redis_client)
    assert len(slots) == 4  # one per group: the second slot of each is a second away
    for (early_lo, _), (_, late_hi) in itertools.pairwise(slots):
        assert late_hi - early_lo >= interval_s - 0.003  # a slot a second at most, as asked alone (whole ms)


def test_a_group_take_holds_the_budget_of_what_fits_and_its_commit_releases_the_rest(
    redis_client: redis.Redis,
) -> None:
    async def go(client: redis.asyncio.Redis) -> list[Any]:
        leases = leases_of(client, cap_usd=1.0)
        got = await leases.acquire_many(
            "w", 5_000, [Take("b0", estimate_usd=0.3), Take("b1", estimate_usd=0.5), Take("b2", estimate_usd=0.3),
                         Take("b3", estimate_usd=0.1), Take("b4", estimate_usd=0.3)],
        )  # fmt: skip
        held = Budget(redis_client, "r", 1.0).reserved_usd()
        assert held == pytest.approx(0.3 + 0.5 + 0.1)
        done = await leases.commit_many([Settle(g, actual_usd=0.05, pack=PACK) for g in grants(got)])
        assert done == [True, True, True]
        return got

    got = run(go, redis_client)
    # as each would have been answered alone, in order: a unit over the cap does not stop a cheaper one after it
    assert [type(x) for x in got] == [Grant, Grant, OverBudget, Grant, OverBudget]
    assert not redis_client.exists(request_key("pl", "b2")) and not redis_client.exists(request_key("pl", "b4"))
    b = Budget(redis_client, "r", 1.0)
    assert b.spent_usd() == pytest.approx(0.15)
    assert b.reserved_usd() == pytest.approx(0.0)  # the unused part of the holds went back with the commit


@pytest.mark.parametrize("path", ["plain", "script", "script without IFEQ"])
def test_a_group_lease_with_a_stale_fence_cannot_commit(redis_client: redis.Redis, path: str) -> None:
    """A holder stalled past its lease: others took the requests meanwhile. Its group commit commits none of
    them and leaves the successors' leases as they were; theirs then commits."""

    async def go(client: redis.asyncio.Redis) -> None:
        budget = {"cap_usd": 10.0} if path != "plain" else {}
        zombie = leases_of(client, "z", **budget)
        fresh = leases_of(client, "f", **budget)
        if path == "script without IFEQ":
            zombie._ifeq = fresh._ifeq = False
        old = grants(await zombie.acquire_many("z", 200, [Take(f"s{i}", estimate_usd=0.1) for i in range(4)]))
        assert len(old) == 4
        await asyncio.sleep(0.3)
        new = grants(await fresh.acquire_many("f", 5_000, [Take(f"s{i}", estimate_usd=0.1) for i in range(4)]))
        assert len(new) == 4
        values = [redis_client.get(request_key("pl", f"s{i}")) for i in range(4)]
        assert await zombie.commit_many([Settle(g, actual_usd=0.1, pack=PACK) for g in old]) == [False] * 4
        assert [redis_client.get(request_key("pl", f"s{i}")) for i in range(4)] == values  # untouched
        assert redis_client.pttl(request_key("pl", "s0")) > 3_000
        assert await fresh.commit_many([Settle(g, actual_usd=0.1, pack=PACK) for g in new]) == [True] * 4
        assert all(redis_client.get(request_key("pl", f"s{i}")) == f"={PACK}".encode() for i in range(4))

    run(go, redis_client)


def test_a_crash_between_take_and_commit_leaves_the_group_to_lapse_and_each_request_is_committed_once(
    redis_client: redis.Redis,
) -> None:
    """A worker takes a group and dies (no commit, no release). Until its leases lapse nobody may take them
    (nobody pays twice); after, another takes every one and commits it; the dead worker's commit, arriving late
    (a zombie), commits nothing, and a third asker finds the done markers."""
    keys = [f"c{i}" for i in range(6)]

    async def go(client: redis.asyncio.Redis) -> None:
        dead = leases_of(client, "d")
        taken = grants(await dead.acquire_many("dead", 300, [Take(k) for k in keys]))
        assert len(taken) == 6
        other = leases_of(client, "o")
        groups = LeaseGroups(other)
        early = await asyncio.gather(*(groups.take(k, "other", 5_000) for k in keys))
        assert all(isinstance(x, Held) and 0 < x.wait_ms <= 300 for x in early)  # held by the dead worker
        assert groups.calls == 1  # the six asked together: one group
        await asyncio.sleep(0.35)
        late = await asyncio.gather(*(groups.take(k, "other", 5_000) for k in keys))
        new = grants(list(late))
        assert len(new) == 6 and not {g.token for g in new} & {g.token for g in taken}
        committed = await other.commit_many([Settle(g, pack=PACK) for g in new])
        zombie = await dead.commit_many([Settle(g, pack=PACK) for g in taken])
        assert committed == [True] * 6 and zombie == [False] * 6  # each request committed once
        third = await leases_of(client, "t").acquire_many("third", 5_000, [Take(k) for k in keys])
        assert third == [Answered(PACK)] * 6

    run(go, redis_client)


def test_tokens_come_in_blocks_and_are_never_handed_out_twice(redis_client: redis.Redis) -> None:
    async def go(client: redis.asyncio.Redis) -> list[int]:
        a, b = leases_of(client, "a"), leases_of(client, "b")
        tokens: list[int] = []
        for r in range(3):
            for leases, owner in ((a, "a"), (b, "b")):
                got = await leases.acquire_many(owner, 5_000, [Take(f"{owner}{r}-{i}") for i in range(700)])
                tokens += [g.token for g in grants(got)]
        return tokens

    tokens = run(go, redis_client)
    assert len(tokens) == 4_200 == len(set(tokens))
    assert int(redis_client.get(fence_key("pl")) or 0) <= 6 * TOKEN_BLOCK  # one INCRBY per block, not per lease


def test_units_asking_together_share_one_call_and_each_gets_its_own_answer(redis_client: redis.Redis) -> None:
    redis_client.set(request_key("pl", "taken"), "someone|1", px=5_000)
    redis_client.set(request_key("pl", "done"), f"={PACK}", px=5_000)

    async def go(client: redis.asyncio.Redis) -> tuple[list[Any], int]:
        groups = LeaseGroups(leases_of(client))
        keys = ["taken", "done", *(f"u{i}" for i in range(30))]
        got = await asyncio.gather(*(groups.take(k, "w", 5_000) for k in keys))
        return list(got), groups.calls

    got, calls = run(go, redis_client)
    assert calls == 1
    assert isinstance(got[0], Held) and got[1] == Answered(PACK)
    assert all(isinstance(g, Grant) and g.key == f"u{i}" for i, g in enumerate(got[2:]))
