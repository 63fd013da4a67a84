"""Many worker processes on one ledger (issue 42 item 4): 32 plain processes, each running the engine's own shard
scheduler (``claim_shards`` and the claim script), taking its units' request leases in groups (``LeaseGroups``)
and committing them in groups, drain one stage's queue against the session's real Redis. Every shard is committed
exactly once, every request lease granted exactly once and committed once, and no fencing token is handed out
twice. How fast is ``bench/many_workers.py``'s question; this one is only whether it is right."""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
import structlog

from punchline.schedulers.claims import ClaimEnd, claim_shards
from punchline.schedulers.keys import StageKeys
from punchline.schedulers.lease_groups import LeaseGroups
from punchline.schedulers.leases import BudgetTerms, Claim, Grant, Held, Leases, Settle
from punchline.schedulers.ledger import Ledger
from punchline.schedulers.rate_limit import Limits, RateLimitSettings, RateScope
from tests.fixtures.redis import client_url

WORKERS = 32
SHARDS = 128
SHARD_SIZE = 10
WINDOW = 4
LEASE_MS = 60_000  # longer than any pause of a process on a busy machine: no lease lapses during the test
HANG_GUARD_S = 600


class _Worker:
    """A worker's window of ``WINDOW`` units; each claimed shard's units take their leases, "call" and commit."""

    def __init__(self, leases: Leases, keys: StageKeys, owner: str, rate: RateScope | None) -> None:
        self.leases, self.keys, self.owner, self.rate = leases, keys, owner, rate
        self.takes = LeaseGroups(leases)
        self.slots = asyncio.Semaphore(WINDOW)
        self.pending = 0
        self.room = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()
        self.report: dict[str, list[Any]] = {"claims": [], "shards": [], "grants": [], "commits": []}

    def stopped(self) -> bool:
        return False

    def full(self) -> bool:
        return self.pending >= WINDOW

    def busy(self) -> bool:
        return bool(self.tasks)

    async def wait_for_room(self, timeout_s: float | None = None) -> None:
        self.room.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.room.wait(), timeout_s)

    async def on_claim(self, claim: Claim) -> None:
        self.report["claims"].append([claim.shard, claim.token])
        self.pending += SHARD_SIZE
        task = asyncio.create_task(self.shard(claim))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def shard(self, claim: Claim) -> None:
        grants = await asyncio.gather(*(self.unit(claim.shard, i) for i in range(SHARD_SIZE)))
        oks = await self.leases.commit_many([Settle(g, self.rate, pack=f"{self.owner}/{claim.shard}") for g in grants])
        self.report["commits"] += [g.key for g, ok in zip(grants, oks, strict=True) if ok]
        if await self.leases.commit_shard(self.keys, claim, counters={"units_done": sum(oks)}, usage={}):
            self.report["shards"].append(claim.shard)

    async def unit(self, shard: int, i: int) -> Grant:
        async with self.slots:
            try:
                while True:
                    got = await self.takes.take(f"{self.keys.run_id}/{shard}/{i}", self.owner, LEASE_MS, rate=self.rate)
                    if isinstance(got, Grant):
                        break
                    assert isinstance(got, Held), got  # each unit's request is its own: no answer to find
                    await asyncio.sleep(0.05)
                self.report["grants"].append([got.key, got.token])
                await asyncio.sleep(0)  # the call
                return got
            finally:
                self.pending -= 1
                self.room.set()


async def _work(url: str, run_id: str, owner: str, scripted: bool, start: Any) -> dict[str, Any]:
    client = redis.asyncio.Redis.from_url(url)
    try:
        cap = 1e6 if scripted else None  # a cap and a rate limit: the lease_take/lease_settle scripts
        leases = Leases(client, budget=BudgetTerms(run_id=run_id, cap_usd=cap, holder=uuid.uuid4().hex))
        rate = None
        if scripted:
            limits = Limits(requests_per_minute=1e9)
            rate = RateScope(leases.ns, "sim", "m", limits, RateLimitSettings())
        keys = StageKeys(leases.ns, run_id, "s")
        worker = _Worker(leases, keys, owner, rate)
        await client.ping()
        await asyncio.to_thread(start.wait, HANG_GUARD_S)  # every process claims from the same moment
        end, error = await claim_shards(
            leases, keys, owner, LEASE_MS, worker, worker.on_claim,
            ledger_wait_s=60.0, stopping=lambda: False, log=structlog.get_logger("test"),
        )  # fmt: skip
        while worker.tasks:
            await asyncio.gather(*list(worker.tasks))
        return {"end": end.value, "error": str(error or ""), **worker.report}
    finally:
        await client.aclose()


def _process(url: str, run_id: str, owner: str, scripted: bool, start: Any, out: str) -> None:
    report = asyncio.run(_work(url, run_id, owner, scripted, start))
    Path(out).write_text(json.dumps(report))


@pytest.mark.slow
@pytest.mark.parametrize("scripted", [False, True], ids=["plain", "rate-limited-and-capped"])
def test_32_worker_processes_commit_every_shard_and_lease_once(
    redis_client: redis.Redis, tmp_path: Path, scripted: bool
) -> None:
    run_id = f"many-{uuid.uuid4().hex[:8]}"
    ledger = Ledger(redis_client)
    ledger.init_stage(
        run_id, "s", pending=range(SHARDS), shards_total=SHARDS, units_total=SHARDS * SHARD_SIZE, shards_done=0
    )
    ctx = multiprocessing.get_context("forkserver")  # a fresh process each, forked from one that imported us once
    ctx.set_forkserver_preload([__name__])
    start = ctx.Event()
    outs = [tmp_path / f"w{i}.json" for i in range(WORKERS)]
    procs = [
        ctx.Process(target=_process, args=(client_url(redis_client), run_id, f"w{i}", scripted, start, str(out)))
        for i, out in enumerate(outs)
    ]
    for p in procs:
        p.start()
    try:
        start.set()
        for p in procs:
            p.join(HANG_GUARD_S)
            assert p.exitcode == 0, f"a worker process failed (exit {p.exitcode})"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    reports = [json.loads(out.read_text()) for out in outs]

    assert {r["end"] for r in reports} == {ClaimEnd.DRAINED.value}
    claims = [tuple(c) for r in reports for c in r["claims"]]
    assert sorted(s for s, _ in claims) == list(range(SHARDS))  # each shard claimed once (no lease lapsed)
    assert len({t for _, t in claims}) == len(claims)  # no shard lease token handed out twice
    assert Counter(s for r in reports for s in r["shards"]) == Counter(range(SHARDS))  # each committed once
    units = {f"{run_id}/{s}/{i}" for s in range(SHARDS) for i in range(SHARD_SIZE)}
    grants = [tuple(g) for r in reports for g in r["grants"]]
    assert sorted(k for k, _ in grants) == sorted(units)  # every request lease granted exactly once
    assert len({t for _, t in grants}) == len(grants)  # its fencing token never handed to another
    assert sorted(k for r in reports for k in r["commits"]) == sorted(units)  # and committed exactly once
    counters = ledger.counters(run_id, "s")
    assert (counters.shards_done, counters.units_done) == (SHARDS, SHARDS * SHARD_SIZE)
    assert ledger.pending_shards(run_id, "s") == 0
