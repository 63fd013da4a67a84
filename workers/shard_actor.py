"""The Ray actor around a :class:`~punchline.workers.shard_worker.ShardProcessor`: one per slot on a node, started
detached by the coordinator. Apart from the processor because only this part needs Ray (imported lazily: it
takes seconds), the driver's job record and the lifeguard that ends the actor once its driver is gone.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import msgspec

from punchline.data.stores.sentinel import ensure_sees
from punchline.data.units import (
    StagePlan,
)
from punchline.schedulers.server.redis_client import connect_async, resolve_url
from punchline.workers.driver_watch import DriverWatch, Lifeguard
from punchline.workers.logs import configure_logging
from punchline.workers.shard_worker import build_processor
from punchline.workers.worker_config import WorkerConfig, drain_bound_s


def _job_ended(job_id: str) -> bool:
    """Whether Ray has marked this job (the driver that created the worker) dead."""
    import ray._private.state  # lazy: ray takes seconds to import (the public job API needs the dashboard: GCS here)

    return any(j["JobID"] == job_id and j["IsDead"] for j in ray._private.state.jobs())


class ShardWorker:
    """Ray actor wrapper (decorated in :func:`worker_actor_class`). One per slot on a node.

    Started *detached* by the coordinator: a killed driver does not take it down, so the calls it has in
    flight finish and are committed; its :class:`Lifeguard` then ends it (``driver_watch.py``)."""

    def __init__(self, cfg_bytes: bytes, worker_id: str) -> None:
        import ray  # lazy: ray takes seconds to import; only the actor (inside Ray already) needs it

        cfg = msgspec.msgpack.decode(cfg_bytes, type=WorkerConfig)
        if cfg.log_path:
            configure_logging(None, console=False, json_path=cfg.log_path)
        self.worker_id = f"{worker_id}@{socket.gethostname()}:{os.getpid()}"
        self.running = 0  # work calls in progress
        # outside an actor (a test, a script) there is no job to watch, and asking for one would make Ray join
        # whatever cluster this machine last started
        job_id = ray.get_runtime_context().get_job_id() if ray.is_initialized() else None
        url = resolve_url(cfg.redis_url, cfg.redis_password_file)
        self.lifeguard = Lifeguard(
            lambda: DriverWatch(connect_async(url), cfg.run_id, cfg.driver_claim),
            busy=lambda: self.running > 0,
            leave=lambda: ray.get_runtime_context().current_actor.leave.remote(),
            owner_gone=lambda: job_id is not None and _job_ended(job_id),
            drain_s=drain_bound_s(cfg.providers),
            force=lambda: os._exit(0),  # a work call past the drain bound: exit_actor would wait for it
        ).start()
        self.processor = build_processor(cfg, self.worker_id)
        self.processor.driver.also = self.lifeguard.gone.is_set  # Ray's job record ends the work calls too
        ensure_sees(self.processor.store, cfg.store_sentinel, f"worker {self.worker_id}")

    async def work(self, plan_bytes: bytes) -> bytes:
        plan = msgspec.msgpack.decode(plan_bytes, type=StagePlan)
        self.running += 1
        try:
            report = await self.processor.work(plan)
        finally:
            self.running -= 1
        return msgspec.msgpack.encode(report)

    async def leave(self) -> None:
        """End this actor (its lifeguard calls it once the driver is gone and no work call is left)."""
        import ray  # lazy: ray takes seconds to import; only the actor (inside Ray already) needs it

        ray.actor.exit_actor()

    def ping(self) -> str:
        return self.worker_id


def worker_actor_class(max_concurrency: int = 64) -> Any:
    import ray  # lazy: ray takes seconds to import; only the actor (inside Ray already) needs it

    options: dict[str, Any] = {"max_restarts": 0, "max_task_retries": 0, "max_concurrency": max_concurrency}
    return ray.remote(**options)(ShardWorker)
