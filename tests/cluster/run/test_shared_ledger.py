"""One ledger per runs folder: drivers share the embedded server, the last one to leave stops it, a
killed driver does not keep it alive, and a second driver of a running run id refuses at once.

The end-to-end tests start real drivers as subprocesses (``python -m punchline.cluster.cli.main run``) on
the session's Ray and fake provider, with nothing configured: no --redis-url, no --store.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from punchline.schedulers.run_claim import RunAlreadyRunning, RunClaim, claim_key
from punchline.services.keeper import live_clients
from punchline.services.local_redis import LocalRedis, redis_dir
from punchline.services.redis_server import EmbeddedRedis
from punchline.workers.fake.server import FakeProviderServer

ROOT = Path(__file__).resolve().parents[3]


def wait_for(cond: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.1)


def _running(runs: Path) -> str | None:
    return EmbeddedRedis.find_running(redis_dir(runs))


# --- the shared server, without Ray -----------------------------------------------------------------


def test_drivers_share_one_server_and_the_last_to_leave_stops_it(tmp_path: Path) -> None:
    a = LocalRedis(tmp_path).join()
    b = LocalRedis(tmp_path).join()
    try:
        assert a.url == b.url and a.started and not b.started
        assert a.public_url == b.public_url and ":***@" in a.public_url
        assert len(live_clients(redis_dir(tmp_path))) == 2
        assert a.leave() is False  # b still uses it
        assert _running(tmp_path) == b.url
        client = EmbeddedRedis.find_running(redis_dir(tmp_path))
        assert client is not None
    finally:
        assert b.leave() is True  # the last one stops it
    assert _running(tmp_path) is None
    c = LocalRedis(tmp_path).join()  # and the next one starts it again on the same AOF
    try:
        assert c.started
    finally:
        c.leave()


_JOINER = textwrap.dedent(
    """
    import sys, time
    from punchline.services.local_redis import LocalRedis
    ledger = LocalRedis(sys.argv[1]).join()
    print(ledger.public_url, flush=True)
    time.sleep(600)
    """
)


def _joiner(runs: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", _JOINER, str(runs)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and ":***@" in proc.stdout.readline()
    return proc


@pytest.mark.slow  # Ray or several processes: not in `make test-fast`
def test_a_killed_driver_does_not_keep_the_server_alive(tmp_path: Path) -> None:
    driver = _joiner(tmp_path)
    assert _running(tmp_path) is not None
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    wait_for(lambda: _running(tmp_path) is None, timeout_s=30)  # the keeper saw no live driver and stopped it


@pytest.mark.slow  # Ray or several processes: not in `make test-fast`
def test_a_killed_driver_does_not_stop_the_server_under_another(tmp_path: Path) -> None:
    first, second = _joiner(tmp_path), _joiner(tmp_path)
    try:
        url = _running(tmp_path)
        assert url is not None
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        time.sleep(8)  # past the keeper's grace: the live driver keeps it up
        assert _running(tmp_path) == url
        assert len(live_clients(redis_dir(tmp_path))) == 1
    finally:
        os.kill(second.pid, signal.SIGKILL)
        second.wait()
    wait_for(lambda: _running(tmp_path) is None, timeout_s=30)


@pytest.mark.slow  # Ray or several processes: not in `make test-fast`
@pytest.mark.parametrize("how", ["deleted", "moved"])
def test_a_server_whose_folder_was_deleted_or_moved_is_stopped(tmp_path: Path, how: str) -> None:
    """A runs folder removed (a test's tmp folder, a user's rm -rf) or renamed under a running ledger leaves no
    server behind once its drivers are gone: the keeper holds the folder open and knows its server by identity."""
    import shutil

    runs = tmp_path / "runs"
    runs.mkdir()
    driver = _joiner(runs)
    pid = json.loads((redis_dir(runs) / "redis.lock").read_text())["pid"]
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    if how == "deleted":
        shutil.rmtree(runs / "_ledger")
    else:
        runs.rename(tmp_path / "runs-renamed")
    wait_for(lambda: not _is_server(pid), timeout_s=60)


def _is_server(pid: int) -> bool:
    try:
        return b"-server" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


# --- one driver per run id ------------------------------------------------------------------------


def test_a_second_claim_on_a_running_run_id_is_refused(redis_client: Any) -> None:
    first = RunClaim(redis_client, "claimed").acquire()
    try:
        with pytest.raises(RunAlreadyRunning, match=r"run claimed is already running \(driver pid \d+"):
            RunClaim(redis_client, "claimed").acquire()
    finally:
        first.release()
    RunClaim(redis_client, "claimed").acquire().release()  # released: free again
    assert redis_client.get(claim_key("claimed")) is None


def test_a_killed_drivers_claim_is_taken_over_at_once(redis_client: Any) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    holder = {"host": os.uname().nodename, "pid": int(dead.stdout), "token": "x"}
    redis_client.set(claim_key("resumed"), json.dumps(holder), px=30_000)
    claim = RunClaim(redis_client, "resumed").acquire()  # its pid is gone: no 30 s wait
    claim.release()


# --- end to end: real drivers, real Ray, the fake provider ---------------------------------------


def _driver(cfg: Path, runs: Path, address: str, *extra: str) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "punchline.cluster.cli.main", "run", str(cfg), "--runs-dir", str(runs),
            "--ray-address", address, "--no-progress", *extra]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("PUNCHLINE_REDIS_URL", "PUNCHLINE_STORE")}
    return subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


@pytest.mark.slow
def test_two_default_runs_of_one_config_at_once_pay_each_request_once(
    tmp_path: Path, make_config, fake: FakeProviderServer, ray_local: Any
) -> None:
    import ray

    cfg = make_config(jokes=8, models=("3b", "70b"), shard_size=2, workers_per_node=1)
    fake.configure(latency_ms_min=20, latency_ms_max=60)
    runs = tmp_path / "runs"
    address = ray.get_runtime_context().gcs_address
    a, b = _driver(cfg, runs, address), _driver(cfg, runs, address)  # the same moment, defaults only
    try:
        results = [p.communicate(timeout=300) for p in (a, b)]
    finally:
        _kill(a, b)
    assert a.returncode == 0 and b.returncode == 0, [r[1].decode()[-2000:] for r in results]
    calls = fake.stats().calls
    assert len(calls) == 8 * 2 * 2 and set(calls.values()) == {1}, calls  # every request paid once in total
    records = [json.loads(p.read_text()) for p in runs.glob("*/run.json")]
    assert len(records) == 2 and len({r["run_id"] for r in records}) == 2
    assert {r["services"]["redis_url"] for r in records} == {records[0]["services"]["redis_url"]}  # one ledger
    wait_for(lambda: _running(runs) is None, timeout_s=30)  # the last driver out stopped it


@pytest.mark.slow
def test_the_same_run_id_twice_the_second_refuses_and_stops_nothing(
    tmp_path: Path, make_config, fake: FakeProviderServer, ray_local: Any
) -> None:
    import ray

    cfg = make_config(jokes=8, models=("3b", "70b"), shard_size=2, workers_per_node=1)
    # the first run outlasts the second driver's start (its SDK imports alone take seconds on a busy machine)
    fake.configure(latency_ms_min=2000, latency_ms_max=2500)
    runs = tmp_path / "runs"
    address = ray.get_runtime_context().gcs_address
    first = _driver(cfg, runs, address, "--run-id", "twice")
    try:
        _same_run_id_twice(cfg, runs, address, first, fake)
    finally:
        _kill(first)
    wait_for(lambda: _running(runs) is None, timeout_s=30)


def _kill(*procs: subprocess.Popen[bytes]) -> None:
    """A failed test leaves no driver behind (its ledger then stops too)."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _same_run_id_twice(
    cfg: Path, runs: Path, address: str, first: subprocess.Popen[bytes], fake: FakeProviderServer
) -> None:
    wait_for(lambda: fake.stats().total_calls > 0 or first.poll() is not None, timeout_s=180)
    assert first.poll() is None, first.communicate()[1].decode()[-2000:]
    second = _driver(cfg, runs, address, "--run-id", "twice")
    try:
        _, err = second.communicate(timeout=60)
    finally:
        _kill(second)
    lines = err.decode().strip().splitlines()
    assert second.returncode == 2, err.decode()[-2000:]
    assert len(lines) == 1 and "run twice is already running" in lines[0], lines
    assert first.poll() is None and _running(runs) is not None  # nothing stopped under the first driver
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err.decode()[-2000:]
    calls = fake.stats().calls
    assert len(calls) == 32 and set(calls.values()) == {1}
    assert json.loads((runs / "twice" / "run.json").read_text())["state"] == "finished"
