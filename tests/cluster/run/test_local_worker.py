"""The driver's own worker (cluster/run/local_worker.py, a child process: workers/local_process.py), without Ray,
against real Redis, a real store and the fake provider over HTTP: it works a queued stage to the end through
the workers' own path; once stopped it takes no new unit, so a worker that takes over afterwards pays for
nothing twice; it outlives a kill -9 of its driver only to finish and commit the calls it had in flight;
and one that cannot start does not stop the others."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis
import structlog
import structlog.testing

from punchline.cluster.run import driver, local_worker
from punchline.cluster.run.local_worker import LocalWorker
from punchline.data.provider_settings import ModelSettings
from punchline.data.stores.local import LocalStore
from punchline.data.units import ShardOutput, StagePlan, UnitSpec, cut, encode_page, plan_page_key, shard_key
from punchline.pipelines.puns.data.completions import greedy_request
from punchline.schedulers.ledger import Ledger
from punchline.workers.driver_watch import driver_claim_key
from punchline.workers.fake.server import FakeProviderServer
from punchline.workers.local_process import LocalJob
from punchline.workers.shard_worker import WorkerConfig
from tests.fixtures.engine import driver_argv
from tests.fixtures.redis import client_url

ROOT = Path(__file__).resolve().parents[3]


def _queued_stage(
    tmp_path: Path, r: redis.Redis, fake: FakeProviderServer, n_units: int
) -> tuple[WorkerConfig, StagePlan, LocalStore]:
    """A stage of ``n_units`` one-call units, planned into the store and queued in the ledger, and the
    config of a worker whose driver (this process) holds the run's claim."""
    run_id = f"lw-{uuid.uuid4().hex[:8]}"
    store = LocalStore(tmp_path / "store")
    units = [UnitSpec(unit_id=f"u{i:03d}", request=greedy_request("p", "m", f"Joke {i} ___")) for i in range(n_units)]

    def put(page: object) -> None:
        assert hasattr(page, "first_shard")
        store.put(plan_page_key(run_id, "s", page.first_shard // 4), encode_page(page))  # type: ignore[arg-type]

    shape = cut("s", units, 2, 4, on_page=put)
    plan = StagePlan(
        run_id=run_id,
        stage="s",
        shard_size=2,
        shards_per_page=4,
        units_total=shape.units_total,
        shards_total=shape.shards_total,
        digest=shape.digest,
    )
    shards = plan.shards_total
    Ledger(r).init_stage(run_id, "s", pending=range(shards), shards_total=shards, units_total=n_units, shards_done=0)
    claim = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "token": uuid.uuid4().hex})
    r.set(driver_claim_key(run_id), claim)
    settings = fake.provider_settings(
        "openai", max_concurrency=2, models={"m": ModelSettings(id="m", input_usd_per_mtok=1.0)}
    )
    cfg = WorkerConfig(
        run_id=run_id,
        redis_url=client_url(r),
        store_url=store.url,
        providers={"p": settings},
        lease_ms=5_000,
        driver_claim=claim,
    )
    return cfg, plan, store


def _committed(store: LocalStore, plan: StagePlan) -> list[str]:
    decoder = msgspec.msgpack.Decoder(ShardOutput)
    out = []
    for i in range(plan.shards_total):
        raw = store.get(shard_key(plan.run_id, "s", i))
        if raw is not None:
            out += [r.unit_id for r in decoder.decode(raw).results]
    return out


