"""The shard scheduler (schedulers/claims.py) against a real redis-server: a worker's window bounds what it
holds, every answer of the claim script ends or continues the loop as it says, and an outage is waited out
only while the worker is not told to stop."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from typing import Any

import redis
import redis.asyncio
import structlog

from punchline.data.errors import LedgerUnavailable
from punchline.schedulers.claims import ClaimEnd, claim_shards
from punchline.schedulers.keys import StageKeys
from punchline.schedulers.leases import BudgetTerms, Claim, Leases
from punchline.schedulers.ledger import Ledger
from tests.fixtures.redis import client_url

LOG = structlog.get_logger("test")


class Window:
    """A worker's window of ``size`` shards; each shard held ends ``hold_s`` after its claim and is committed."""

    def __init__(self, leases: Leases, keys: StageKeys, size: int, hold_s: float = 0.05) -> None:
        self.leases, self.keys, self.size, self.hold_s = leases, keys, size, hold_s
        self.held: set[int] = set()
        self.claimed: list[int] = []
        self.most_held = 0
        self.room = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()
        self.stop_after: int | None = None

    def stopped(self) -> bool:
        return self.stop_after is not None and len(self.claimed) >= self.stop_after

    def full(self) -> bool:
        return len(self.held) >= self.size

    def busy(self) -> bool:
        return bool(self.held)

    async def wait_for_room(self, timeout_s: float | None = None) -> None:
        self.room.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.room.wait(), timeout_s)

    async def on_claim(self, claim: Claim) -> None:
        self.held.add(claim.shard)
        self.claimed.append(claim.shard)
        self.most_held = max(self.most_held, len(self.held))

        async def finish() -> None:
            await asyncio.sleep(self.hold_s)
            assert await self.leases.commit_shard(self.keys, claim, counters={"units_done": 1}, usage={})
            self.held.discard(claim.shard)
            self.room.set()

        task = asyncio.create_task(finish())
        self.tasks.add(task)


def claims(client: redis.Redis, keys: StageKeys, size: int, **kw: Any) -> tuple[ClaimEnd, Any, Window]:
    async def go() -> tuple[ClaimEnd, Any, Window]:
        aclient = redis.asyncio.Redis.from_url(client_url(client))
        try:
            leases = Leases(aclient, budget=BudgetTerms(run_id=keys.run_id))
            window = Window(leases, keys, size, hold_s=kw.pop("hold_s", 0.05))
            window.stop_after = kw.pop("stop_after", None)
            end, error = await claim_shards(
                leases, keys, "w1", kw.pop("lease_ms", 5_000), window, window.on_claim,
                ledger_wait_s=5.0, stopping=lambda: False, log=LOG,
            )  # fmt: skip
            await asyncio.gather(*window.tasks)
            return end, error, window
        finally:
            await aclient.aclose()

    return asyncio.run(go())


def test_a_worker_claims_every_shard_in_order_never_more_than_its_window(redis_client: redis.Redis) -> None:
    keys = StageKeys("pl", "claims-a", "s")
    Ledger(redis_client).init_stage(
        keys.run_id, "s", pending=list(range(7)), shards_total=7, units_total=7, shards_done=0
    )
    end, error, window = claims(redis_client, keys, size=2)
    assert (end, error) == (ClaimEnd.DRAINED, None)
    assert window.claimed == list(range(7))
    assert window.most_held == 2
    assert Ledger(redis_client).counters(keys.run_id, "s").shards_done == 7


def test_a_stage_redis_lost_ends_the_claims_for_the_coordinator_to_rebuild(redis_client: redis.Redis) -> None:
    end, error, window = claims(redis_client, StageKeys("pl", "claims-b", "never-initialised"), size=2)
    assert (end, error, window.claimed) == (ClaimEnd.STAGE_RESET, None, [])


def test_a_worker_told_to_stop_claims_nothing_more(redis_client: redis.Redis) -> None:
    keys = StageKeys("pl", "claims-c", "s")
    Ledger(redis_client).init_stage(
        keys.run_id, "s", pending=list(range(5)), shards_total=5, units_total=5, shards_done=0
    )
    end, _, window = claims(redis_client, keys, size=1, stop_after=2)
    assert end is ClaimEnd.STOPPED and window.claimed == [0, 1]


def test_a_shard_held_by_a_dead_worker_is_claimed_once_its_lease_lapses(redis_client: redis.Redis) -> None:
    keys = StageKeys("pl", "claims-d", "s")
    Ledger(redis_client).init_stage(keys.run_id, "s", pending=[0], shards_total=1, units_total=1, shards_done=0)

    async def dead_worker() -> None:
        aclient = redis.asyncio.Redis.from_url(client_url(redis_client))
        try:
            got = await Leases(aclient, budget=BudgetTerms(run_id=keys.run_id)).claim(keys, "dead", 400)
            assert isinstance(got, Claim) and got.shard == 0
        finally:
            await aclient.aclose()

    asyncio.run(dead_worker())
    t0 = time.monotonic()
    end, _, window = claims(redis_client, keys, size=2)
    assert end is ClaimEnd.DRAINED and window.claimed == [0]
    assert time.monotonic() - t0 >= 0.2  # it waited for the lease (it was not handed a held shard)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _unreachable(stopping: bool, wait_s: float) -> tuple[ClaimEnd, LedgerUnavailable | None, float]:
    async def go() -> tuple[ClaimEnd, LedgerUnavailable | None, float]:
        aclient = redis.asyncio.Redis(host="127.0.0.1", port=_closed_port(), socket_connect_timeout=0.5)
        leases = Leases(aclient, budget=BudgetTerms(run_id="r"))
        window = Window(leases, StageKeys("pl", "r", "s"), 2)
        t0 = time.monotonic()
        try:
            end, error = await claim_shards(
                leases, StageKeys("pl", "r", "s"), "w1", 5_000, window, window.on_claim,
                ledger_wait_s=wait_s, stopping=lambda: stopping, log=LOG,
            )  # fmt: skip
        finally:
            await aclient.aclose()
        return end, error, time.monotonic() - t0

    return asyncio.run(go())


def test_an_outage_is_waited_out_to_its_bound_then_ends_the_claims_with_its_error() -> None:
    end, error, took_s = _unreachable(stopping=False, wait_s=2.5)
    assert end is ClaimEnd.LEDGER_LOST and isinstance(error, LedgerUnavailable)
    assert took_s >= 2.0  # it asked again, a second apart, until the bound


def test_an_outage_ends_the_claims_at_once_when_the_driver_is_gone() -> None:
    end, error, took_s = _unreachable(stopping=True, wait_s=60.0)
    assert end is ClaimEnd.LEDGER_LOST and isinstance(error, LedgerUnavailable)
    assert took_s < 30.0  # not the 60 s bound: nobody waits for its answers
