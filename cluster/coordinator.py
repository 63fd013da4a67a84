"""The coordinator: turns a stage into shards, keeps a worker on every node until every shard is
committed, then runs the stage's reduce step.

Elasticity is reconciliation, not events: every poll (0.5 s) it compares the nodes Ray reports alive
with the workers it has, starts workers on nodes that joined, replaces workers that died on nodes
that are still alive, and forgets those of nodes that left. Their shards come back to the queue
when their leases expire. Completion is decided by the store (every shard file present), never by
Redis alone, so a wiped Redis can only cost time, not results.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal

import msgspec
import structlog

from punchline.cluster.autoscale import Autoscaler
from punchline.cluster.local_worker import ForkWarmup, LocalWorker
from punchline.cluster.pipeline import Stage, StageContext, pipeline_code
from punchline.data.errors import BudgetExceeded, InfraError, PunchlineError
from punchline.data.response_cache import ResponseCache
from punchline.data.run_layout import RunLayout
from punchline.data.store import Store
from punchline.data.stores.sentinel import is_not_shared
from punchline.data.units import (
    PlanPage,
    ShardOutput,
    ShardResults,
    ShardUsage,
    StageManifest,
    StagePlan,
    UnitSpec,
    cut,
    encode_page,
    plan_page_key,
    shard_key,
)
from punchline.schedulers.ledger import Ledger, StageCounters, patiently
from punchline.workers.batch_runner import batch_mode, run_stage_batches, stage_providers
from punchline.workers.providers import IMPLEMENTATIONS
from punchline.workers.shard_worker import WorkerConfig, WorkerReport, worker_actor_class

log = structlog.get_logger("punchline.coordinator")

ProgressFn = Callable[[str, StageCounters], None]
LocalStart = Literal["working", "complete", "needs_ray"]  # what Coordinator.start_local did
# Connects this process to Ray once Ray is up (on the calling, the main, thread): True when connected.
# Called with wait=False while the driver's own worker has the stage in hand (never blocks then), with
# wait=True when nothing else can work the stage's missing shards.
RayStart = Callable[[bool], bool]
# while Ray is not joined yet: the driver's own worker finishes a stage alone when it would take less than this
# (joining Ray and starting its workers costs about as much CPU on a small machine: a cached rerun is faster alone)
LOCAL_ALONE_S = 10.0
# how long the driver's own worker is watched before its pace is trusted
PACE_WINDOW_S = 3.0
LOCAL_READY_WAIT_S = 15.0  # how long Ray's start waits for the driver's own worker to be ready to call


class _Slot(msgspec.Struct):
    node_id: str
    index: int
    actor: Any = None
    ref: Any = None


def _noting_providers(units: Iterable[UnitSpec], into: set[str]) -> Iterator[UnitSpec]:
    """The units, unchanged, noting the providers they call into ``into`` on the way."""
    for unit in units:
        into.add(unit.request.provider)
        yield unit


class WorkerPool:
    """Keeps ``per_node`` worker actors on each alive Ray node.

    The workers are detached actors: a driver killed with ``kill -9`` does not take them down with the
    calls they have in flight (paid for already); they finish and commit those, then end themselves
    (``workers/driver_watch.py``). Their names carry this pool's token, so a resumed driver's workers
    never meet a draining one's name; the plan goes by value (a ``ray.put`` object dies with its owner).
    """

    def __init__(self, worker_cfg: WorkerConfig, *, per_node: int, cpus: float, stage: str, plan_bytes: bytes) -> None:
        import ray  # lazy: importing Ray costs about a second, and the CLI imports this module for every command

        self.ray = ray
        self.cfg_bytes = msgspec.msgpack.encode(worker_cfg)
        self.run_id = worker_cfg.run_id
        self.per_node = per_node
        self.cpus = cpus
        self.stage = stage
        self.plan_bytes = plan_bytes
        self.slots: dict[tuple[str, int], _Slot] = {}
        self.actor_cls = worker_actor_class()
        self.started = 0
        self.token = uuid.uuid4().hex[:8]  # this driver's workers, apart from a killed driver's draining ones
        self.replaced = 0
        self.deaths_since_progress = 0
        self.last_death = ""
        self.excluded: dict[str, str] = {}  # node id -> why: its workers cannot see the driver's store

    def cpu_nodes(self) -> list[str]:
        return [n["NodeID"] for n in self.ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]

    def alive_nodes(self) -> list[str]:
        """The nodes that get workers: alive, with CPUs, and not excluded for a store they cannot see."""
        return [n for n in self.cpu_nodes() if n not in self.excluded]

    def every_node_excluded(self) -> str | None:
        """Why no node can work (each one's workers failed the store check), or None while one can."""
        nodes = self.cpu_nodes()
        if nodes and all(n in self.excluded for n in nodes):
            return self.excluded[nodes[0]]
        return None

    def _start(self, slot: _Slot) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # lazy: Ray (see __init__)

        strategy = NodeAffinitySchedulingStrategy(node_id=slot.node_id, soft=False)
        self.started += 1
        name = f"punchline:{self.run_id}:{self.stage}:{slot.node_id[:12]}:{slot.index}:{self.started}:{self.token}"
        slot.actor = self.actor_cls.options(
            name=name, lifetime="detached", num_cpus=self.cpus, scheduling_strategy=strategy
        ).remote(self.cfg_bytes, name)
        slot.ref = slot.actor.work.remote(self.plan_bytes)

    def reconcile(self) -> None:
        alive = set(self.cpu_nodes())
        for key in [k for k in self.slots if k[0] not in alive]:
            log.info("node_left", node=key[0][:12])
            del self.slots[key]
        for node in alive - set(self.excluded):
            for i in range(self.per_node):
                if (node, i) not in self.slots:
                    slot = _Slot(node, i)
                    self.slots[(node, i)] = slot
                    self._start(slot)

    def poll(self, timeout_s: float) -> list[WorkerReport]:
        """Collect finished work calls; restart the slots whose actor died."""
        refs = {s.ref: s for s in self.slots.values() if s.ref is not None}
        if not refs:
            time.sleep(timeout_s)
            return []
        ready, _ = self.ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
        reports = []
        for ref in ready:
            slot = refs[ref]
            slot.ref = None
            try:
                reports.append(msgspec.msgpack.decode(self.ray.get(ref), type=WorkerReport))
            except Exception as exc:  # the actor died (killed, node lost, OOM, failed to start): replace it
                lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
                reason = next((ln for ln in reversed(lines) if is_not_shared(ln)), None)
                del self.slots[(slot.node_id, slot.index)]
                if reason is not None:  # a node with its own view of the store: no restarts there, others go on
                    if slot.node_id not in self.excluded:
                        log.warning("node_excluded", node=slot.node_id[:12], reason=reason[:500])
                    self.excluded[slot.node_id] = reason[:500]
                    continue
                self.last_death = lines[-1][:500] if lines else type(exc).__name__
                log.warning("worker_died", node=slot.node_id[:12], error=type(exc).__name__, reason=self.last_death)
                self.replaced += 1
                self.deaths_since_progress += 1
        return reports

    def switch(self, stage: str, plan_bytes: bytes) -> None:
        """Point the pool at the next stage; workers still finishing the last one pick it up when they return."""
        self.stage = stage
        self.plan_bytes = plan_bytes
        self.deaths_since_progress = 0

    def resume_idle(self) -> None:
        for slot in self.slots.values():
            if slot.ref is None and slot.actor is not None:
                slot.ref = slot.actor.work.remote(self.plan_bytes)

    def busy(self) -> int:
        return sum(1 for s in self.slots.values() if s.ref is not None)

    def shutdown(self) -> None:
        for slot in self.slots.values():
            if slot.actor is not None:
                with contextlib.suppress(Exception):  # already gone
                    self.ray.kill(slot.actor, no_restart=True)
        self.slots.clear()


def _time_left(counters: StageCounters, done_at_start: int, elapsed_s: float) -> float | None:
    """How long the stage's missing shards take at the pace seen since ``elapsed_s`` ago (None: too soon to say)."""
    if elapsed_s < PACE_WINDOW_S:  # a worker's first shards are slow (its connections, the SDK's first call)
        return None
    pace = (counters.shards_done - done_at_start) / elapsed_s
    return (counters.shards_total - counters.shards_done) / pace if pace > 0 else float("inf")


class _RayStarting:
    """The pool's place while Ray starts: no workers; the driver's own worker has the stage."""

    slots: dict[tuple[str, int], _Slot] = {}
    deaths_since_progress = 0
    last_death = ""

    def reconcile(self) -> None:
        pass

    def poll(self, timeout_s: float) -> list[WorkerReport]:
        time.sleep(timeout_s)
        return []

    def every_node_excluded(self) -> str | None:
        return None

    def busy(self) -> int:
        return 0

    def resume_idle(self) -> None:
        pass


class Coordinator:
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
    ) -> None:
        """``warm_imports``: modules the stages' reduces will import (:class:`Stage` says why)."""
        self.ctx = ctx
        self.store: Store = ctx.store
        self.ledger = ledger
        self.worker_cfg = worker_cfg
        self.shard_size = shard_size
        self.workers_per_node = workers_per_node
        self.worker_cpus = worker_cpus
        self.progress = progress
        self.poll_s = poll_s
        self.shards_per_page = shards_per_page
        self.max_deaths_without_progress = max_deaths_without_progress
        self.pool: WorkerPool | None = None
        self.store_usage: dict[str, ShardUsage] = {}  # per stage, from its shard files (the store is the truth)
        self.autoscaler = autoscaler  # asks for worker nodes while shards outnumber workers
        # local_first: each stage starts with the driver's own worker too (start_local) until a Ray worker has
        # reported, so neither Ray's start nor its workers' start is waited for (a local run)
        self.local_first = local_first
        self.local: LocalWorker | None = None  # the driver's own worker on the current stage
        self.ray_start = ray_start  # None: this process is connected to Ray already
        self._pool_warm = False  # a Ray worker has returned a report: the pool works, no more local starts
        self._prepared: dict[str, tuple[StagePlan, list[str]]] = {}  # stages planned and queued by start_local
        self._providers_of: dict[str, set[str]] = {}  # per stage planned: the providers its units call
        kinds = sorted({p.kind for p in worker_cfg.providers.values()})
        self._warmup = ForkWarmup([*(IMPLEMENTATIONS[k] for k in kinds if k in IMPLEMENTATIONS), *warm_imports])

    def start_local(self, stage: Stage) -> LocalStart:
        """Plan ``stage``, queue its missing shards and start working them in this process, before Ray
        is up (cluster/local_worker.py); ``run_stage`` then goes on from there. ``complete``: every shard is
        committed already (``run_stage`` only reduces: no Ray needed); ``needs_ray``: nothing started (its
        requests go through batch APIs)."""
        providers = stage_providers(self.worker_cfg.providers, self.ctx.cfg.stage_mode(stage.name))
        if batch_mode(providers) and not self.worker_cfg.offline:
            return "needs_ray"
        plan, first_ids = self.write_plan(stage)
        self._prepared[stage.name] = plan, first_ids
        missing = self._missing(plan)
        if not missing:
            return "complete"
        if self.local is not None:  # the last stage's: drained, so this returns at once
            self.local.stop()
        self._init(plan, missing)
        # only the providers this stage calls: each SDK costs seconds to import, before the first call
        calls = self._providers_of.get(stage.name, set())
        providers = {n: s for n, s in self.worker_cfg.providers.items() if n in calls}
        self._warmup.settle()
        self.local = LocalWorker(msgspec.structs.replace(self.worker_cfg, providers=providers), plan).start()
        # its first call before Ray's start: Ray's processes and imports would otherwise share the CPU with
        # the worker's own (the providers' SDKs), and both would be late
        self.local.wait_ready(LOCAL_READY_WAIT_S)
        self._warmup.start()  # the next stages' workers, forked from here, find their SDKs imported
        return "working"

    def close(self) -> None:
        """Stop the run's workers (at the end of the run, or when a stage fails)."""
        if self.local is not None:
            self.local.stop()
            self.local = None
        if self.autoscaler is not None:
            self.autoscaler.release()
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None

    def manifest_key(self, stage: str) -> str:
        return RunLayout(self.ctx.run_id).manifest(stage)

    def stage_done(self, stage: str) -> bool:
        return self.store.exists(self.manifest_key(stage))

    def plugin_code(self, stage: Stage, step: str) -> contextlib.AbstractContextManager[None]:
        return pipeline_code(self.ctx.cfg.run.pipeline, stage, step)

    def run_stage(self, stage: Stage) -> tuple[list[str], dict[str, str]]:
        """Execute (or resume) one stage and reduce it: (artifact names written, failed unit -> reason)."""
        if stage.name not in self._prepared and self.local_first and not self._pool_warm:
            self.start_local(stage)
        prepared = self._prepared.pop(stage.name, None)  # planned and queued by start_local, its worker at it
        plan, first_ids = prepared if prepared is not None else self.write_plan(stage)
        providers = stage_providers(self.worker_cfg.providers, self.ctx.cfg.stage_mode(stage.name))
        if batch_mode(providers) and not self.worker_cfg.offline and plan.units_total:
            # batch-mode providers' answers go into the response cache first; the shards then find them there.
            # What the batches cost is in their records (status adds them up), not in the stage's counters.
            cache = ResponseCache(self.store)
            with self.plugin_code(stage, "plan"):
                units = stage.plan(self.ctx)
                run_stage_batches(  # each batch is priced and held in the run's cap before it is created
                    self.ledger.r,
                    cache,
                    self.ctx.run_id,
                    stage.name,
                    units,
                    providers,
                    max_cost_usd=self.worker_cfg.max_cost_usd,
                )
        results = self.execute(plan, first_ids, queued=prepared is not None)
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

    def _missing(self, plan: StagePlan) -> list[int]:
        present = set(self.store.list(RunLayout(self.ctx.run_id).shards(plan.stage)))
        return [i for i in range(plan.shards_total) if shard_key(self.ctx.run_id, plan.stage, i) not in present]

    def _init(self, plan: StagePlan, missing: list[int]) -> None:
        patiently(
            self.ledger.init_stage,
            self.ctx.run_id,
            plan.stage,
            pending=missing,
            shards_total=plan.shards_total,
            units_total=plan.units_total,
            shards_done=plan.shards_total - len(missing),
        )

    def execute(self, plan: StagePlan, first_ids: list[str], *, queued: bool = False) -> ShardResults:
        """Work the stage's missing shards to the end. ``queued``: its queue was built already and a
        worker may hold leases in it (start_local): it is not rebuilt, which would drop those leases."""
        run_id, stage = self.ctx.run_id, plan.stage
        missing = self._missing(plan)
        log.info(
            "stage_start",
            run_id=run_id,
            stage=stage,
            shards=plan.shards_total,
            missing=len(missing),
            units=plan.units_total,
        )
        if missing:
            if not queued:
                self._init(plan, missing)
            plan_bytes = msgspec.msgpack.encode(plan)  # by value: it must outlive a killed driver
            if self.pool is not None:  # workers outlive a stage: starting Ray worker processes costs seconds
                self.pool.switch(stage, plan_bytes)
            try:
                self._drive(plan, plan_bytes)
            except BaseException:
                self.close()
                raise
        if self.progress:
            self.progress(stage, patiently(self.ledger.counters, run_id, stage))
        return self._results(plan, first_ids)

    def _pool_now(self, stage: str, plan_bytes: bytes, alone_s: float | None = None) -> WorkerPool | _RayStarting:
        """The Ray workers' pool, started once Ray is up and the stage has work the driver's own worker cannot
        finish alone soon (``alone_s``: how long it would take, None while its pace is not known yet); waits
        for Ray only when that worker is not (or no longer) working this stage."""
        if self.pool is None:
            local_busy = self.local is not None and self.local.stage == stage and self.local.running()
            if local_busy and (alone_s is None or alone_s < LOCAL_ALONE_S):
                return _RayStarting()  # joining Ray and starting its workers would cost more CPU than it saves
            if self.ray_start is not None and not self.ray_start(not local_busy):
                return _RayStarting()
            self.pool = WorkerPool(
                self.worker_cfg,
                per_node=self.workers_per_node,
                cpus=self.worker_cpus,
                stage=stage,
                plan_bytes=plan_bytes,
            )
        return self.pool

    def _drive(self, plan: StagePlan, plan_bytes: bytes) -> None:
        run_id, stage = self.ctx.run_id, plan.stage
        budget_hit = False
        last_check = 0.0
        shards_done = -1
        # while Ray starts the first poll goes to the driver's own worker: it may have finished the stage
        pool = self._pool_now(stage, plan_bytes) if self.ray_start is None else self.pool or _RayStarting()
        began, done_at_start = time.monotonic(), -1  # the driver's own worker's pace on this stage, while alone
        while True:
            if not budget_hit:
                pool.reconcile()
            reports = pool.poll(self.poll_s)
            self._pool_warm |= bool(reports)
            if self.local is not None and self.local.stage == stage:
                reports += self.local.poll()
            for rep in reports:
                budget_hit |= rep.budget_exhausted
            counters = patiently(self.ledger.counters, run_id, stage)
            if self.autoscaler is not None and self.pool is not None:
                self.autoscaler.update(
                    pending_shards=counters.shards_total - counters.shards_done, live_workers=len(pool.slots)
                )
            if counters.shards_done != shards_done:
                shards_done, pool.deaths_since_progress = counters.shards_done, 0
            blind = pool.every_node_excluded()
            if blind is not None:
                raise InfraError(f"stage {stage}: no node can see the store: {blind}")
            if pool.deaths_since_progress >= self.max_deaths_without_progress:
                raise InfraError(
                    f"stage {stage}: {pool.deaths_since_progress} workers died in a row without committing a shard; "
                    f"last error: {pool.last_death}"
                )
            if self.progress:
                self.progress(stage, counters)
            now = time.monotonic()
            lost = counters.shards_total == 0 and not patiently(self.ledger.stage_initialized, run_id, stage)
            # Listing the store is the truth but not free (25,000 shard files on S3 are 25 list pages): do it
            # when the ledger says the stage may be done, a worker came back, the ledger lost the stage, or
            # every 30 s as a backstop.
            if lost or reports or counters.shards_done >= plan.shards_total or now - last_check > 30.0:
                last_check = now
                missing = self._missing(plan)
                if not missing:
                    if self.autoscaler is not None:
                        self.autoscaler.release()
                    return
                if lost:
                    log.warning("stage_state_lost", run_id=run_id, stage=stage, missing=len(missing))
                    self._init(plan, missing)
            local_busy = self.local is not None and self.local.stage == stage and self.local.running()
            if budget_hit and pool.busy() == 0 and not local_busy:
                raise BudgetExceeded(
                    f"stage {stage}: stopped scheduling because the next units would exceed the budget; "
                    "everything collected so far is kept (resume with a higher --max-cost-usd)"
                )
            if not budget_hit:
                pool.resume_idle()
            if self.pool is None:  # Ray's workers join when it is up (this stage's local worker works on)
                done_at_start = counters.shards_done if done_at_start < 0 else done_at_start
                pool = self._pool_now(stage, plan_bytes, _time_left(counters, done_at_start, now - began))

    def _results(self, plan: StagePlan, first_ids: list[str]) -> ShardResults:
        decoder = msgspec.msgpack.Decoder(ShardOutput)

        def load(index: int) -> ShardOutput:
            raw = self.store.get(shard_key(self.ctx.run_id, plan.stage, index))
            if raw is None:
                raise PunchlineError(f"stage {plan.stage}: shard {index} is missing from {self.store.url}")
            output = decoder.decode(raw)
            if not output.results or output.results[0].unit_id != first_ids[index]:
                raise PunchlineError(
                    f"stage {plan.stage}: shard {index} does not match the plan (was the config changed?)"
                )
            return output

        return ShardResults(load, first_ids, plan.units_total)
