"""Asking the cluster autoscaler for worker nodes while a stage has more work than workers.

The worker pool pins ``workers_per_node`` actors to every alive node (hard node affinity), so its
actors never create demand for a node that does not exist yet: left alone, Ray's autoscaler would
keep the cluster at its minimum however many shards wait. While a stage has more pending shards
than live workers, the coordinator therefore asks for the nodes those shards could use through
``ray.autoscaler.sdk.request_resources``: one bundle the size of a worker node per node wanted
(a request is a floor for the cluster's total capacity, so it counts the nodes already there),
at most ``max_workers`` of them, like the launcher's and KubeRay's ``max_workers``/``maxReplicas``.
Nodes that join get workers at the pool's next reconcile. When the stage no longer has more
pending shards than workers the request is withdrawn (an empty request), so the autoscaler may
remove nodes once they are idle, i.e. once the run's workers on them have stopped at the end of
the run; its ``idle_timeout`` decides when.

``request_resources`` and the node listing are passed in, so tests drive this with a fake SDK.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import msgspec
import structlog

from punchline.cluster.ray_cluster.ray_runtime import alive_nodes
from punchline.data.settings import MAX_WORKERS, WORKER_NODE_CPUS, EnvVar, env_values, overlay

log = structlog.get_logger("punchline.autoscale")


class RequestResources(Protocol):
    """The shape of ``ray.autoscaler.sdk.request_resources`` we use."""

    def __call__(self, *, bundles: list[dict[str, float]]) -> Any: ...


class AutoscaleSettings(msgspec.Struct, frozen=True, kw_only=True):
    """``max_workers``: the most worker nodes a run asks the autoscaler for (0: never ask, e.g. a
    fixed-size or local cluster). ``node_cpus``: the CPUs of one worker node, the bundle size asked
    for per node (default: the largest alive worker node's)."""

    max_workers: int = MAX_WORKERS.default
    node_cpus: float | None = WORKER_NODE_CPUS.default

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AutoscaleSettings:
        """``PUNCHLINE_MAX_WORKERS``, ``PUNCHLINE_WORKER_NODE_CPUS`` over the defaults."""
        return cls(**env_values(AUTOSCALE_ENV, env))


AUTOSCALE_ENV: dict[str, EnvVar[Any]] = {"max_workers": MAX_WORKERS, "node_cpus": WORKER_NODE_CPUS}


def run_settings(max_workers: int, flag: int | None, env: Mapping[str, str] | None = None) -> AutoscaleSettings:
    """``[run] max_workers`` under ``PUNCHLINE_MAX_WORKERS`` under ``--max-workers`` (each range-checked
    where it is read: the config by its Struct, the variable by its EnvVar, the flag by the preflight)."""
    configured = overlay(AutoscaleSettings(max_workers=max_workers), **env_values(AUTOSCALE_ENV, env))
    return overlay(configured, max_workers=flag)


def ray_request_resources() -> RequestResources:
    from ray.autoscaler.sdk import request_resources  # lazy: ray takes seconds to import

    return request_resources


def ray_worker_node_cpus() -> list[float]:
    return [n.cpus for n in alive_nodes() if n.cpus > 0]


class Autoscaler:
    """Turns "pending shards vs live workers" into autoscaler requests, sending only changes."""

    def __init__(
        self,
        settings: AutoscaleSettings,
        *,
        per_node: int,
        request_resources: RequestResources,
        worker_node_cpus: Callable[[], list[float]],
        fallback_node_cpus: float = 1.0,
    ) -> None:
        self.settings = settings
        self.per_node = max(1, per_node)
        self.request_resources = request_resources
        self.worker_node_cpus = worker_node_cpus
        self.fallback_node_cpus = fallback_node_cpus
        self.requested_nodes = 0  # what the autoscaler was last told
        self.requests = 0

    @property
    def enabled(self) -> bool:
        return self.settings.max_workers > 0

    def wanted_nodes(self, pending_shards: int, live_workers: int) -> int:
        if pending_shards <= live_workers:
            return 0
        return min(self.settings.max_workers, math.ceil(pending_shards / self.per_node))

    def update(self, *, pending_shards: int, live_workers: int) -> None:
        """Called by the coordinator as a stage runs."""
        if not self.enabled:
            return
        wanted = self.wanted_nodes(pending_shards, live_workers)
        if wanted == self.requested_nodes:
            return
        if wanted == 0:
            self.release()
            return
        cpus = self.settings.node_cpus or max(self.worker_node_cpus(), default=self.fallback_node_cpus)
        self._send([{"CPU": float(cpus)}] * wanted)
        self.requested_nodes = wanted
        log.info("autoscale_request", nodes=wanted, node_cpus=cpus, pending_shards=pending_shards, workers=live_workers)

    def release(self) -> None:
        """Withdraw the request (the stage drained, or the run ends)."""
        if not self.enabled or self.requested_nodes == 0:
            return
        self._send([])
        self.requested_nodes = 0
        log.info("autoscale_release")

    def _send(self, bundles: list[dict[str, float]]) -> None:
        self.requests += 1
        try:
            self.request_resources(bundles=bundles)
        except Exception as exc:  # a hint to the autoscaler must never stop the run
            log.warning("autoscale_request_failed", error=str(exc)[:300])


def for_run(
    max_workers: int, per_node: int, worker_cpus: float, *, flag: int | None, request_resources: RequestResources | None
) -> Autoscaler:
    """The run's autoscaler: ``[run] max_workers`` under ``PUNCHLINE_MAX_WORKERS`` under ``--max-workers``;
    Ray's own SDK unless a ``request_resources`` is given (tests pass a fake)."""
    settings = run_settings(max_workers, flag)
    return Autoscaler(
        settings,
        per_node=per_node,
        request_resources=request_resources or ray_request_resources(),
        worker_node_cpus=ray_worker_node_cpus,
        fallback_node_cpus=max(per_node * worker_cpus, 1.0),
    )
