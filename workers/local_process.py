"""The driver's own worker as a process of its own (``python -m punchline.workers.local_process``).

Why a process: the driver works a local run's first shards itself while Ray starts (cluster/run/local_worker.py
says why). In a thread of the driver, a ``kill -9`` of the driver took the calls in flight with it: paid
for, but their answers lost, so the resume paid them again. As a child process started in a session of its
own (``start_new_session``: neither a ``kill -9`` of the driver nor Ctrl-C's process-group SIGINT reaches
it), it outlives its driver the way the detached Ray workers do: it takes no new unit, lets the calls in
flight finish and commits them (response cache, then the leases), releases its unfinished shards, and exits.

Its driver is gone when its claim says so (:class:`~punchline.workers.driver_watch.DriverWatch`: the pid on
this machine, the run's claim anywhere), or when its end of the stdin pipe closes (the kernel closes it when
the driver dies, however it dies). A live driver stops it the same way, with a line on stdin (or SIGTERM):
the child drains exactly as it does for a dead driver.

The protocol, all msgspec and nothing on the command line (the Redis password stays in its 0600 file, as
``WorkerConfig.redis_password_file`` says; API keys stay in the environment the driver had):

* stdin: one frame (a 4-byte big-endian length, then a msgpack :class:`LocalJob`), then any line or EOF
  means "stop";
* stdout: frames of :class:`LocalMessage`: ``ready`` once the connections are built, ``calling`` when the
  first unit the cache cannot answer builds its provider (:mod:`punchline.workers.calls.lazy_provider`: a worker
  whose units are all cached imports no SDK), then ``report`` with the :class:`WorkerReport` (or ``failed``).

Two ways to start it, one body (:func:`serve`):

* **forked** from the driver (:func:`forked`), as long as Ray is not in the driver yet (a local run's first
  stage: the one whose first call is waited for). The child has the worker's modules imported already, and
  the providers' SDKs once the driver has warmed them (after a worker of the run called), so it is ready as
  fast as the thread it replaces (a fresh interpreter imports them again: 0.8 CPU-seconds for the worker's
  path, 1.4 for the openai SDK, 2.4 more for anthropic's, measured; the first call would be seconds later).
  It leaves the driver's files, sockets and log sinks behind first;
* **a fresh interpreter** (:func:`main`, ``python -m``) once Ray is in the driver: a fork would hold the
  driver's Ray sockets (Ray would not see the driver die) and inherit the locks of Ray's threads. It
  imports only the worker's path (``shard_worker``) and, at their first call, the SDKs of the providers its
  stage calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import socket
import struct
import sys
import threading
import traceback
from collections.abc import Coroutine
from typing import IO, Any, Literal, NoReturn

import msgspec
import structlog

from punchline.data.units import StagePlan
from punchline.workers.calls.lazy_provider import LazyProvider
from punchline.workers.driver_watch import DriverWatch
from punchline.workers.logs import configure_logging
from punchline.workers.shard_worker import WorkerConfig, WorkerReport, build_processor

MODULE = "punchline.workers.local_process"  # what the driver runs with ``python -m``
STOP_LINE = b"stop\n"
_HEADER = struct.Struct(">I")

log = structlog.get_logger("punchline.local_worker")


class LocalJob(msgspec.Struct, kw_only=True):
    """What the driver gives its worker process: the worker's config and the stage to work."""

    cfg: WorkerConfig
    plan: StagePlan


class LocalMessage(msgspec.Struct, kw_only=True):
    """What the worker process tells its driver: ``ready``, ``calling`` when it builds its first provider (it
    is about to pay for a call: the driver may warm the next workers' SDKs then), then ``report`` (or
    ``failed`` with why)."""

    kind: Literal["ready", "calling", "report", "failed"]
    worker_id: str = ""
    report: WorkerReport | None = None
    error: str = ""


def write_frame(stream: IO[bytes], payload: bytes) -> None:
    stream.write(_HEADER.pack(len(payload)) + payload)
    stream.flush()


def read_frame(stream: IO[bytes]) -> bytes | None:
    """The next frame, or None at the end of the stream (a short frame is an end too)."""
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(header)
    payload = stream.read(size)
    return payload if len(payload) == size else None


class StoppableWatch(DriverWatch):
    """The worker's watch of its driver that the driver can also end: a stop reads as "driver gone", so
    the worker winds down the way it does when its driver dies; ``asked`` says the driver asked (a stop line:
    its stage is over), so that a normal end is not logged as a gone driver."""

    def __init__(
        self, client: Any, run_id: str, claim: str | None, stop: threading.Event, asked: threading.Event | None = None
    ) -> None:
        super().__init__(client, run_id, claim)
        self.stop = stop
        self.asked = asked or threading.Event()

    def asked_to_stop(self) -> bool:
        return self.asked.is_set()

    def process_gone(self) -> bool:
        return self.stop.is_set() or super().process_gone()

    async def check(self) -> bool:
        self.gone = self.gone or self.stop.is_set()
        return await super().check()


