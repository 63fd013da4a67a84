"""The driver's own worker: the first shards are worked by a process of the driver's while Ray starts.

Why: a local Ray takes 10-16 s to start on a 2-core machine (its GCS, raylet, dashboard and agents
are processes that each import a large part of Ray), and its worker actors seconds more. A run
whose first provider call waits for all of that spends most of a small run starting. So a local
run plans its first stage and starts this worker *before* ``ray.init`` (which stays on the driver's main
thread: Ray's core worker kills the process at the first ``ray.put`` from the main thread after ``ray.init``
ran in another one), and the Ray actors join the same queue once they are up.

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
Ray workers do: it drains the same way a stop does, then exits. It is forked while Ray is not in the driver
(as fast to start as the thread was: its modules and SDKs are imported already), else a fresh interpreter
(``local_process`` says why). This class keeps the thread's interface (the coordinator starts, polls and
stops it) and speaks to the child over two pipes.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import IO

import msgspec
import structlog

from punchline.data.units import StagePlan
from punchline.workers.local_process import (
    MODULE,
    STOP_LINE,
    LocalJob,
    LocalMessage,
    forked,
    read_frame,
    write_frame,
)
from punchline.workers.shard_worker import WorkerConfig, WorkerReport

log = structlog.get_logger("punchline.local_worker")
STDERR_TAIL_BYTES = 2000  # of a failed child's stderr, in the warning that says it failed


def forkable() -> bool:
    """Whether the worker can be forked from this process: not once Ray is in it (a forked child would hold
    the driver's Ray sockets, so Ray would not see the driver die, and Ray's threads' locks)."""
    return hasattr(os, "fork") and "ray" not in sys.modules


class ForkWarmup:
    """The providers' SDKs (and the stages' ``warm_imports``) imported into the driver in the background, so
    that the workers it forks for the next stages have them already (a child imports an SDK in 1-3 s before its
    first call, on every stage: the demo's classify and evaluate workers waited that long each).

    Started once a stage's worker calls (it says so when it builds its first provider: a run whose answers are
    all cached imports none of it), with the SDKs only when a later stage calls too (a one-stage run would import
    an SDK into the driver for no fork: about a second of CPU and 50 MB for the anthropic kind's). :meth:`settle`
    before every later fork, since a fork while another thread imports would leave the child an import lock nobody
    releases. Only the thread that forks starts it."""

    def __init__(self, modules: list[str], *, when: Callable[[], bool] = forkable) -> None:
        self.modules = modules
        self.when = when  # whether the next workers will be forked (not once Ray is in this process)
        self._thread: threading.Thread | None = None

    def start(self, first: Sequence[str] = ()) -> None:
        """Import ``first`` (the SDKs a later stage's fork will want, if one will: the caller knows), then the
        modules given at construction, in a thread; once a run (later calls do nothing)."""
        if self._thread is None and self.when():
            self.modules = [*first, *(m for m in self.modules if m not in first)]
            if self.modules:
                self._thread = threading.Thread(target=self._import, name="punchline-fork-warmup", daemon=True)
                self._thread.start()

    def _import(self) -> None:
        for module in self.modules:
            try:
                importlib.import_module(module)
            except Exception as exc:  # the worker imports it itself, and says why it cannot
                log.debug("fork_warmup_failed", module=module, error=f"{type(exc).__name__}: {exc}")

    def settle(self, stage: str = "") -> None:
        """Wait for the imports to end (a fork must not happen during one); a wait is logged (it can last a second
        or two: matplotlib, an SDK), so the progress line says what the run waits for."""
        if self._thread is not None:
            if self._thread.is_alive():
                log.info("fork_warmup_settling", stage=stage, modules=len(self.modules))
            self._thread.join()


class _Child:
    """The worker process as the driver sees it: its pid, a pipe to its stdin and one from its stdout."""

    def __init__(self, pid: int, stdin: IO[bytes], stdout: IO[bytes], popen: subprocess.Popen[bytes] | None) -> None:
        self.pid = pid
        self.stdin = stdin
        self.stdout = stdout
        self.popen = popen

    @classmethod
    def spawn(cls, stderr: IO[bytes]) -> _Child:
        """A fresh interpreter (``python -m``): it imports the worker and the SDKs again (seconds)."""
        proc = subprocess.Popen(
            [sys.executable, "-m", MODULE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            start_new_session=True,  # see fork(): the same session of its own
            close_fds=True,
        )
        assert proc.stdin is not None and proc.stdout is not None
        return cls(proc.pid, proc.stdin, proc.stdout, proc)

    @classmethod
    def fork(cls, stderr: IO[bytes]) -> _Child:
        """A fork of this process: the worker's modules and the SDKs are imported already (no second start).
        In its own session: neither a kill -9 of the driver nor Ctrl-C's SIGINT to the driver's process
        group ends it, so the calls it has in flight finish and are committed."""
        job_r, job_w = os.pipe()
        out_r, out_w = os.pipe()
        with warnings.catch_warnings():  # Python 3.12+ warns of fork in a process with threads: the child
            warnings.simplefilter("ignore", DeprecationWarning)  # uses none of theirs (local_process.forked)
            pid = os.fork()
        if pid == 0:  # pragma: no cover (the child; it never returns)
            forked(job_r, out_w, stderr.fileno())
        os.close(job_r)
        os.close(out_w)
        return cls(pid, os.fdopen(job_w, "wb"), os.fdopen(out_r, "rb"), None)

    def wait(self) -> int:
        if self.popen is not None:
            return self.popen.wait()
        try:
            return os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        except ChildProcessError:  # reaped by someone else (a waitpid(-1) elsewhere in the process)
            return -1


class LocalWorker:
    """Works one stage's shards in a child process of this one (see the module's docstring)."""

    def __init__(self, cfg: WorkerConfig, plan: StagePlan) -> None:
        self.cfg = cfg
        self.plan = plan
        self.report: WorkerReport | None = None
        self.error = ""  # why the child failed, if it did
        self._child: _Child | None = None
        self._stderr: IO[bytes] | None = None  # where the child's stray output goes
        self._collected = False
        self._ready = threading.Event()
        self.calling = threading.Event()  # it built a provider: it pays for calls (the driver warms SDKs then)
        self._reader = threading.Thread(target=self._read, name="punchline-local-worker", daemon=True)

    @property
    def stage(self) -> str:
        return self.plan.stage

    @property
    def pid(self) -> int | None:
        """The child's process id (None: not started)."""
        return self._child.pid if self._child is not None else None

    def start(self) -> LocalWorker:
        """Start the child (a failure to is logged, not raised: the Ray workers carry on without it)."""
        job = msgspec.msgpack.encode(LocalJob(cfg=self.cfg, plan=self.plan))
        self._stderr = tempfile.TemporaryFile(prefix="punchline-local-worker-")  # noqa: SIM115 (no name: none left)
        forked = forkable()
        # its start (a fork, or a new interpreter importing the SDKs) can take a second or two: said, not silent
        log.info("local_worker_starting", stage=self.plan.stage, how="fork" if forked else "spawn")
        try:
            self._child = _Child.fork(self._stderr) if forked else _Child.spawn(self._stderr)
            write_frame(self._child.stdin, job)
        except OSError as exc:
            self._failed(f"{type(exc).__name__}: {exc}")
            self._ready.set()
            if self._child is None:
                return self
        self._reader.start()
        return self

    def _failed(self, error: str) -> None:
        self.error = error
        log.warning("local_worker_failed", stage=self.plan.stage, error=error[:500])

    def _read(self) -> None:
        """The child's messages: ready, then its report (or why it failed); the end of its stdout is its
        end (then it is reaped)."""
        assert self._child is not None
        decoder = msgspec.msgpack.Decoder(LocalMessage)
        try:
            while (raw := read_frame(self._child.stdout)) is not None:
                message = decoder.decode(raw)
                if message.kind == "ready":
                    log.info("local_worker_ready", stage=self.plan.stage, worker_pid=self._child.pid)
                    self._ready.set()
                elif message.kind == "calling":
                    self.calling.set()
                elif message.kind == "report":
                    self.report = message.report
                else:
                    self.error = message.error  # the child logged it to the run's log already
            code = self._child.wait()
            if self.report is None and not self.error:
                self._failed(f"the worker process ended ({code}) without a report: {self._stderr_tail()}")
        finally:
            self._child.stdout.close()
            self._ready.set()

    def _stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        try:
            fd = self._stderr.fileno()
            size = os.fstat(fd).st_size
            return os.pread(fd, STDERR_TAIL_BYTES, max(0, size - STDERR_TAIL_BYTES)).decode(errors="replace").strip()
        except (OSError, ValueError):  # closed by stop() meanwhile
            return ""

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait until it has its connections (or failed); its providers are built at their first call."""
        return self._ready.wait(timeout_s)

    def running(self) -> bool:
        return self._reader.is_alive()  # it ends once the child has ended and been reaped

    def poll(self) -> list[WorkerReport]:
        """Its report, once, when it has ended (a failed worker reports nothing)."""
        if self._collected or self._child is None or self.running():
            return []
        self._collected = True
        return [self.report] if self.report is not None else []

    def ask_stop(self) -> None:
        """No new unit, without waiting: the child drains and ends meanwhile (its stage is over: the driver
        reduces it while the child ends, instead of waiting for that before the next stage's worker)."""
        if self._child is None:
            return
        stdin = self._child.stdin
        if not stdin.closed:
            with contextlib.suppress(OSError):  # it has ended already
                stdin.write(STOP_LINE)
                stdin.flush()
            with contextlib.suppress(OSError):  # closed even when the flush fails
                stdin.close()

    def stop(self, timeout_s: float = 60.0) -> None:
        """No new unit; wait (up to ``timeout_s``) for the calls in flight to finish and be committed.

        Past ``timeout_s`` the child is left to finish them on its own (it exits when it has)."""
        if self._child is None:
            return
        self.ask_stop()
        self._reader.join(timeout_s)
        if self._reader.is_alive():
            log.warning(
                "local_worker_still_draining", stage=self.plan.stage, worker_pid=self._child.pid, waited_s=timeout_s
            )
            return
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