@pytest.fixture(params=["fork", "spawn"])
def launch(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways the driver starts its worker: forked (before Ray is in the driver) and a fresh interpreter."""
    monkeypatch.setattr(local_worker, "forkable", lambda: request.param == "fork")
    return str(request.param)


def _wait(worker: LocalWorker, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while worker.running() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not worker.running(), "the local worker did not end"


def test_it_works_a_queued_stage_to_the_end(
    tmp_path: Path, redis_client: redis.Redis, fake: FakeProviderServer, launch: str
) -> None:
    cfg, plan, store = _queued_stage(tmp_path, redis_client, fake, 12)
    worker = LocalWorker(cfg, plan).start()
    _wait(worker)
    reports = worker.poll()
    assert len(reports) == 1 and reports[0].shards_committed == plan.shards_total
    assert worker.poll() == []  # reported once
    assert sorted(_committed(store, plan)) == [f"u{i:03d}" for i in range(12)]
    assert fake.stats().total_calls == 12 and set(fake.stats().calls.values()) == {1}
    assert Ledger(redis_client).counters(plan.run_id, "s").shards_done == plan.shards_total


def test_a_worker_whose_units_are_all_cached_builds_no_provider(
    tmp_path: Path, redis_client: redis.Redis, fake: FakeProviderServer, launch: str
) -> None:
    """A worker that pays builds its provider at its first call and says so (the driver then warms the next
    workers' SDKs); one whose units are all in the response cache (the same requests under a new run id) answers
    them all from it, builds none (no SDK imported) and says nothing."""
    cfg, plan, store = _queued_stage(tmp_path, redis_client, fake, 6)
    paying = LocalWorker(cfg, plan).start()
    _wait(paying)
    assert paying.poll()[0].shards_committed == plan.shards_total and paying.calling.is_set()
    assert fake.stats().total_calls == 6
    cfg2, plan2, _ = _queued_stage(tmp_path, redis_client, fake, 6)  # the same store: its cache answers them all
    cached = LocalWorker(cfg2, plan2).start()
    _wait(cached)
    assert cached.poll()[0].shards_committed == plan2.shards_total and not cached.calling.is_set()
    assert sorted(_committed(store, plan2)) == [f"u{i:03d}" for i in range(6)]
    assert fake.stats().total_calls == 6  # nothing paid twice


@pytest.mark.slow  # processes killed and resumed: the full suite, not `make test-fast`
def test_stopped_it_takes_no_new_unit_and_the_next_worker_pays_nothing_twice(
    tmp_path: Path, redis_client: redis.Redis, fake: FakeProviderServer, launch: str
) -> None:
    """Stopped with calls in flight (a window of 2 over 300 ms calls): those finish and are kept, no new
    unit starts, and a worker that takes over (a Ray actor in a run) calls each remaining request once."""
    fake.configure(latency_ms_for_model={"m": 300.0})
    cfg, plan, store = _queued_stage(tmp_path, redis_client, fake, 16)
    worker = LocalWorker(cfg, plan).start()
    deadline = time.monotonic() + 120
    while fake.stats().total_calls < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    worker.stop()
    assert not worker.running()
    paid_by_first = fake.stats().total_calls
    assert 1 <= paid_by_first < 16, paid_by_first  # it stopped early, not after the whole stage
    time.sleep(1.0)
    assert fake.stats().total_calls == paid_by_first  # nothing new after the stop

    next_worker = LocalWorker(cfg, plan).start()  # takes over the same queue (its shards went back)
    _wait(next_worker)
    assert sorted(_committed(store, plan)) == [f"u{i:03d}" for i in range(16)]
    assert fake.stats().total_calls == 16 and set(fake.stats().calls.values()) == {1}


# A driver in miniature: it takes the run's claim, starts the driver's own worker, says the worker's pid once
# the worker is ready, and waits to be killed.
DRIVER = """
import fcntl, json, os, socket, sys, time, uuid
import msgspec, redis
from punchline.cluster.run import driver, local_worker
from punchline.cluster.run.local_worker import LocalWorker
from punchline.workers.driver_watch import driver_claim_key
from punchline.workers.local_process import LocalJob
job = msgspec.msgpack.decode(open(sys.argv[1], "rb").read(), type=LocalJob)
claim = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "token": uuid.uuid4().hex})
redis.Redis.from_url(job.cfg.redis_url).set(driver_claim_key(job.cfg.run_id), claim)
lock = open(sys.argv[2], "w")
fcntl.flock(lock, fcntl.LOCK_EX)  # a lock the driver holds, as its ledger and store guards do
held = fcntl.fcntl(lock.fileno(), fcntl.F_DUPFD, 100)  # at a number no worker's own file takes
local_worker.forkable = lambda: sys.argv[3] == "fork"
worker = LocalWorker(msgspec.structs.replace(job.cfg, driver_claim=claim), job.plan).start()
assert worker.wait_ready(300), "not ready"
print("worker pid", worker.pid, flush=True)
time.sleep(900)
"""


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _open_files(pid: int) -> set[str]:
    out = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            out.add(os.readlink(fd))
    return out


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for a parent that does not reap it has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


@pytest.mark.slow  # processes killed and resumed: the full suite, not `make test-fast`
def test_it_outlives_a_kill_9_of_its_driver_finishes_its_calls_in_flight_and_exits(
    tmp_path: Path, redis_client: redis.Redis, fake: FakeProviderServer, launch: str
) -> None:
    """The driver killed while its worker has calls in flight (a window of 2 over 300 ms calls): the worker, in
    a session of its own, finishes and commits them, takes no new unit and exits; a worker that takes over
    then calls every remaining request once and none of the killed driver's twice."""
    fake.configure(latency_ms_for_model={"m": 300.0})
    cfg, plan, store = _queued_stage(tmp_path, redis_client, fake, 40)
    cfg = msgspec.structs.replace(cfg, log_path=str(tmp_path / "worker.log"))
    job, lock = tmp_path / "job.msgpack", tmp_path / "driver.lock"
    job.write_bytes(msgspec.msgpack.encode(LocalJob(cfg=cfg, plan=plan)))
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(job), str(lock), launch],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        lines = iter(driver.stdout.readline, b"")  # type: ignore[union-attr]
        said = next((line for line in lines if line.startswith(b"worker pid ")), b"")
        assert said, f"the driver did not start its worker: {driver.communicate(timeout=60)[1].decode()[-2000:]}"
        child = int(said.split()[-1])
        assert os.getsid(child) == child != os.getsid(driver.pid)  # its own session: Ctrl-C's SIGINT misses it
        deadline = time.monotonic() + 120
        while fake.stats().total_calls < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert fake.stats().total_calls >= 1
        # it holds none of its driver's files (a forked one closed what it inherited: a lock held here would
        # outlive the driver)
        assert str(lock) not in _open_files(child)
    finally:
        driver.kill()
        driver.wait()
    deadline = time.monotonic() + 120
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the worker did not exit after its driver was killed"
    paid = fake.stats().total_calls
    assert 1 <= paid < 40, paid  # it stopped taking units, not after the whole stage
    log = _events(tmp_path / "worker.log")
    assert any(e["event"] == "driver_gone" for e in log)
    assert any(e["event"] == "local_worker_done" for e in log)  # it ended by draining, not by dying

    redis_client.set(driver_claim_key(plan.run_id), cfg.driver_claim or "")  # this process drives again
    next_worker = LocalWorker(cfg, plan).start()  # the killed one's shards are back in the queue
    _wait(next_worker)
    assert sorted(_committed(store, plan)) == [f"u{i:03d}" for i in range(40)]
    assert fake.stats().total_calls == 40 and set(fake.stats().calls.values()) == {1}  # nothing paid twice


