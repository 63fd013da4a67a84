"""Whether a local run needs Ray: the driver's own worker's pace and CPU while it works a stage alone.

A local run starts with one worker, forked from the driver (cluster/run/local_worker.py). Ray's workers on the same
machine cost about a gigabyte of memory and a second of CPU each to start, and they help only when that one
worker is the bottleneck: when the rest of the stage would take long at its pace (``LOCAL_ALONE_S``) *and*
either its process is busy on a core (``CPU_BOUND_SHARE``: Python runs one core per process, so another process
adds CPU) or its window of calls in flight is below what the stage's providers allow (another worker adds
calls in flight). A worker waiting on a slow provider with every call place of the run-wide bound in use is
neither: more workers would wait with it, so Ray is never started for it (issue 32: "a local run that never
needs Ray starts none").
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from punchline.data.settings import LOCAL_RAY_CPU_SHARE

# the driver's own worker finishes a stage alone when it would take less than this (joining Ray and starting
# its workers costs about as much CPU on a small machine: a cached rerun is faster alone)
LOCAL_ALONE_S = 10.0
# how long the driver's own worker is watched before its pace (and its CPU) is trusted
PACE_WINDOW_S = 3.0
# the share of one core above which the worker's process is taken as busy on its CPU (PUNCHLINE_LOCAL_RAY_CPU_SHARE's
# default): a worker waiting on its calls uses well under it
CPU_BOUND_SHARE = LOCAL_RAY_CPU_SHARE.default


def process_cpu_s(pid: int) -> float | None:
    """The CPU seconds (user + system) a process has used, from /proc; None where there is no /proc (macOS)
    or the process is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except (OSError, IndexError):
        return None
    # after the command's closing parenthesis: state is field 3, utime 14 and stime 15 (1-based, man 5 proc)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class LocalPace:
    """The driver's own worker on one stage, from the first look at it (:meth:`see`): its pace in shards per
    second, its CPU share, and from them whether Ray's workers would make the stage shorter."""

    def __init__(
        self,
        pid: int | None,
        *,
        window: int,
        capacity: int,
        cores: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        cpu_s: Callable[[int], float | None] = process_cpu_s,
        cpu_bound_share: float | None = None,
    ) -> None:
        self.pid = pid
        self.window = window  # the worker's calls in flight at most
        self.capacity = capacity  # the stage's providers' calls in flight at most, together
        self.cores = cores if cores is not None else (os.cpu_count() or 1)
        self._clock = clock
        # None: PUNCHLINE_LOCAL_RAY_CPU_SHARE (checked with the environment before the run)
        self.cpu_bound_share = LOCAL_RAY_CPU_SHARE.get() if cpu_bound_share is None else cpu_bound_share
        self._cpu_s = cpu_s
        self._start: tuple[float, int, float | None] | None = None  # (time, shards done, CPU seconds)
        self._now: tuple[float, int, float | None] | None = None
        self.shards_left = 0
        self._wanted = False  # ray_helps said yes once: the head it started is joined (see ray_helps)

    def _cpu(self) -> float | None:
        return self._cpu_s(self.pid) if self.pid is not None else None

    def see(self, shards_done: int, shards_total: int) -> None:
        """Record a look at the stage's counters (the first look starts the watch)."""
        look = (self._clock(), shards_done, self._cpu())
        if self._start is None:
            self._start = look
        self._now = look
        self.shards_left = shards_total - shards_done

    def _watched_s(self) -> float:
        if self._start is None or self._now is None:
            return 0.0
        return self._now[0] - self._start[0]

    def alone_s(self) -> float | None:
        """How long the stage's missing shards take at the pace seen so far (None: watched too briefly)."""
        elapsed_s = self._watched_s()
        if elapsed_s < PACE_WINDOW_S or self._start is None or self._now is None:
            return None  # a worker's first shards are slow (its connections, the SDK's first call)
        pace = (self._now[1] - self._start[1]) / elapsed_s
        return self.shards_left / pace if pace > 0 else float("inf")

    def cpu_share(self) -> float | None:
        """The share of one core the worker's process used while watched (None: not known here)."""
        elapsed_s = self._watched_s()
        if elapsed_s < PACE_WINDOW_S or self._start is None or self._now is None:
            return None
        if self._start[2] is None or self._now[2] is None:
            return None
        return (self._now[2] - self._start[2]) / elapsed_s

    def ray_helps(self) -> bool:
        """Ray's workers would shorten the stage: long alone, and the worker is short of CPU or of call places.
        Where the CPU share cannot be read, a long stage is taken as needing help (as before this check).

        A yes holds for the rest of the stage while it stays long: the yes starts Ray's head, and a share that
        hovers at the bound would otherwise start a head and never join it (at 10^6 units at 0 ms: 764 MB of
        Ray's processes idle for the stage's 30 minutes)."""
        alone = self.alone_s()
        if alone is None or alone < LOCAL_ALONE_S:
            return False
        if not self._wanted:
            self._wanted = self._helps()
        return self._wanted

    def _helps(self) -> bool:
        if self.window < self.capacity:
            return True  # another worker adds calls in flight
        if self.cpu_bound_share == 0.0:
            return True  # asked for: every long stage
        share = self.cpu_share()
        return self.cores > 1 and (share is None or share >= self.cpu_bound_share)

    def why(self) -> dict[str, float | int | None]:
        """The figures behind :meth:`ray_helps`, for the log line that says whether Ray is started."""
        share = self.cpu_share()
        alone = self.alone_s()
        return {
            "alone_s": None if alone is None else round(alone, 1),
            "cpu_share": None if share is None else round(share, 2),
            "window": self.window,
            "capacity": self.capacity,
            "cores": self.cores,
        }
