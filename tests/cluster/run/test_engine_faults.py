"""When punchline's own parts fail mid-run (issue 21), end to end: real drivers as subprocesses
(``python -m punchline.cluster.cli.main run``) on the session's Ray and fake provider, with the runs
folder's own ledger. Each test counts the provider calls per request key.

* the ledger ``kill -9``-ed mid-run: restarted from its AOF, progress again within 10 s;
* the driver paused (SIGSTOP) until its keeper stopped the ledger, then continued: it restarts it;
* the runs folder's disk filling up mid-run: one line naming disk space, ``run.json`` failed, and the
  resume after freeing space pays at most the calls in flight at the fault;
* a ``--redis-url`` run on a store guarded by the runs folder's ledger: refused in one line;
* Ctrl-C: exit 130 and the exact command that resumes the run, which then works.

(The driver's ``kill -9`` and the calls its workers make afterwards: ``test_faults.py``.)
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from punchline.services.local_redis import redis_dir
from punchline.services.redis_server import EmbeddedRedis
from punchline.workers.fake.server import FakeProviderServer
from punchline.workers.shard_worker import answers_waiting
from tests.fixtures.engine import engine_config

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
UNITS = 8 * 2 * 2  # 8 jokes x 2 models x (greedy + samples)
WORKERS = 2
IN_FLIGHT = 4  # units_in_flight per worker
# what one fault may cost per worker: its calls in flight plus the answers waiting for its group commit
# (at most twice its window; workers/shard_worker.answers_waiting), as in test_faults.py
PER_DEATH = IN_FLIGHT + answers_waiting(IN_FLIGHT)


class Setup:
    def __init__(self, cfg: Path, expected: bytes, address: str) -> None:
        self.cfg, self.expected, self.address = cfg, expected, address


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, fake_provider: FakeProviderServer, redis_url: str, ray_local: Any):
    """One config for every test here and the artifact of an uninterrupted run of it."""
    import ray

    from punchline.cluster.run.driver import RunOptions, run

    tmp = tmp_path_factory.mktemp("engine-faults")
    cfg = engine_config(tmp, fake_provider, jokes=8, shard_size=2, lease_ms=2000, workers_per_node=WORKERS)
    opts = RunOptions(run_id="baseline", runs_dir=str(tmp / "runs"), redis_url=redis_url, store=str(tmp / "store"))
    assert run(str(cfg), opts).state == "finished"
    expected = (tmp / "store" / "baseline" / "artifacts" / "raw_completions.json").read_bytes()
    return Setup(cfg, expected, ray.get_runtime_context().gcs_address)


@pytest.fixture
def slow_fake(fake: FakeProviderServer) -> FakeProviderServer:
    fake.configure(latency_ms_min=300, latency_ms_max=500)  # a fault lands mid-run
    return fake


def _argv(setup: Setup, runs: Path, run_id: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "punchline.cluster.cli.main", "run", str(setup.cfg), "--run-id", run_id,
            "--runs-dir", str(runs), "--ray-address", setup.address, "--no-progress", *extra]  # fmt: skip


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PUNCHLINE_REDIS_URL", "PUNCHLINE_STORE")}
    return {**env, **extra}


def _start(argv: list[str], **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=_env(**env))


@contextlib.contextmanager
def _driver(argv: list[str], **env: str) -> Iterator[subprocess.Popen[bytes]]:
    proc = _start(argv, **env)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait()


def wait_for(cond: Callable[[], bool], timeout_s: float = 180.0) -> float:
    started = time.monotonic()
    while not cond():
        assert time.monotonic() - started < timeout_s, "condition not reached in time"
        time.sleep(0.05)
    return time.monotonic() - started


def _halfway(fake: FakeProviderServer, proc: subprocess.Popen[bytes]) -> None:
    wait_for(lambda: fake.stats().total_calls >= UNITS // 3 or proc.poll() is not None)
    assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]


def _progress_within(fake: FakeProviderServer, proc: subprocess.Popen[bytes], timeout_s: float) -> float:
    """Seconds until the next provider call (or the run's end)."""
    now = fake.stats().total_calls
    return wait_for(lambda: fake.stats().total_calls > now or proc.poll() is not None, timeout_s)


def _finish(proc: subprocess.Popen[bytes]) -> str:
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()[-3000:]
    return err.decode()


def _guarantee(fake: FakeProviderServer, faults: int) -> int:
    """Every request paid, at most once more per lease that a fault cut short; the extra calls."""
    calls = fake.stats().calls
    assert len(calls) == UNITS, f"{len(calls)} distinct requests, expected {UNITS}"
    extra = sum(n - 1 for n in calls.values())
    assert extra <= faults * WORKERS * PER_DEATH, f"{extra} extra calls"
    return extra


def _artifact(runs: Path, run_id: str) -> bytes:
    return (runs / run_id / "artifacts" / "raw_completions.json").read_bytes()


def _server_pid(runs: Path) -> int:
    return int(json.loads((redis_dir(runs) / "redis.lock").read_text())["pid"])


def test_the_ledger_killed_mid_run_is_restarted_and_the_run_carries_on(
    tmp_path: Path, setup: Setup, slow_fake: FakeProviderServer
) -> None:
    runs = tmp_path / "runs"
    with _driver(_argv(setup, runs, "ledger-killed")) as proc:
        _halfway(slow_fake, proc)
        old = _server_pid(runs)
        os.kill(old, signal.SIGKILL)
        assert _progress_within(slow_fake, proc, timeout_s=10) < 10
        _finish(proc)
    assert _server_pid(runs) != old  # a new server, from the same AOF
    assert _guarantee(slow_fake, faults=0) == 0  # the answers in flight were cached: nothing paid twice
    assert _artifact(runs, "ledger-killed") == setup.expected


def test_a_paused_driver_restarts_the_ledger_its_keeper_stopped(
    tmp_path: Path, setup: Setup, slow_fake: FakeProviderServer
) -> None:
    runs = tmp_path / "runs"
    # a heartbeat counts as stale after 3 s here (60 s by default): the keeper stops the ledger during the pause
    with _driver(_argv(setup, runs, "paused"), PUNCHLINE_LEDGER_STALE_S="3") as proc:
        _halfway(slow_fake, proc)
        old = _server_pid(runs)
        os.kill(proc.pid, signal.SIGSTOP)  # a laptop closed
        try:
            wait_for(lambda: EmbeddedRedis.find_running(redis_dir(runs)) is None, timeout_s=60)
            time.sleep(1)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        assert _progress_within(slow_fake, proc, timeout_s=10) < 10
        _finish(proc)
    assert _server_pid(runs) != old
    _guarantee(slow_fake, faults=1)  # the workers' leases may have lapsed under calls in flight
    assert _artifact(runs, "paused") == setup.expected


def _fill(folder: Path, leave_bytes: int) -> Path:
    ballast = folder / "ballast"
    st = os.statvfs(folder)
    ballast.write_bytes(b"\0" * max(0, st.f_bavail * st.f_frsize - leave_bytes))
    return ballast


def test_a_disk_filling_up_mid_run_fails_it_in_seconds_and_resume_works_once_freed(
    tmp_path: Path, setup: Setup, slow_fake: FakeProviderServer
) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(disk)], capture_output=True)
    assert mounted.returncode == 0, f"cannot mount a tmpfs (the fault tests run as root): {mounted.stderr!r}"
    runs = disk / "runs"
    try:
        argv = _argv(setup, runs, "full")
        with _driver(argv) as proc:
            _halfway(slow_fake, proc)
            ballast = _fill(disk, leave_bytes=64 * 1024)  # something else filled the disk
            started = time.monotonic()
            _, err = proc.communicate(timeout=60)
            took = time.monotonic() - started
        lines = err.decode().strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, lines
        assert "no space left on the disk" in lines[0] and str(runs) in lines[0], lines
        assert took < 15
        assert json.loads((runs / "full" / "run.json").read_text())["state"] == "failed"
        ballast.unlink()
        _finish(_start(argv))  # the resume, with space again
        _guarantee(slow_fake, faults=1)
        assert _artifact(runs, "full") == setup.expected
    finally:
        with contextlib.suppress(Exception):
            EmbeddedRedis.stop_running(redis_dir(runs))
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def test_a_second_ledger_on_the_same_store_is_refused(
    tmp_path: Path, setup: Setup, slow_fake: FakeProviderServer, redis_url: str
) -> None:
    """A default run and a --redis-url run of one config on one runs folder: the second refuses in one
    line instead of paying for what the first pays for (the first is then stopped with Ctrl-C: what it paid
    until then, it paid once)."""
    runs = tmp_path / "runs"
    # a longer run (160 units, ~45 s) that outlasts the second driver's start on a busy machine
    cfg = engine_config(tmp_path, slow_fake, jokes=40, shard_size=2, lease_ms=2000, workers_per_node=WORKERS)
    longer = Setup(cfg, b"", setup.address)
    slow_fake.configure(latency_ms_min=2000, latency_ms_max=2500)
    with _driver(_argv(longer, runs, "first")) as first:
        _halfway(slow_fake, first)
        argv = _argv(longer, runs, "second", "--redis-url", redis_url)
        second = subprocess.run(argv, cwd=ROOT, capture_output=True, env=_env(), timeout=120)
        lines = second.stderr.decode().strip().splitlines()
        assert first.poll() is None, "the first run ended before the second started: the test proves nothing"
        assert second.returncode == 2 and len(lines) == 1, lines
        assert "guarded by another ledger" in lines[0] and "embedded ledger" in lines[0], lines
        assert urlsplit(redis_url).password not in lines[0]  # never the password
        os.kill(first.pid, signal.SIGINT)  # the rest of the first run proves nothing more
        _, err = first.communicate(timeout=120)
        assert first.returncode == 130, err.decode()[-2000:]
    calls = slow_fake.stats().calls
    assert len(calls) >= UNITS // 3 and set(calls.values()) == {1}  # no request paid twice
    assert not (runs / "second").exists()


def test_ctrl_c_prints_the_exact_resume_command_and_it_resumes(
    tmp_path: Path, setup: Setup, slow_fake: FakeProviderServer
) -> None:
    runs = tmp_path / "runs"
    argv = _argv(setup, runs, "interrupted-1")
    argv.remove("--run-id")
    argv.remove("interrupted-1")  # a new run: its id is made by the driver
    with _driver(argv) as proc:
        _halfway(slow_fake, proc)
        os.kill(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()[-2000:]
    line = err.decode().strip().splitlines()[-1]
    assert "resume with: punchline run " in line, line
    command = shlex.split(line.split("resume with: ", 1)[1].rstrip(")"))
    run_id = command[command.index("--run-id") + 1]
    assert json.loads((runs / run_id / "run.json").read_text())["state"] == "interrupted"
    resumed = subprocess.run(
        [sys.executable, "-m", "punchline.cluster.cli.main", *command[1:]], cwd=ROOT, capture_output=True, env=_env()
    )
    assert resumed.returncode == 0, resumed.stderr.decode()[-3000:]
    _guarantee(slow_fake, faults=1)
    assert _artifact(runs, run_id) == setup.expected
