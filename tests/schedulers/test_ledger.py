"""The ledger's lease, fencing and queue semantics against a real redis-server."""

from __future__ import annotations

import time

import pytest
import redis

from punchline.cluster.redis_server import EmbeddedRedis
from punchline.data.errors import LedgerUnavailable
from punchline.schedulers.ledger import Claim, Grant, Ledger


@pytest.fixture
def ledger(redis_client: redis.Redis) -> Ledger:
    return Ledger(redis_client)


def test_request_lease_is_exclusive_until_committed(ledger: Ledger) -> None:
    g = ledger.acquire_request("k1", "w1", 5_000)
    assert isinstance(g, Grant) and g.token == 1
    other = ledger.acquire_request("k1", "w2", 5_000)
    assert isinstance(other, int) and 0 < other <= 5_000
    assert ledger.commit_request(g, "ptr")
    assert ledger.acquire_request("k1", "w2", 5_000) is None  # done: nobody may call again
    assert ledger.request_done("k1")


def test_expired_lease_is_taken_over_and_zombie_commit_rejected(ledger: Ledger) -> None:
    zombie = ledger.acquire_request("k2", "w1", 1_000)
    assert isinstance(zombie, Grant)
    time.sleep(1.1)
    fresh = ledger.acquire_request("k2", "w2", 5_000)
    assert isinstance(fresh, Grant) and fresh.token == zombie.token + 1
    assert not ledger.renew(zombie, 5_000)
    assert not ledger.commit_request(zombie, "zombie")
    assert ledger.commit_request(fresh, "fresh")


def test_lapsed_lease_without_successor_may_still_commit(ledger: Ledger) -> None:
    g = ledger.acquire_request("k3", "w1", 1_000)
    assert isinstance(g, Grant)
    time.sleep(1.1)
    assert ledger.commit_request(g, "late")  # nobody took over: the fence still matches


def test_release_lets_another_worker_in(ledger: Ledger) -> None:
    g = ledger.acquire_request("k4", "w1", 5_000)
    assert isinstance(g, Grant)
    ledger.release_request(g)
    assert isinstance(ledger.acquire_request("k4", "w2", 5_000), Grant)


def test_shard_queue_claims_in_order_and_reclaims_dead_workers(ledger: Ledger) -> None:
    assert ledger.claim_shard("r", "s", "w1", 5_000) == -2  # stage not initialised
    ledger.init_stage("r", "s", pending=[2, 0, 1], shards_total=3, units_total=9, shards_done=0)
    c0 = ledger.claim_shard("r", "s", "w1", 1_000)
    c1 = ledger.claim_shard("r", "s", "w2", 5_000)
    c2 = ledger.claim_shard("r", "s", "w3", 5_000)
    assert isinstance(c0, Claim) and isinstance(c1, Claim) and isinstance(c2, Claim)
    assert [c0.shard, c1.shard, c2.shard] == [0, 1, 2]
    wait = ledger.claim_shard("r", "s", "w4", 5_000)
    assert isinstance(wait, int) and 0 < wait <= 1_000
    assert ledger.commit_shard("r", "s", c1) and ledger.commit_shard("r", "s", c2)
    time.sleep(1.1)  # w1 died holding shard 0
    again = ledger.claim_shard("r", "s", "w4", 5_000)
    assert isinstance(again, Claim) and again.shard == 0
    assert not ledger.commit_shard("r", "s", c0)  # the zombie cannot commit
    assert ledger.commit_shard("r", "s", again)
    assert ledger.claim_shard("r", "s", "w4", 5_000) == -1
    assert ledger.counters("r", "s").shards_done == 3


def test_counters_and_failures(ledger: Ledger) -> None:
    ledger.init_stage("r", "s", pending=[0], shards_total=1, units_total=4, shards_done=0)
    ledger.count("r", "s", units_done=2, cost_usd=0.25, input_tokens=10)
    ledger.count("r", "s", units_done=1, cost_usd=0.5)
    c = ledger.counters("r", "s")
    assert (c.units_done, c.input_tokens, c.units_total) == (3, 10, 4)
    assert c.cost_usd == pytest.approx(0.75)
    ledger.record_failure("r", "s", "u1", "HTTP 404 model not found")
    assert ledger.failures("r", "s") == {"u1": "HTTP 404 model not found"}


def test_unreachable_redis_fails_closed(tmp_path) -> None:
    server = EmbeddedRedis(tmp_path)
    server.start()
    url = server.url
    led = Ledger(redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1))
    assert isinstance(led.acquire_request("k", "w", 1_000), Grant)
    server.stop()
    with pytest.raises(LedgerUnavailable):
        led.acquire_request("k5", "w", 1_000)
