"""Nothing of a run outlives its owners (issue 39, item 3), with real drivers, a real ledger and a real Ray head:

* ``kill -9`` of the ledger's keeper and of the driver mid-run: within 60 s no process the driver started is left
  (the ledger's server, the keepers, the Ray head's processes, its workers), and the head's Ray files, kept in the
  runs folder, are removed (none under ``/tmp/ray``);
* the runs folder deleted under a running driver: one line naming it, exit 2 within about 10 s, and no provider
  call arrives once the driver has noticed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from punchline.cluster.keeper import cmdline, stat_fields
from punchline.cluster.local_ray import ray_dir
from punchline.cluster.local_redis import redis_dir
from punchline.cluster.ray_keeper import HeadRecord, read_head, session_processes
from punchline.cluster.redis_folder import recorded_pid
from punchline.workers.fake.server import FakeProviderServer
from tests.cluster.conftest import driver_argv
from tests.cluster.test_faults import ROOT, wait_for
from tests.cluster.test_prompts_pipeline import ROWS, prompts_config

pytestmark = pytest.mark.slow

LINGER_S = 20.0  # PUNCHLINE_LOCAL_RAY_LINGER_S's default: the head's keeper waits this long before stopping it
GONE_WITHIN_S = 60.0


def _alive(pid: int) -> bool:
    fields = stat_fields(pid)
    return bool(fields) and fields[0] not in ("Z", "X")


def _descendants(root: int) -> set[int]:
    """Every live process under ``root`` (its children, theirs...), from /proc."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = stat_fields(int(entry.name))
            if len(fields) > 1 and fields[0] not in ("Z", "X"):
                parent[int(entry.name)] = int(fields[1])
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, ppid in parent.items() if ppid in frontier} - found
        found |= frontier
    return found


def _ledger_keeper(runs: Path) -> int:
    folder = str(redis_dir(runs))
    return next(
        pid
        for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
        if "punchline.cluster.redis_keeper" in cmdline(pid) and folder in cmdline(pid) and _alive(pid)
    )


def _head(runs: Path) -> HeadRecord | None:
    heads = [read_head(f) for f in ray_dir(runs).glob("*") if f.is_dir()]
    return next((h for h in heads if h is not None), None)


def _ray_workers_calling(runs: Path, proc: subprocess.Popen[bytes]) -> bool:
    head = _head(runs)
    titles = [" ".join(cmdline(p)) for p in session_processes(head.pid)] if head is not None else []
    return any(t.startswith("ray::ShardWorker.work") for t in titles) or proc.poll() is not None


def _start_run(tmp_path: Path, fake: FakeProviderServer, monkeypatch: pytest.MonkeyPatch) -> subprocess.Popen[bytes]:
    """A default local run (the runs folder's ledger and Ray head) with Ray's workers calling when it returns."""
    cfg = prompts_config(tmp_path, fake, rows=ROWS, shard_size=4)
    fake.configure(latency_ms_min=600, latency_ms_max=900)  # Ray's workers join before the run is over
    monkeypatch.setenv("PUNCHLINE_LOCAL_RAY_CPU_SHARE", "0")  # ... asked to, beside the driver's own worker
    monkeypatch.setenv("PUNCHLINE_LOCAL_RAY_LINGER_S", str(LINGER_S))
    proc = subprocess.Popen(
        driver_argv(cfg, "owned", tmp_path), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    wait_for(lambda: _ray_workers_calling(tmp_path / "runs", proc), timeout_s=300)
    time.sleep(1.0)  # the Ray workers' first calls are in flight
    assert proc.poll() is None, f"the run ended early: {proc.stderr.read().decode()[-2000:]}"  # type: ignore[union-attr]
    return proc


def test_kill_9_of_the_ledgers_keeper_and_the_driver_leaves_nothing_running(
    tmp_path: Path, fake: FakeProviderServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = tmp_path / "runs"
    proc = _start_run(tmp_path, fake, monkeypatch)
    try:
        head = _head(runs)
        assert head is not None
        session = Path(head.session_dir)
        assert session.is_relative_to(ray_dir(runs)) and any(session.glob("session_*/logs"))  # Ray's files: ours
        server, keeper = recorded_pid(redis_dir(runs)), _ledger_keeper(runs)
        owned = _descendants(proc.pid)  # the driver's worker, both keepers, the server, the head and its workers
        assert {server, keeper, head.pid} <= owned and len(owned & set(session_processes(head.pid))) > 3
        os.kill(keeper, signal.SIGKILL)
        os.kill(proc.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        proc.wait()
        wait_for(lambda: not _alive(server), timeout_s=GONE_WITHIN_S)
        server_s = time.monotonic() - killed_at
        wait_for(lambda: not any(_alive(p) for p in owned), timeout_s=GONE_WITHIN_S)
        all_s = time.monotonic() - killed_at
        print(f"server gone {server_s:.2f} s, every process {all_s:.1f} s after the kill -9")
        assert server_s < 5.0, "the ledger's server outlived its keeper"
        wait_for(lambda: not session.exists(), timeout_s=10)
        assert not list(Path("/tmp/ray").glob(f"session_*_{head.pid}")), "the head wrote to /tmp/ray"
        if head.short_dir:  # the short link Ray was given for a long runs folder: gone with the files
            assert not Path(head.short_dir).exists()
    finally:
        for pid in _descendants(proc.pid) if proc.poll() is None else ():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait()


def test_a_runs_folder_deleted_under_a_running_driver_stops_it_with_one_line(
    tmp_path: Path, fake: FakeProviderServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = tmp_path / "runs"
    proc = _start_run(tmp_path, fake, monkeypatch)
    arrivals: list[tuple[float, int]] = []  # (when, calls so far), sampled while the driver stops
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            arrivals.append((time.monotonic(), fake.stats().total_calls))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        owned = _descendants(proc.pid)
        shutil.rmtree(runs)  # `rm -rf runs` under the run
        deleted_at = time.monotonic()
        _, err = proc.communicate(timeout=120)
        exit_s = time.monotonic() - deleted_at
        time.sleep(3.0)  # calls that would still come
    finally:
        sampling.set()
        sampler.join()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = [ln for ln in err.decode().splitlines() if ln.startswith("punchline:")]
    print(f"exit {proc.returncode} {exit_s:.1f} s after the delete: {lines}")
    assert proc.returncode == 2 and len(lines) == 1, err.decode()[-3000:]
    assert str(runs) in lines[0] and "deleted" in lines[0]
    assert exit_s < 15.0
    rises = [t for (t, n), (_, before) in zip(arrivals[1:], arrivals, strict=False) if n > before]
    last_arrival = max(rises, default=deleted_at)
    assert last_arrival - deleted_at < 2.0, f"a call arrived {last_arrival - deleted_at:.1f} s after the delete"
    wait_for(lambda: not any(_alive(p) for p in owned), timeout_s=GONE_WITHIN_S)  # the keepers stop what was left
