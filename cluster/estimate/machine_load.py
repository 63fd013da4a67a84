"""How busy the machine is with other work, and how much longer that makes a run's own CPU time take.

Why: ``plan``'s wall-time estimate (``cluster/estimate/wall_estimate.py``) takes a run's fixed costs (Python's start,
the imports, plans, forks, reduces) from earlier runs or from defaults measured on a quiet machine, and those costs are
CPU time. With other processes running they stretch: the prompts demo, fresh, on 2 cores took 6.0-6.5 s alone, 8.1-8.2 s
beside 2 busy loops and 11.0-11.3 s beside 4 (session 13), so an estimate that ignored the load missed by up to 46 % on
a busy machine.

The measure is the kernel's count of runnable tasks now (``/proc/loadavg``'s fourth field, ``running/total``),
less the reader itself, averaged over a few samples: unlike the load average it is not a minute behind. It is the
whole machine's count, as :func:`os.cpu_count` is the whole machine's cores, so the two agree inside a container
too. The model, fitted to those runs: the run's CPU-bound parts take :func:`slowdown` times as long, ``1 + R /
(2 n)`` with ``R`` tasks runnable besides it on ``n`` cores (the run's own two busy processes, the driver and its
worker, share the cores with them), at most :data:`MAX_SLOWDOWN`.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

LOADAVG = Path("/proc/loadavg")
MAX_SLOWDOWN = 3.0  # past this the count says more about the moment it was read than about the run to come
SAMPLES = 5
SAMPLE_GAP_S = 0.02


def runnable_others(loadavg: Path = LOADAVG) -> float | None:
    """Tasks runnable on the machine now besides the one reading, None where the kernel does not say."""
    try:
        running = int(loadavg.read_text().split()[3].split("/")[0])
    except (OSError, IndexError, ValueError):
        return None
    return float(max(0, running - 1))


def sample_runnable(samples: int = SAMPLES, gap_s: float = SAMPLE_GAP_S, loadavg: Path = LOADAVG) -> float | None:
    """The mean of ``samples`` readings of :func:`runnable_others`, ``gap_s`` apart (one reading is a moment)."""
    seen: list[float] = []
    for i in range(samples):
        if i:
            time.sleep(gap_s)
        got = runnable_others(loadavg)
        if got is None:
            return None
        seen.append(got)
    return statistics.fmean(seen)


def slowdown(runnable: float | None, cores: int | None = None) -> float:
    """How many times as long a run's CPU-bound parts take beside ``runnable`` other tasks (None: unknown, 1)."""
    if runnable is None:
        return 1.0
    n = cores or os.cpu_count() or 1
    return min(MAX_SLOWDOWN, 1.0 + max(0.0, runnable) / (2 * n))