@pytest.mark.slow  # processes killed and resumed: the full suite, not `make test-fast`
def test_a_worker_that_cannot_start_reports_nothing_and_the_stage_goes_on(
    tmp_path: Path, redis_client: redis.Redis, fake: FakeProviderServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker process that fails to build its connections (here: a ledger password it cannot find) is
    logged and reports nothing; the stage is still there for the next worker (the Ray ones in a run)."""
    cfg, plan, store = _queued_stage(tmp_path, redis_client, fake, 4)
    broken = msgspec.structs.replace(
        cfg, redis_url="redis://:***@127.0.0.1:1/0", redis_password_file=str(tmp_path / "missing")
    )
    worker = LocalWorker(broken, plan).start()
    assert worker.wait_ready(120)
    _wait(worker)
    assert worker.poll() == [] and "ConfigError" in worker.error
    worker.stop()  # stopping an ended worker is harmless

    monkeypatch.setattr(local_worker, "forkable", lambda: False)  # a fresh interpreter that does not exist
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python"))
    unstartable = LocalWorker(cfg, plan).start()
    assert unstartable.wait_ready(1) and not unstartable.running() and unstartable.poll() == []
    assert "no-python" in unstartable.error
    unstartable.stop()
    monkeypatch.undo()

    next_worker = LocalWorker(cfg, plan).start()
    _wait(next_worker)
    assert sorted(_committed(store, plan)) == [f"u{i:03d}" for i in range(4)]
    assert fake.stats().total_calls == 4


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_kill_9_of_a_local_run_while_the_driver_works_then_resume(
    tmp_path: Path, make_config: Any, fake: FakeProviderServer
) -> None:
    """The user's path (`punchline run` with nothing configured: its own Ray, the runs folder's ledger), killed
    with SIGKILL while the driver's own worker is calling, then resumed: every request is answered, and only
    requests that the local Ray's actors had in flight at the kill may be paid twice (two actors, each with a
    window of 4: Ray ends them with the driver); the driver's own worker, a process of its own, finishes and
    commits its calls in flight, so none of them is paid twice."""
    cfg = make_config(jokes=8, models=("3b", "70b"), shard_size=2, lease_ms=2000)
    fake.configure(latency_ms_min=60, latency_ms_max=120)
    argv = driver_argv(cfg, "local-killed", tmp_path)
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while fake.stats().total_calls < 6 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, f"driver ended before the kill: {proc.stderr.read().decode()[-2000:]}"  # type: ignore[union-attr]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    log_path = tmp_path / "runs" / "local-killed" / "log.jsonl"
    started = {e["pid"] for e in _events(log_path) if e["event"] == "local_worker_start"}
    assert started  # the driver was working shards itself when it was killed

    resumed = subprocess.run(argv, cwd=ROOT, capture_output=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr.decode()[-3000:]
    calls = fake.stats().calls
    assert len(calls) == 32, f"{len(calls)} distinct requests answered, expected 32"
    assert max(calls.values()) <= 2
    extra = sum(n - 1 for n in calls.values())
    assert extra <= 2 * 4, f"{extra} requests paid twice"
    # the killed driver's own worker did not die with it: it saw the driver gone and drained, or it had already
    # run out of shards (the local Ray's actors took the rest) and ended by itself
    theirs = [e["event"] for e in _events(log_path) if e.get("pid") in started]
    assert "driver_gone" in theirs or theirs[-1] == "local_worker_done", theirs[-15:]
    record = json.loads((tmp_path / "runs" / "local-killed" / "run.json").read_text())
    assert record["state"] == "finished" and record["counters"]["collect"]["units_done"] == 32


def test_fork_warmup_imports_the_next_workers_modules_and_settles_before_a_fork(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver imports the SDKs its next forked workers need in the background; ``settle`` returns only
    once the imports are over (a fork during one would hang the child on the import lock). A module that
    cannot be imported is left to the worker (which says why), and nothing is imported when the workers
    will not be forked."""
    name = f"warm_probe_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text("import time\ntime.sleep(1.0)\nLOADED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    idle = local_worker.ForkWarmup([name], when=lambda: False)
    idle.start()
    idle.settle()
    assert name not in sys.modules
    warm = local_worker.ForkWarmup(["punchline_no_such_module", name], when=lambda: True)
    warm.start()
    with structlog.testing.capture_logs() as logged:
        warm.settle("classify")  # the import takes 1 s: the wait is said, for the progress line
    assert {"event": "fork_warmup_settling", "stage": "classify", "modules": 2, "log_level": "info"} in logged
    try:
        assert sys.modules[name].LOADED is True
    finally:
        sys.modules.pop(name, None)


