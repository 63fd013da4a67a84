"""The lifeguard of a detached worker, without Ray, against real Redis: once the driver is gone (its process
killed on this machine, its claim taken over, or its Ray job ended) it waits for the running work calls,
then ends the worker, exactly once; while the driver lives (or is paused: its claim lapsed) it never does."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
import redis

from punchline.cluster.run import local_worker
from punchline.cluster.run.local_worker import LocalWorker
from punchline.data.provider_settings import ModelSettings
from punchline.data.stores.local import LocalStore
from punchline.data.units import ShardOutput, StagePlan, UnitSpec, cut, encode_page, plan_page_key, shard_key
from punchline.pipelines.puns.data.completions import greedy_request
from punchline.schedulers.ledger import Ledger
from punchline.schedulers.server.redis_client import connect, connect_async
from punchline.services.redis_server import EmbeddedRedis
from punchline.workers import driver_watch
from punchline.workers.driver_watch import DriverWatch, Lifeguard, driver_claim_key
from punchline.workers.fake.server import FakeProviderServer
from punchline.workers.shard_worker import WorkerConfig
from tests.fixtures.redis import client_url


def _claim(pid: int) -> str:
    return json.dumps({"host": socket.gethostname(), "pid": pid, "token": secrets.token_hex(8)})


class _Worker:
    """What the lifeguard sees of a worker: its running work calls, and whether it left (and how often)."""

    def __init__(self) -> None:
        self.running = 0
        self.leaves = 0
        self.left_while_running = False

    def leave(self) -> None:
        self.leaves += 1
        self.left_while_running |= self.running > 0


def _guard(url: str, run_id: str, claim: str | None, worker: _Worker, owner_gone: Callable[[], bool]) -> Lifeguard:
    return Lifeguard(
        lambda: DriverWatch(connect_async(url), run_id, claim),
        busy=lambda: worker.running > 0,
        leave=worker.leave,
        owner_gone=owner_gone,
    ).start()


def _wait(cond: Callable[[], bool], timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_killed_driver_ends_the_worker_after_its_running_work(redis_client: redis.Redis) -> None:
    url = client_url(redis_client)
    run_id = f"lg-{uuid.uuid4().hex[:8]}"
    driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    claim = _claim(driver.pid)
    redis_client.set(driver_claim_key(run_id), claim, px=30_000)
    worker = _Worker()
    worker.running = 1  # a work call with calls in flight
    guard = _guard(url, run_id, claim, worker, lambda: False)
    try:
        time.sleep(1.0)
        assert not guard.gone.is_set() and worker.leaves == 0  # a live driver: nothing happens
        driver.kill()
        driver.wait()
        assert _wait(guard.gone.is_set), "the driver's death was not seen"
        time.sleep(0.6)
        assert worker.leaves == 0  # the running work call finishes first
        worker.running = 0
        assert _wait(lambda: worker.leaves > 0)
        guard.join(10)
        assert worker.leaves == 1 and not worker.left_while_running
    finally:
        driver.kill()
        driver.wait()


def test_a_resumed_driver_taking_the_claim_ends_the_old_workers_a_lapsed_claim_does_not(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(driver_watch, "CLAIM_GRACE_S", 0.5)
    url = client_url(redis_client)
    run_id = f"lg-{uuid.uuid4().hex[:8]}"
    old = json.dumps({"host": "another-machine", "pid": 1, "token": "a"})  # no pid to check here
    worker = _Worker()
    guard = _guard(url, run_id, old, worker, lambda: False)
    time.sleep(4.5)  # the claim missing (lapsed: a paused driver) for two claim checks, past the grace
    assert worker.leaves == 0 and not guard.gone.is_set()
    redis_client.set(driver_claim_key(run_id), _claim(12345), px=30_000)
    assert _wait(lambda: worker.leaves == 1)
    guard.join(10)


def test_an_ended_ray_job_ends_a_worker_with_no_claim_to_watch(redis_client: redis.Redis) -> None:
    worker = _Worker()
    ended = threading.Event()
    guard = _guard(client_url(redis_client), "no-claim", None, worker, ended.is_set)
    time.sleep(2.5)
    assert worker.leaves == 0
    ended.set()
    assert _wait(lambda: worker.leaves == 1)
    guard.join(10)


def _stage_on(server: EmbeddedRedis, store: LocalStore, run_id: str, units: list[UnitSpec]) -> StagePlan:
    """The stage's plan in the store and, on this ledger, its shards without a file queued (a resume's start)."""

    def put(page: object) -> None:
        assert hasattr(page, "first_shard")
        store.put(plan_page_key(run_id, "s", page.first_shard // 4), encode_page(page))  # type: ignore[arg-type]

    shape = cut("s", units, 8, 4, on_page=put)  # shards of 8 over a window of 2: units wait for their leases
    plan = StagePlan(
        run_id=run_id,
        stage="s",
        shard_size=8,
        shards_per_page=4,
        units_total=shape.units_total,
        shards_total=shape.shards_total,
        digest=shape.digest,
    )
    pending = [i for i in range(plan.shards_total) if not store.exists(shard_key(run_id, "s", i))]
    Ledger(connect(server.url)).init_stage(
        run_id, "s", pending=pending, shards_total=plan.shards_total, units_total=len(units), shards_done=0
    )
    return plan


def _worker_on(
    server: EmbeddedRedis, store: LocalStore, fake: FakeProviderServer, run_id: str, driver_pid: int
) -> WorkerConfig:
    claim = _claim(driver_pid)
    connect(server.url).set(driver_claim_key(run_id), claim)
    settings = fake.provider_settings(
        "openai", max_concurrency=2, models={"m": ModelSettings(id="m", input_usd_per_mtok=1.0)}
    )
    return WorkerConfig(
        run_id=run_id,
        redis_url=server.url,
        store_url=store.url,
        providers={"p": settings},
        lease_ms=5_000,
        driver_claim=claim,
    )


@pytest.mark.slow  # two ledgers, a driver killed, worker processes: the full suite, not `make test-fast`
@pytest.mark.parametrize("end", ["kill -9 of the driver", "SIGTERM of the worker"])
def test_a_worker_ends_when_its_ledger_is_gone_and_the_resume_on_a_new_ledger_pays_nothing_twice(
    tmp_path: Path, fake: FakeProviderServer, monkeypatch: pytest.MonkeyPatch, end: str
) -> None:
    """Issue 34: the keeper stops the ledger under a driver's worker (its units waiting for leases), then the
    driver is killed (or the worker told to stop with SIGTERM): the worker must end although its ledger never
    comes back (it used to retry ``ledger_unavailable`` forever), and a resume on a new ledger (a new port)
    pays each request once, the old worker's answers in flight included (they are in the store)."""
    monkeypatch.setattr(local_worker, "forkable", lambda: False)  # a fresh interpreter: nothing of pytest's
    fake.configure(latency_ms_for_model={"m": 150.0})
    run_id = f"end-{uuid.uuid4().hex[:8]}"
    store = LocalStore(tmp_path / "store")
    units = [UnitSpec(unit_id=f"u{i:03d}", request=greedy_request("p", "m", f"Joke {i} ___")) for i in range(40)]
    old_ledger = EmbeddedRedis(tmp_path / "ledger-a")
    old_ledger.start()
    driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        plan = _stage_on(old_ledger, store, run_id, units)
        old = LocalWorker(_worker_on(old_ledger, store, fake, run_id, driver.pid), plan).start()
        assert _wait(lambda: fake.stats().total_calls >= 4), "the worker made no call"
        old_ledger.stop()  # the keeper stops the ledger: the worker's next leases wait for it
        time.sleep(1.0)
        assert old.running()  # waiting for its ledger, as it should while its driver lives
        if end.startswith("kill"):
            driver.kill()
            driver.wait()
        else:
            assert old.pid is not None
            os.kill(old.pid, signal.SIGTERM)
        assert _wait(lambda: not old.running(), 60.0), f"the worker did not end after the {end}"
        paid_before = fake.stats().total_calls
        assert paid_before < len(units)  # it stopped early, not after the whole stage

        new_ledger = EmbeddedRedis(tmp_path / "ledger-b")  # the resume's ledger: another folder, another port
        new_ledger.start()
        try:
            assert new_ledger.port != old_ledger.port
            plan = _stage_on(new_ledger, store, run_id, units)
            resumed = LocalWorker(_worker_on(new_ledger, store, fake, run_id, os.getpid()), plan).start()
            assert _wait(lambda: not resumed.running(), 120.0)
            reports = resumed.poll()
            assert len(reports) == 1 and not reports[0].driver_gone, resumed.error
        finally:
            new_ledger.stop()
    finally:
        driver.kill()
        driver.wait()
        old_ledger.stop()
    decoder = msgspec.msgpack.Decoder(ShardOutput)
    done = [
        r.unit_id
        for i in range(plan.shards_total)
        for r in decoder.decode(store.get(shard_key(run_id, "s", i)) or b"").results
    ]
    assert sorted(done) == [u.unit_id for u in units]
    calls = fake.stats().calls
    assert len(calls) == len(units) and set(calls.values()) == {1}, calls  # each request paid once


