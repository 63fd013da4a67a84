"""The schedulers' calls on a real Redis Cluster (``tests/fixtures/valkey_cluster.py``: three masters, a replica
each), given as the plain URL of one node: the client sees cluster mode itself, and every script, pipeline and
read of several keys works across the slots (issue 42, item 3)."""

from __future__ import annotations

import asyncio

import pytest

from punchline.data.stores.local import LocalStore
from punchline.schedulers import call_figures
from punchline.schedulers.batches import BatchRecords
from punchline.schedulers.budget import Budget
from punchline.schedulers.keys import request
from punchline.schedulers.leases import (
    Answered,
    BudgetTerms,
    Claim,
    Grant,
    Held,
    Leases,
    NotYet,
    OverBudget,
    Settle,
    Take,
)
from punchline.schedulers.ledger import Ledger, StageKeys
from punchline.schedulers.rate_limit import Limits, RateLimitSettings, RateScope
from punchline.schedulers.server.ledger_access import check_loaded, missing_scripts
from punchline.schedulers.server.redis_client import cluster_mode, connect, connect_async, is_cluster
from tests.fixtures.valkey_cluster import LocalCluster

pytestmark = pytest.mark.slow  # a six-process cluster for the session


def test_a_node_s_plain_url_gives_a_cluster_client_that_loads_the_scripts_on_every_master(
    valkey_cluster: LocalCluster,
) -> None:
    url = valkey_cluster.url
    assert cluster_mode(url)
    client = connect(url)
    try:
        assert is_cluster(client)
        check_loaded(client, url)
        assert missing_scripts(client) == []
        for master in valkey_cluster.masters():  # SCRIPT LOAD went to each
            assert missing_scripts(master.client()) == []
    finally:
        client.close()


def test_a_group_take_across_slots_grants_holds_and_commits_each_lease_once(valkey_cluster: LocalCluster) -> None:
    url = valkey_cluster.url
    sync = connect(url)
    keys = [f"{d:x}{'ab' * 4}{d}" for d in range(16)]  # one request per slot group: 16 slots over three masters
    rate = RateScope(
        "pl", "cl-p", "m", Limits(requests_per_minute=60_000, tokens_per_minute=10**7), RateLimitSettings()
    )

    async def go() -> None:
        client = connect_async(url)
        try:
            leases = Leases(client, budget=BudgetTerms(run_id="cl-take", cap_usd=1.0, holder="w1"))
            got = await leases.acquire_many("w1", 30_000, [Take(k, 1, 10, 0.1) for k in keys], rate=rate)
            grants = [g for g in got if isinstance(g, Grant)]
            # the cap holds ten of them; the rest hold nothing (no lease left behind)
            assert len(grants) == 10 and all(isinstance(g, OverBudget) for g in got[10:]), got
            assert [await client.exists(request(leases.ns, k)) for k in keys[10:]] == [0] * 6
            assert Budget(sync, "cl-take", 1.0).reserved_usd() == pytest.approx(1.0)
            other = Leases(client, budget=BudgetTerms(run_id="cl-other"))
            assert all(
                isinstance(g, Held) for g in await other.acquire_many("w2", 30_000, [Take(k) for k in keys[:10]])
            )
            assert await leases.renew(30_000, requests=grants) == ([], [])
            oks = await leases.commit_many([Settle(g, rate, 5, 0.05, "pack-1") for g in grants])
            assert oks == [True] * 10
            assert await leases.commit_many([Settle(grants[0], rate, 0, 0.0, "pack-2")]) == [False]  # fenced
            assert Budget(sync, "cl-take", 1.0).spent_usd() == pytest.approx(0.5)
            again = await other.acquire_many("w2", 30_000, [Take(k) for k in keys])
            assert again[:10] == [Answered("pack-1")] * 10 and all(isinstance(g, Grant) for g in again[10:])
            slow = RateScope("pl", "cl-slow", "m", Limits(requests_per_minute=60), RateLimitSettings())
            paced = await Leases(client, budget=BudgetTerms(run_id="cl-pace")).acquire_many(
                "w3", 30_000, [Take(f"{d:x}pace") for d in range(4)], rate=slow
            )
            assert isinstance(paced[0], Grant) and all(isinstance(g, NotYet) for g in paced[2:])
            assert [await client.exists(request("pl", f"{d:x}pace")) for d in (2, 3)] == [0, 0]
        finally:
            await client.aclose()

    try:
        asyncio.run(go())
    finally:
        sync.close()


def test_a_stage_s_queue_claims_commits_and_reads_on_a_cluster(valkey_cluster: LocalCluster, tmp_path) -> None:
    url = valkey_cluster.url
    sync = connect(url)
    ledger = Ledger(sync)
    ledger.init_stage("cl-q", "s", pending=range(3), shards_total=3, units_total=30, shards_done=0)
    assert ledger.pending_shards("cl-q", "s") == 3
    k = StageKeys("pl", "cl-q", "s")

    async def go() -> None:
        client = connect_async(url)
        try:
            leases = Leases(client, budget=BudgetTerms(run_id="cl-q"))
            claim = await leases.claim(k, "w1", 30_000)
            assert isinstance(claim, Claim)
            assert await leases.renew(30_000, shards={k: [claim]}) == ([], [])
            assert await leases.commit_shard(k, claim, counters={"units_done": 10}, usage={"s\x1fm\x1fusd": 0.5})
            await call_figures.publish(client, "pl", "cl-q", "w1", b"{}")
        finally:
            await client.aclose()

    try:
        asyncio.run(go())
        assert ledger.counters("cl-q", "s").units_done == 10 and ledger.pending_shards("cl-q", "s") == 2
        assert call_figures.read_all(sync, "pl", "cl-q") == [b"{}"]
        batches = BatchRecords(sync, LocalStore(str(tmp_path)), "cl-q")
        keys = [f"{d:x}batch" for d in range(16)]
        assert batches.take("batch:cl-q:a", keys, 30_000) == keys
        batches.release("batch:cl-q:a", keys, {keys[0]: "pack-9"})
        assert sync.get(request("pl", keys[0])) == b"=pack-9" and sync.exists(request("pl", keys[1])) == 0
    finally:
        sync.close()