def test_fork_warmup_imports_the_sdks_only_when_a_later_stage_forks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDKs go to the driver only for a later stage's fork (a one-stage anthropic run paid 1.1 s of CPU and
    57 MB for an SDK no fork used); the reduces' own slow imports are warmed either way."""
    sdk, plot = (f"warm_{what}_{uuid.uuid4().hex[:8]}" for what in ("sdk", "plot"))
    for name in (sdk, plot):
        (tmp_path / f"{name}.py").write_text("LOADED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        last = local_worker.ForkWarmup([plot], when=lambda: True)
        last.start(())  # the last calling stage: no SDK
        last.settle()
        assert plot in sys.modules and sdk not in sys.modules
        sys.modules.pop(plot)
        earlier = local_worker.ForkWarmup([plot], when=lambda: True)
        earlier.start([sdk])
        earlier.settle()
        assert earlier.modules == [sdk, plot] and sdk in sys.modules and plot in sys.modules
    finally:
        sys.modules.pop(sdk, None)
        sys.modules.pop(plot, None)


def test_calls_later_names_the_stages_a_later_fork_follows() -> None:
    order = ["collect", "classify", "rank", "cloze", "evaluate"]
    assert driver.calls_later(order, {"collect", "classify", "evaluate"}) == {
        "collect": True,
        "classify": True,
        "rank": True,
        "cloze": True,
        "evaluate": False,
    }
    assert driver.calls_later(["generate", "judge"], {"generate"}) == {"generate": False, "judge": False}
