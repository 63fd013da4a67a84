"""The driver's own worker: the first shards are worked by a process of the driver's while Ray starts.

Why: a local Ray takes 10-16 s to start on a 2-core machine (its GCS, raylet, dashboard and agents
are processes that each import a large part of Ray), and its worker actors seconds more. A run
whose first provider call waits for all of that spends most of a small run starting. So a local
run plans its first stage and starts this worker *before* ``ray.init``, and the Ray actors join the
same queue once they are up.

It is one more worker, not a shortcut: the same :class:`~punchline.workers.shard_worker.ShardProcessor`
code path, claiming shards from the ledger's queue under leases with fencing tokens and committing
them the same way, so the exactly-once guarantee is the workers' own and holds whoever works a
shard. It works that one stage until the queue is drained (it keeps the driver's node busy while
the actors start, then shares the queue with them) or until :meth:`LocalWorker.stop`: then it takes
no new unit, the calls in flight finish and their answers are kept, and its unfinished shards go
back to the queue (their paid answers stay in the response cache, so nothing is paid twice).

Why a child process and not a thread of the driver: a ``kill -9`` of the driver would take a thread's
calls in flight with it (paid, their answers lost, paid again by the resume). The child
(:mod:`punchline.workers.local_process`, in a session of its own) outlives its driver like the detached
Ray workers do: it drains the same way a stop does, then exits. This class keeps the thread's interface
(the coordinator starts, polls and stops it) and speaks to the child over its stdin and stdout.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
from typing import IO

import msgspec
import structlog

from punchline.data.units import StagePlan
from punchline.workers.local_process import MODULE, STOP_LINE, LocalJob, LocalMessage, read_frame, write_frame
from punchline.workers.shard_worker import WorkerConfig, WorkerReport

log = structlog.get_logger("punchline.local_worker")
STDERR_TAIL_BYTES = 2000  # of a failed child's stderr, in the warning that says it failed


class LocalWorker:
    """Works one stage's shards in a child process of this one (see the module's docstring)."""

    def __init__(self, cfg: WorkerConfig, plan: StagePlan) -> None:
        self.cfg = cfg
        self.plan = plan
        self.report: WorkerReport | None = None
        self.error = ""  # why the child failed, if it did
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None  # where the child's stray output goes
        self._collected = False
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, name="punchline-local-worker", daemon=True)

    @property
    def stage(self) -> str:
        return self.plan.stage

    @property
    def pid(self) -> int | None:
        """The child's process id (None: not started)."""
        return self._proc.pid if self._proc is not None else None

    def start(self) -> LocalWorker:
        """Start the child (a failure to is logged, not raised: the Ray workers carry on without it)."""
        job = msgspec.msgpack.encode(LocalJob(cfg=self.cfg, plan=self.plan))
        self._stderr = tempfile.NamedTemporaryFile(prefix="punchline-local-worker-", suffix=".err")  # noqa: SIM115
        try:
            # its own session: neither a kill -9 of the driver nor Ctrl-C's SIGINT to the driver's process
            # group ends it, so the calls it has in flight finish and are committed
            self._proc = subprocess.Popen(
                [sys.executable, "-m", MODULE],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                start_new_session=True,
                close_fds=True,
            )
            assert self._proc.stdin is not None
            write_frame(self._proc.stdin, job)
        except OSError as exc:
            self._failed(f"{type(exc).__name__}: {exc}")
            self._ready.set()
            return self
        self._reader.start()
        return self

    def _failed(self, error: str) -> None:
        self.error = error
        log.warning("local_worker_failed", stage=self.plan.stage, error=error[:500])

    def _read(self) -> None:
        """The child's messages: ready, then its report (or why it failed); the end of its stdout ends it."""
        assert self._proc is not None and self._proc.stdout is not None
        decoder = msgspec.msgpack.Decoder(LocalMessage)
        try:
            while (raw := read_frame(self._proc.stdout)) is not None:
                message = decoder.decode(raw)
                if message.kind == "ready":
                    log.info("local_worker_ready", stage=self.plan.stage, pid=self._proc.pid)
                    self._ready.set()
                elif message.kind == "report":
                    self.report = message.report
                else:
                    self.error = message.error  # the child logged it to the run's log already
            code = self._proc.wait()
            if self.report is None and not self.error:
                self._failed(f"the worker process ended ({code}) without a report: {self._stderr_tail()}")
        finally:
            self._ready.set()

    def _stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        try:
            with open(self._stderr.name, "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - STDERR_TAIL_BYTES))
                return f.read().decode(errors="replace").strip()
        except OSError:
            return ""

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait until it has its connections and providers (or failed): what it needs the CPU for most."""
        return self._ready.wait(timeout_s)

    def running(self) -> bool:
        return self._proc is not None and (self._proc.poll() is None or self._reader.is_alive())

    def poll(self) -> list[WorkerReport]:
        """Its report, once, when it has ended (a failed worker reports nothing)."""
        if self._collected or self._proc is None or self.running():
            return []
        self._collected = True
        return [self.report] if self.report is not None else []

    def stop(self, timeout_s: float = 60.0) -> None:
        """No new unit; wait (up to ``timeout_s``) for the calls in flight to finish and be committed.

        Past ``timeout_s`` the child is left to finish them on its own (it exits when it has)."""
        if self._proc is None:
            return
        stdin = self._proc.stdin
        if stdin is not None and not stdin.closed:
            try:
                stdin.write(STOP_LINE)
                stdin.close()
            except OSError:  # it has ended already
                pass
        try:
            self._proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("local_worker_still_draining", stage=self.plan.stage, pid=self._proc.pid, waited_s=timeout_s)
            return
        self._reader.join(timeout_s)
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
