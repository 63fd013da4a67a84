"""When a local run starts Ray: the driver's own worker's pace and CPU decide (cluster/run/executors/local_pace.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from punchline.cluster.run.executors.local_pace import (
    CPU_BOUND_SHARE,
    LOCAL_ALONE_S,
    PACE_WINDOW_S,
    LocalPace,
    process_cpu_s,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.cpu = 5.0

    def __call__(self) -> float:
        return self.now


def watched(*, cpu_per_s: float, shards_per_s: float, total: int, window: int = 16, capacity: int = 16,
            cores: int = 2, cpu_known: bool = True) -> LocalPace:  # fmt: skip
    clock = Clock()
    pace = LocalPace(
        1234, window=window, capacity=capacity, cores=cores, clock=clock,
        cpu_s=lambda _pid: clock.cpu if cpu_known else None,
    )  # fmt: skip
    pace.see(0, total)
    for _ in range(4):  # four looks a second apart: past the pace window
        clock.now += 1.0
        clock.cpu += cpu_per_s
        done = int(shards_per_s * (clock.now - 100.0))
        pace.see(done, total)
    return pace


def test_a_worker_waiting_on_its_calls_never_starts_ray() -> None:
    """A long stage at a slow provider, its worker mostly idle: more workers would wait with it."""
    pace = watched(cpu_per_s=0.4, shards_per_s=1.0, total=1000)
    assert pace.alone_s() is not None and pace.alone_s() > LOCAL_ALONE_S
    assert pace.cpu_share() is not None and abs(pace.cpu_share() - 0.4) < 1e-9
    assert not pace.ray_helps()


def test_a_worker_short_of_cpu_on_a_long_stage_starts_ray() -> None:
    pace = watched(cpu_per_s=0.97, shards_per_s=1.0, total=1000)
    assert pace.cpu_share() is not None and pace.cpu_share() >= CPU_BOUND_SHARE
    assert pace.ray_helps()
    assert pace.why()["cpu_share"] == 0.97


def test_a_short_stage_ends_alone_however_busy() -> None:
    pace = watched(cpu_per_s=1.0, shards_per_s=10.0, total=45)  # 5 shards left at 10/s: 0.5 s
    assert pace.alone_s() is not None and pace.alone_s() < LOCAL_ALONE_S
    assert not pace.ray_helps()


def test_a_window_below_the_providers_bound_starts_ray_even_when_idle() -> None:
    """Several providers allow more calls in flight together than one worker's window holds."""
    pace = watched(cpu_per_s=0.2, shards_per_s=1.0, total=1000, window=8, capacity=24)
    assert pace.ray_helps()


def test_one_core_gains_nothing_from_more_processes() -> None:
    pace = watched(cpu_per_s=0.99, shards_per_s=1.0, total=1000, cores=1)
    assert not pace.ray_helps()


def test_no_cpu_figure_keeps_the_old_rule() -> None:
    """Where /proc is missing, a long stage starts Ray (the rule before the CPU check)."""
    pace = watched(cpu_per_s=0.0, shards_per_s=1.0, total=1000, cpu_known=False)
    assert pace.cpu_share() is None
    assert pace.ray_helps()


def test_nothing_is_decided_before_the_pace_window() -> None:
    clock = Clock()
    pace = LocalPace(1, window=16, capacity=16, clock=clock, cpu_s=lambda _pid: 0.0)
    pace.see(0, 1000)
    clock.now += PACE_WINDOW_S / 2
    pace.see(0, 1000)
    assert pace.alone_s() is None and pace.cpu_share() is None and not pace.ray_helps()


def test_process_cpu_s_reads_a_busy_and_an_idle_process() -> None:
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\ntime.sleep(30)"
    busy = subprocess.Popen([sys.executable, "-c", spin])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        deadline = time.monotonic() + 60
        while (process_cpu_s(busy.pid) or 0.0) < 0.6 and time.monotonic() < deadline:
            time.sleep(0.1)
        busy_s, idle_s = process_cpu_s(busy.pid), process_cpu_s(idle.pid)
        assert busy_s is not None and busy_s >= 0.6
        assert idle_s is not None and idle_s < busy_s
        assert process_cpu_s(os.getpid()) is not None
    finally:
        busy.kill()
        idle.kill()
        busy.wait()
        idle.wait()
    assert process_cpu_s(busy.pid) is None  # gone


def test_a_yes_holds_while_the_stage_is_long_and_not_once_it_is_short() -> None:
    """A share that crosses the bound and falls back below it: the head the yes started is still joined (a share
    hovering at the bound started a head and never used it); a stage about to end gains nothing from joining."""
    clock = Clock()
    pace = LocalPace(1234, window=16, capacity=16, cores=2, clock=clock, cpu_s=lambda _pid: clock.cpu)
    pace.see(0, 1000)
    for cpu_per_s in (0.97, 0.97, 0.97, 0.97):  # busy: past the pace window at 0.97 of a core
        clock.now += 1.0
        clock.cpu += cpu_per_s
        pace.see(int(clock.now - 100.0), 1000)
    assert pace.ray_helps()
    for _ in range(20):  # then mostly idle: its share over the watch falls below the bound
        clock.now += 1.0
        clock.cpu += 0.2
        pace.see(int(clock.now - 100.0), 1000)
    share = pace.cpu_share()
    assert share is not None and share < CPU_BOUND_SHARE
    assert pace.ray_helps()
    assert not watched(cpu_per_s=0.4, shards_per_s=1.0, total=1000).ray_helps()  # the same share from the start: no
    pace.see(996, 1000)  # 4 shards left: a second or so alone
    assert not pace.ray_helps()
