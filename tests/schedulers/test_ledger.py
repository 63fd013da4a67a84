"""The coordinator's side of the ledger against a real redis-server: the queue, counters, failures."""

from __future__ import annotations

import pytest
import redis

from punchline.data.errors import LedgerUnavailable
from punchline.schedulers.ledger import Ledger


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

    from punchline.cluster.redis_server import free_port

    client = redis.Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    with pytest.raises(LedgerUnavailable):
        Ledger(client).counters("r", "s")