def test_a_work_call_still_running_past_the_drain_bound_is_not_waited_for(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 34: the lifeguard waits for the running work calls only up to the drain bound (plus a grace); a
    worker still busy after it (a call that never returns) is ended (``force``), never left running forever."""
    monkeypatch.setattr(driver_watch, "FORCE_GRACE_S", 0.3)
    run_id = f"lg-{uuid.uuid4().hex[:8]}"
    driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    claim = _claim(driver.pid)
    redis_client.set(driver_claim_key(run_id), claim, px=30_000)
    worker = _Worker()
    worker.running = 1  # and it never ends
    forced = threading.Event()
    guard = Lifeguard(
        lambda: DriverWatch(connect_async(client_url(redis_client)), run_id, claim),
        busy=lambda: worker.running > 0,
        leave=worker.leave,
        drain_s=0.5,
        force=forced.set,
    ).start()
    try:
        time.sleep(1.5)
        assert not forced.is_set()  # the driver lives: nothing is forced
        driver.kill()
        driver.wait()
        assert _wait(forced.is_set, 30.0), "a worker busy past its drain bound was left running"
        guard.join(10)
        assert worker.leaves == 0 and guard.left.is_set()  # forced, not left through the actor's leave()
    finally:
        driver.kill()
        driver.wait()
