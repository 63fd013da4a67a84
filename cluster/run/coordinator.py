"""The coordinator: plans a stage into shards in the store, has the stage's executor answer its units, then
runs the stage's reduce step and writes its manifest.

Which executor (:mod:`punchline.cluster.run.executor`) is chosen per stage: ``shards`` (workers, the driver's own
and Ray's, call the providers online: :mod:`punchline.cluster.run.executors.shards`) or ``batches`` (the provider
batch APIs first, in the driver, then the shards find the answers cached:
:mod:`punchline.cluster.run.executors.batches`). The coordinator neither knows nor records which one paid: both
leave the stage's shard files, and the reduce reads those.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Literal

import msgspec
import structlog

from punchline.cluster.pipeline import Stage, StageContext, pipeline_code
from punchline.cluster.ray_cluster.autoscale import Autoscaler
from punchline.cluster.run.executor import ProgressFn, RayStart, StageExecutor, executor_name, stage_providers
from punchline.cluster.run.executors.batches import BatchExecutor
from punchline.cluster.run.executors.shards import ShardExecutor
from punchline.data.storage.run_layout import RunLayout
from punchline.data.store import Store
from punchline.data.units import (
    PlanPage,
    ShardUsage,
    StageManifest,
    StagePlan,
    UnitSpec,
    cut,
    encode_page,
    plan_page_key,
)
from punchline.schedulers.ledger import Ledger
from punchline.workers.shard_worker import WorkerConfig

log = structlog.get_logger("punchline.coordinator")

LocalStart = Literal["working", "complete", "needs_ray"]  # what Coordinator.start_local did


def _noting_providers(units: Iterable[UnitSpec], into: set[str]) -> Iterator[UnitSpec]:
    """The units, unchanged, noting the providers they call into ``into`` on the way."""
    for unit in units:
        into.add(unit.request.provider)
        yield unit


class Coordinator:
    """Plans each stage into the store, has its executor answer it, then reduces it and writes its manifest."""

    def __init__(
        self,
        *,
        ctx: StageContext,
        ledger: Ledger,
        worker_cfg: WorkerConfig,
        shard_size: int,
        workers_per_node: int,
        worker_cpus: float,
        progress: ProgressFn | None = None,
        poll_s: float = 0.5,
        shards_per_page: int = 64,
        max_deaths_without_progress: int = 8,
        autoscaler: Autoscaler | None = None,
        local_first: bool = False,
        ray_start: RayStart | None = None,
        warm_imports: Sequence[str] = (),
        calls_later: Mapping[str, bool] | None = None,
    ) -> None:
        """``warm_imports``: modules the stages' reduces will import (:class:`Stage` says why); ``calls_later``:
        per stage, whether a later stage calls a provider (its worker is forked with the SDKs warmed then)."""
        self.ctx = ctx
        self.store: Store = ctx.store
        self.ledger = ledger
        self.worker_cfg = worker_cfg
        self.shard_size = shard_size
        self.shards_per_page = shards_per_page
        self.store_usage: dict[str, ShardUsage] = {}  # per stage, from its shard files (the store is the truth)
        # local_first: each stage starts with the driver's own worker too (start_local) until a Ray worker has
        # reported, so neither Ray's start nor its workers' start is waited for (a local run)
        self.local_first = local_first
        self._prepared: dict[str, tuple[StagePlan, list[str]]] = {}  # stages planned and queued by start_local
        self._providers_of: dict[str, set[str]] = {}  # per stage planned: the providers its units call
        self.shards = ShardExecutor(
            ctx=ctx,
            ledger=ledger,
            worker_cfg=worker_cfg,
            workers_per_node=workers_per_node,
            worker_cpus=worker_cpus,
            progress=progress,
            poll_s=poll_s,
            max_deaths_without_progress=max_deaths_without_progress,
            autoscaler=autoscaler,
            ray_start=ray_start,
            warm_imports=warm_imports,
            calls_later=calls_later,
        )
        self.batches = BatchExecutor(ctx=ctx, ledger=ledger, worker_cfg=worker_cfg, shards=self.shards)

    def executor(self, stage: Stage) -> StageExecutor:
        """The stage's executor: batches when one of the providers it sees is in batch mode (and the run pays)."""
        providers = stage_providers(self.worker_cfg.providers, self.ctx.cfg.stage_mode(stage.name))
        name = executor_name(providers, offline=self.worker_cfg.offline)
        return self.batches if name == "batches" else self.shards

    def start_local(self, stage: Stage) -> LocalStart:
        """Plan ``stage``, queue its missing shards and start working them in this process, before Ray
        is up (cluster/run/local_worker.py); ``run_stage`` then goes on from there. ``complete``: every shard is
        committed already (``run_stage`` only reduces: no Ray needed); ``needs_ray``: nothing started (its
        requests go through batch APIs first)."""
        if self.executor(stage).name != "shards":
            return "needs_ray"
        plan, first_ids = self.write_plan(stage)
        self._prepared[stage.name] = plan, first_ids
        return self.shards.start_local(plan, self._providers_of.get(stage.name, set()))

    def close(self) -> None:
        """Stop the run's workers (at the end of the run, or when a stage fails)."""
        self.shards.close()

    def manifest_key(self, stage: str) -> str:
        return RunLayout(self.ctx.run_id).manifest(stage)

    def stage_done(self, stage: str) -> bool:
        return self.store.exists(self.manifest_key(stage))

    def plugin_code(self, stage: Stage, step: str) -> contextlib.AbstractContextManager[None]:
        return pipeline_code(self.ctx.cfg.run.pipeline, stage, step)

    def run_stage(self, stage: Stage) -> tuple[list[str], dict[str, str]]:
        """Execute (or resume) one stage and reduce it: (artifact names written, failed unit -> reason)."""
        if stage.name not in self._prepared and self.local_first and not self.shards.pool_warm:
            self.start_local(stage)
        prepared = self._prepared.pop(stage.name, None)  # planned and queued by start_local, its worker at it
        plan, first_ids = prepared if prepared is not None else self.write_plan(stage)
        results = self.executor(stage).execute(stage, plan, first_ids, queued=prepared is not None)
        started = time.monotonic()  # a reduce may take seconds (reports, plots): the log says so, no silent gap
        log.info("reduce_start", run_id=self.ctx.run_id, stage=stage.name, units=plan.units_total)
        with self.plugin_code(stage, "reduce"):
            artifacts = stage.reduce(self.ctx, results)
        log.info("reduce_done", run_id=self.ctx.run_id, stage=stage.name, seconds=round(time.monotonic() - started, 3))
        failed = results.failed()
        self.store_usage[stage.name] = results.usage()
        manifest = StageManifest(
            stage=stage.name,
            units=plan.units_total,
            shards=plan.shards_total,
            failed=len(failed),
            artifacts=artifacts,
            usage=self.store_usage[stage.name],
        )
        if not failed:  # a stage with failed units is re-planned on resume / retry-failed
            self.store.put(self.manifest_key(stage.name), msgspec.json.encode(manifest))
        return artifacts, failed

    def write_plan(self, stage: Stage) -> tuple[StagePlan, list[str]]:
        """Stream the stage's units into plan pages in the store; the driver never holds the whole plan.

        A first pass only measures (count, digest, shard boundaries). If the store already has this exact
        plan, nothing is written; otherwise shards cut from another plan are dropped (an earlier stage was
        retried and its artifacts changed; the response cache keeps unchanged requests free) and a second
        pass writes the pages.
        """
        run_id = self.ctx.run_id
        started = time.monotonic()  # a large plan takes seconds to cut and write: the log says so
        log.info("plan_start", run_id=run_id, stage=stage.name)
        calls: set[str] = set()
        with self.plugin_code(stage, "plan"):
            shape = cut(
                stage.name, _noting_providers(stage.plan(self.ctx), calls), self.shard_size, self.shards_per_page
            )
        self._providers_of[stage.name] = calls
        plan = StagePlan(
            run_id=run_id,
            stage=stage.name,
            shard_size=self.shard_size,
            shards_per_page=self.shards_per_page,
            units_total=shape.units_total,
            shards_total=shape.shards_total,
            digest=shape.digest,
        )
        digest_key = RunLayout(run_id).plan_digest(stage.name)
        old = self.store.get(digest_key)
        if old is not None and old.decode() == plan.digest:
            log.info("plan_done", run_id=run_id, stage=stage.name, units=plan.units_total, written=False,
                     seconds=round(time.monotonic() - started, 3))  # fmt: skip
            return plan, shape.first_ids
        if old is not None:
            prefix = RunLayout(run_id).shards(stage.name)
            stale = list(self.store.list(prefix))
            for key in stale:
                self.store.delete(key)
            log.warning("plan_changed", run_id=run_id, stage=stage.name, dropped_shards=len(stale))

        def put(page: PlanPage) -> None:
            self.store.put(
                plan_page_key(run_id, stage.name, page.first_shard // self.shards_per_page), encode_page(page)
            )

        with self.plugin_code(stage, "plan"):
            cut(stage.name, stage.plan(self.ctx), self.shard_size, self.shards_per_page, on_page=put)
        self.store.put(digest_key, plan.digest.encode())
        log.info("plan_done", run_id=run_id, stage=stage.name, units=plan.units_total, written=True,
                 seconds=round(time.monotonic() - started, 3))  # fmt: skip
        return plan, shape.first_ids