def _wait_for_stop(stdin: IO[bytes], stop: threading.Event, asked: threading.Event) -> None:
    """A line (the driver's stop: ``asked``) or EOF (the driver is gone: the kernel closed its end) ends the work."""
    if stdin.readline():
        asked.set()
    stop.set()


def _send(out: IO[bytes], message: LocalMessage) -> None:
    with contextlib.suppress(OSError):  # the driver is gone (a broken pipe): the ledger and store have the rest
        write_frame(out, msgspec.msgpack.encode(message))


def run_to_end(work: Coroutine[Any, Any, WorkerReport]) -> WorkerReport:
    """``asyncio.run`` but for its last wait: it joins every thread of the loop's default executor, and in a child
    forked from the driver one may never end (a thread building an SDK client blocked on a lock, OpenSSL's, that a
    thread of the driver held at the fork: seen once, a worker done with its stage that never reported, and a run
    that waited for it). The loop's ``close`` lets such threads be; the forked child then reports and ends with
    ``os._exit``, which ends them all."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(work)
    finally:
        pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()  # the default executor is shut down without waiting for its threads


def serve(stdin: IO[bytes], out: IO[bytes]) -> int:
    """The worker process's life: read its job, build, say ready, work the stage, report; its exit code."""
    raw = read_frame(stdin)
    if raw is None:
        return 2
    try:
        job = msgspec.msgpack.decode(raw, type=LocalJob)
    except msgspec.ValidationError as exc:  # a driver of another version: say so, no traceback
        _send(out, LocalMessage(kind="failed", error=f"bad job: {exc}"[:500]))
        return 2
    configure_logging(None, console=False, json_path=job.cfg.log_path)
    worker_id = f"driver@{socket.gethostname()}:{os.getpid()}"
    stop, asked = threading.Event(), threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):  # drain, as for a stop line
        signal.signal(signum, lambda _signum, _frame: stop.set())
    threading.Thread(target=_wait_for_stop, args=(stdin, stop, asked), name="punchline-stop", daemon=True).start()
    try:
        calling = LocalMessage(kind="calling", worker_id=worker_id)
        processor = build_processor(
            job.cfg,
            worker_id,
            make=lambda name, settings: LazyProvider(name, settings, on_build=lambda: _send(out, calling)),
        )
        processor.driver = StoppableWatch(processor.driver.r, job.cfg.run_id, job.cfg.driver_claim, stop, asked)
        _send(out, LocalMessage(kind="ready", worker_id=worker_id))
        log.info("local_worker_start", run_id=job.plan.run_id, stage=job.plan.stage, worker=worker_id)
        report = run_to_end(processor.work(job.plan))
    except Exception as exc:  # the Ray workers carry on: this one is only a head start
        error = f"{type(exc).__name__}: {exc}"[:500]
        log.warning("local_worker_failed", stage=job.plan.stage, error=error)
        _send(out, LocalMessage(kind="failed", worker_id=worker_id, error=error))
        return 1
    log.info("local_worker_done", stage=job.plan.stage, driver_gone=report.driver_gone)
    _send(out, LocalMessage(kind="report", worker_id=worker_id, report=report))
    return 0


def main() -> int:
    """``python -m punchline.workers.local_process``: the job on stdin, frames on stdout."""
    out = os.fdopen(os.dup(1), "wb")  # frames own the real stdout; whatever a library prints goes to stderr
    os.dup2(2, 1)
    return serve(sys.stdin.buffer, out)


def forked(job_fd: int, out_fd: int, err_fd: int) -> NoReturn:
    """The same worker in a child just forked from the driver (before Ray: no Ray thread or socket to
    inherit), which has the worker's modules and the providers' SDKs imported already: no second start.

    It leaves everything of the driver's behind before it works: its session (its own, as above), its files
    and sockets (all closed but the two pipes and an error file: a lock or a connection the driver holds
    must not outlive the driver in here), its log sinks, and its stack: it never returns into the driver's
    code (whose ``finally`` blocks would stop the driver's services), it ends with ``os._exit``."""
    code = 70
    try:
        os.setsid()
        gc.freeze()  # the driver's objects are never collected here (their finalizers would close fds by number)
        configure_logging(None, console=False)  # the driver's log file closed before fds are renumbered
        os.dup2(err_fd, 1)  # in this order, whichever numbers the three had (all above 2: 0-2 were open)
        os.dup2(err_fd, 2)
        os.dup2(job_fd, 0)
        os.dup2(out_fd, 3)
        os.closerange(4, _max_fd())
        code = serve(os.fdopen(0, "rb"), os.fdopen(3, "wb"))
    except BaseException:
        with contextlib.suppress(BaseException):
            traceback.print_exc()
    finally:
        os._exit(code)


def _max_fd() -> int:
    try:
        return int(os.sysconf("SC_OPEN_MAX"))
    except (ValueError, OSError):
        return 65536


if __name__ == "__main__":
    sys.exit(main())
