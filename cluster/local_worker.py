"""The driver's own worker: the first shards are worked in the driver's process while Ray starts.

Why: a local Ray takes 10-16 s to start on a 2-core machine (its GCS, raylet, dashboard and agents
are processes that each import a large part of Ray), and its worker actors seconds more. A run
whose first provider call waits for all of that spends most of a small run starting. So a local
run plans its first stage and starts this worker in a thread *before* ``ray.init`` (which must run
on the main thread: Ray's core worker kills the process at the first ``ray.put`` from the main
thread after ``ray.init`` ran in another one), and the Ray actors join the same queue once they are
up.

It is one more worker, not a shortcut: the same :class:`~punchline.workers.shard_worker.ShardProcessor`
code path, claiming shards from the ledger's queue under leases with fencing tokens and committing
them the same way, so the exactly-once guarantee is the workers' own and holds whoever works a
shard. It works that one stage until the queue is drained (it keeps the driver's node busy while
the actors start, then shares the queue with them) or until :meth:`LocalWorker.stop`: then it takes
no new unit, the calls in flight finish and their answers are kept, and its unfinished shards go
back to the queue (their paid answers stay in the response cache, so nothing is paid twice).
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading

import structlog

from punchline.data.units import StagePlan
from punchline.workers.driver_watch import DriverWatch
from punchline.workers.shard_worker import WorkerConfig, WorkerReport, build_processor

log = structlog.get_logger("punchline.local_worker")


class _StoppableWatch(DriverWatch):
    """The worker's watch of its driver (the process it runs in) that the driver can also end:
    a stop reads as "driver gone", so the worker winds down the way it does when its driver dies."""

    def __init__(self, client: object, run_id: str, claim: str | None) -> None:
        super().__init__(client, run_id, claim)
        self.stopped = False

    def process_gone(self) -> bool:
        return self.stopped or super().process_gone()


class LocalWorker:
    """Works one stage's shards in a thread of this process (see the module's docstring)."""

    def __init__(self, cfg: WorkerConfig, plan: StagePlan) -> None:
        self.cfg = cfg
        self.plan = plan
        self.worker_id = f"driver@{socket.gethostname()}:{os.getpid()}"
        self.report: WorkerReport | None = None
        self._collected = False
        self._watch: _StoppableWatch | None = None
        self._stop_asked = False
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="punchline-local-worker", daemon=True)

    @property
    def stage(self) -> str:
        return self.plan.stage

    def start(self) -> LocalWorker:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            processor = build_processor(self.cfg, self.worker_id)
            self._watch = processor.driver = _StoppableWatch(processor.driver.r, self.cfg.run_id, self.cfg.driver_claim)
            self._watch.stopped = self._stop_asked
            self._ready.set()
            log.info("local_worker_start", run_id=self.plan.run_id, stage=self.plan.stage, worker=self.worker_id)
            self.report = asyncio.run(processor.work(self.plan))
        except Exception as exc:  # the Ray workers carry on: this one is only a head start
            log.warning("local_worker_failed", stage=self.plan.stage, error=f"{type(exc).__name__}: {exc}"[:500])
        finally:
            self._ready.set()

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait until it has its connections and providers (or failed): what it needs the CPU for most."""
        return self._ready.wait(timeout_s)

    def running(self) -> bool:
        return self._thread.is_alive()

    def poll(self) -> list[WorkerReport]:
        """Its report, once, when it has ended (a failed worker reports nothing)."""
        if self._collected or self._thread.is_alive() or not self._thread.ident:
            return []
        self._collected = True
        return [self.report] if self.report is not None else []

    def stop(self, timeout_s: float = 60.0) -> None:
        """No new unit; wait (up to ``timeout_s``) for the calls in flight to finish and be committed."""
        self._stop_asked = True
        if self._watch is not None:
            self._watch.stopped = True
        if self._thread.ident:
            self._thread.join(timeout_s)
