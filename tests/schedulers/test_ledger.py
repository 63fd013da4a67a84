"""The coordinator's side of the ledger against a real redis-server: the queue, counters, failures."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio

from punchline.data.errors import LedgerUnavailable
from punchline.schedulers.leases import BudgetTerms, Claim, Leases
from punchline.schedulers.ledger import Ledger
from tests.fixtures.redis import client_url


@pytest.fixture
def ledger(redis_client: redis.Redis) -> Ledger:
    return Ledger(redis_client)


def test_init_stage_builds_the_queue_and_the_totals(ledger: Ledger) -> None:
    assert not ledger.stage_initialized("r", "s")
    ledger.init_stage("r", "s", pending=range(5, 25_005), shards_total=25_010, units_total=200_000, shards_done=10)
    assert ledger.stage_initialized("r", "s")
    assert ledger.pending_shards("r", "s") == 25_000
    assert ledger.leased_shards("r", "s") == 0
    c = ledger.counters("r", "s")
    assert (c.shards_total, c.shards_done, c.units_total) == (25_010, 10, 200_000)
    assert c.started_at > 0
    # a rebuild (Redis lost state, or a resume) replaces the queue and keeps the start time
    ledger.init_stage("r", "s", pending=[3], shards_total=25_010, units_total=200_000, shards_done=25_009)
    assert ledger.pending_shards("r", "s") == 1 and ledger.counters("r", "s").started_at == c.started_at


def test_counters_and_failures(ledger: Ledger) -> None:
    ledger.init_stage("r", "s", pending=[0], shards_total=1, units_total=4, shards_done=0)
    ledger.count("r", "s", units_done=2, cost_usd=0.25, input_tokens=10)
    ledger.count("r", "s", units_done=1, cost_usd=0.5)
    c = ledger.counters("r", "s")
    assert (c.units_done, c.input_tokens, c.units_total) == (3, 10, 4)
    assert c.cost_usd == pytest.approx(0.75)
    ledger.record_failure("r", "s", "u1", "HTTP 404 model not found")
    assert ledger.failures("r", "s") == {"u1": "HTTP 404 model not found"}


def test_unreachable_redis_fails_closed() -> None:
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    from punchline.services.redis_server import free_port

    client = redis.Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    with pytest.raises(LedgerUnavailable):
        Ledger(client).counters("r", "s")


def _claims(redis_client: redis.Redis, run_id: str, owner: str, count: int, lease_ms: int = 60_000) -> list[int]:
    """``count`` claims in a row, as a worker makes them: the shards handed out, in order."""

    async def go() -> list[int]:
        client = redis.asyncio.Redis.from_url(client_url(redis_client))
        leases = Leases(client, budget=BudgetTerms(run_id=run_id))
        out = []
        for _ in range(count):
            got = await leases.claim(ledger.keys(run_id, "s"), owner, lease_ms)
            assert isinstance(got, Claim), got
            out.append(got.shard)
        await client.aclose()
        return out

    ledger = Ledger(redis_client)
    return asyncio.run(go())


def test_a_rebuild_queues_the_shards_a_dead_holder_may_hold_last(ledger: Ledger, redis_client: redis.Redis) -> None:
    """A resume's queue: shards whose lease was live (their requests may still be held until lease_ms
    has passed) come after the untouched ones, so the resume calls at once; a lapsed lease is not waited
    for; and a shard deferred by a rebuild that nobody claimed since stays last at the next rebuild."""
    ledger.init_stage("rd", "s", pending=range(8), shards_total=8, units_total=8, shards_done=0)
    assert _claims(redis_client, "rd", "killed-run", 3) == [0, 1, 2]
    k = ledger.keys("rd", "s")
    redis_client.zadd(k.leased, {"1": 1_000})  # shard 1's lease lapsed long ago
    assert ledger.maybe_held("rd", "s") == {0, 2}
    ledger.init_stage("rd", "s", pending=range(8), shards_total=8, units_total=8, shards_done=0)
    assert ledger.pending_shards("rd", "s") == 8 and ledger.leased_shards("rd", "s") == 0
    assert _claims(redis_client, "rd", "resume", 1) == [1]
    # killed again before it came back to 0 and 2: the next rebuild still queues them last
    ledger.init_stage("rd", "s", pending=[0, 2, 5, 7], shards_total=8, units_total=8, shards_done=4)
    assert _claims(redis_client, "rd", "resume-2", 4) == [5, 7, 0, 2]
