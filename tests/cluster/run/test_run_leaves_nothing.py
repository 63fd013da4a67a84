"""Nothing of a run outlives its owners (issue 39, item 3), with real drivers, a real ledger and a real Ray head:

* ``kill -9`` of the driver and of the ledger's keeper, or of both keepers (the ledger's and the Ray head's), mid-run:
  within 60 s no process the driver started is left (the ledger's server, the keepers, every process of the Ray
  head's session, its workers), the head's Ray files, kept in the runs folder, are removed (none under
  ``/tmp/ray``), and a resume then finishes;
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

from punchline.services.keeper import cmdline, stat_fields
from punchline.services.local_ray import ray_dir
from punchline.services.local_redis import redis_dir
from punchline.services.ray_keeper import HeadRecord, read_head, session_processes
from punchline.services.redis_folder import recorded_pid
from punchline.workers.fake.server import FakeProviderServer
from tests.cluster.run.test_faults import ROOT, wait_for
from tests.fixtures.engine import driver_argv
from tests.pipelines.prompts.test_prompts_pipeline import ROWS, _check_outputs, _outputs, prompts_config

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


def _keeper(module: str, folder: Path) -> int:
    """The keeper of ``folder`` (``python -m module FOLDER --start ...``)."""
    return next(
        pid
        for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
        if {module, str(folder), "--start"} <= set(cmdline(pid)) and _alive(pid)
    )


def _ends(pids: set[int], since: float, within_s: float) -> dict[int, float]:
    """Seconds from ``since`` to the end of each of ``pids`` (looked at every 0.1 s); one still alive after
    ``within_s`` is left out."""
    ended: dict[int, float] = {}
    deadline = since + within_s
    while len(ended) < len(pids) and time.monotonic() < deadline:
        now = time.monotonic()
        ended |= {pid: now - since for pid in pids - ended.keys() if not _alive(pid)}
        time.sleep(0.1)
    return ended


def _head(runs: Path) -> HeadRecord | None:
    heads = [read_head(f) for f in ray_dir(runs).glob("*") if f.is_dir()]
    return next((h for h in heads if h is not None), None)


def _ray_workers_calling(runs: Path, proc: subprocess.Popen[bytes]) -> bool:
    head = _head(runs)
    titles = [" ".join(cmdline(p)) for p in session_processes(head.pid)] if head is not None else []
    return any(t.startswith("ray::ShardWorker.work") for t in titles) or proc.poll() is not None


def _run_argv(tmp_path: Path, fake: FakeProviderServer, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A default local run (the runs folder's ledger and Ray head), slow enough for Ray's workers to join it."""
    cfg = prompts_config(tmp_path, fake, rows=ROWS, shard_size=4)
    fake.configure(latency_ms_min=600, latency_ms_max=900)  # Ray's workers join before the run is over
    monkeypatch.setenv("PUNCHLINE_LOCAL_RAY_CPU_SHARE", "0")  # ... asked to, beside the driver's own worker
    monkeypatch.setenv("PUNCHLINE_LOCAL_RAY_LINGER_S", str(LINGER_S))
    return driver_argv(cfg, "owned", tmp_path)


def _start_run(tmp_path: Path, argv: list[str]) -> subprocess.Popen[bytes]:
    """:func:`_run_argv`'s run, with Ray's workers calling when it returns."""
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_for(lambda: _ray_workers_calling(tmp_path / "runs", proc), timeout_s=300)
    time.sleep(1.0)  # the Ray workers' first calls are in flight
    assert proc.poll() is None, f"the run ended early: {proc.stderr.read().decode()[-2000:]}"  # type: ignore[union-attr]
    return proc


@pytest.mark.parametrize("keepers", [["ledger"], ["ledger", "head"]])
def test_kill_9_of_the_keepers_and_the_driver_leaves_nothing_running(
    tmp_path: Path, fake: FakeProviderServer, monkeypatch: pytest.MonkeyPatch, keepers: list[str]
) -> None:
    """The ledger's keeper takes its server along at once; the head's keeper, killed too, takes the head along
    (else it stops it after the linger, as no driver is left); a resume then starts what it needs again."""
    runs = tmp_path / "runs"
    argv = _run_argv(tmp_path, fake, monkeypatch)
    proc = _start_run(tmp_path, argv)
    try:
        head = _head(runs)
        assert head is not None
        session = Path(head.session_dir)
        assert session.is_relative_to(ray_dir(runs)) and any(session.glob("session_*/logs"))  # Ray's files: ours
        server = recorded_pid(redis_dir(runs))
        killed = {"ledger": _keeper("punchline.services.redis_keeper", redis_dir(runs))}
        killed["head"] = _keeper("punchline.services.ray_keeper", session.parent)
        head_processes = set(session_processes(head.pid))
        titles = {pid: " ".join(Path(a).name for a in cmdline(pid)[:3])[:40] for pid in head_processes}
        owned = _descendants(proc.pid)  # the driver's worker, both keepers, the server, the head and its workers
        assert {server, *killed.values(), head.pid} <= owned and len(owned & head_processes) > 3
        for name in keepers:
            os.kill(killed[name], signal.SIGKILL)
        os.kill(proc.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        proc.wait()
        ended = _ends(owned | head_processes, killed_at, GONE_WITHIN_S)
        said = sorted((s, titles[p]) for p, s in ended.items() if p in head_processes)
        print(f"killed the {' and '.join(keepers)} keepers: server gone {ended.get(server, -1):.2f} s after, the")
        print(f"head's processes {[f'{s:.1f} s {t}' for s, t in said]}, every process {max(ended.values()):.1f} s")
        assert set(ended) == owned | head_processes, "a process of the run outlived its owners by 60 s"
        assert ended[server] < 5.0, "the ledger's server outlived its keeper"
        if "head" in keepers:
            assert max(ended[p] for p in head_processes) < 15.0, "the Ray head outlived its keeper"
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
    resumed = subprocess.run(argv, cwd=ROOT, capture_output=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr.decode()[-3000:]
    jsonl, _ = _outputs(tmp_path, "store", "owned")
    _check_outputs(jsonl)


def test_a_runs_folder_deleted_under_a_running_driver_stops_it_with_one_line(
    tmp_path: Path, fake: FakeProviderServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = tmp_path / "runs"
    proc = _start_run(tmp_path, _run_argv(tmp_path, fake, monkeypatch))
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
