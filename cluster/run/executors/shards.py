"""The shards executor: workers claim a stage's shards and call the providers online, under leases.

It keeps a worker on every node until every shard is committed. Elasticity is reconciliation, not events: every
poll (0.5 s) it compares the nodes Ray reports alive with the workers it has, starts workers on nodes that
joined, replaces workers that died on nodes that are still alive, and forgets those of nodes that left. Their
shards come back to the queue when their leases expire. Completion is decided by the store (every shard file
present), never by Redis alone, so a wiped Redis can only cost time, not results.

In a local run each stage starts with the driver's own worker (:mod:`punchline.cluster.run.local_worker`) while
Ray starts, and Ray's workers join the same queue once it is up (:meth:`ShardExecutor.start_local`). The
workers outlive a stage (starting Ray worker processes costs seconds), so one executor serves a whole run.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import msgspec
import structlog

from punchline.cluster.pipeline import Stage, StageContext
from punchline.cluster.ray_cluster.autoscale import Autoscaler
from punchline.cluster.run.executor import ExecutorName, ProgressFn, RayStart
from punchline.cluster.run.executors.local_pace import LocalPace
from punchline.cluster.run.local_worker import ForkWarmup, LocalWorker
from punchline.data.errors import BudgetExceeded, InfraError, PunchlineError
from punchline.data.storage.run_layout import RunLayout
from punchline.data.store import Store
from punchline.data.stores.sentinel import is_not_shared
from punchline.data.units import ShardOutput, ShardResults, StagePlan, shard_key
from punchline.schedulers.ledger import Ledger, patiently
from punchline.workers.providers import kind_of
from punchline.workers.shard_actor import worker_actor_class
from punchline.workers.shard_worker import WorkerConfig, WorkerReport

log = structlog.get_logger("punchline.coordinator")

LocalStart = Literal["working", "complete"]  # what ShardExecutor.start_local did
# A stage's first wait for its workers' reports, doubled each poll up to poll_s: a stage over at once (its answers
# cached, a few units) is seen over at once, not after a whole poll_s (the demo, cached: 2 s of waiting in all).
FIRST_POLL_S = 0.05
# the longest wait while the driver's own worker has the stage alone: a stage of cached units ends within a
# second, and the doubling above had the driver see it 0.2 s late (a look at the ledger costs a millisecond)
LOCAL_POLL_S = 0.1
LOCAL_READY_WAIT_S = 15.0  # how long Ray's start waits for the driver's own worker to be ready to call
LAST_STOP_WAIT_S = 5.0  # the last calling stage's reduce waits this long for its drained local worker to end


class _Slot(msgspec.Struct):
    node_id: str
    index: int
    actor: Any = None
    ref: Any = None


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


class ShardExecutor:
    """Works a stage's shards with the driver's own worker and Ray's worker pool (one executor per run)."""

    name: ExecutorName = "shards"

    def __init__(
        self,
        *,
        ctx: StageContext,
        ledger: Ledger,
        worker_cfg: WorkerConfig,
        workers_per_node: int,
        worker_cpus: float,
        progress: ProgressFn | None = None,
        poll_s: float = 0.5,
        max_deaths_without_progress: int = 8,
        autoscaler: Autoscaler | None = None,
        ray_start: RayStart | None = None,
        warm_imports: Sequence[str] = (),
        calls_later: Mapping[str, bool] | None = None,
    ) -> None:
        """``warm_imports``: modules the stages' reduces will import (:class:`Stage` says why). ``calls_later``:
        per stage, whether a stage after it calls a provider (the plan's upper bound; a stage not named: yes)."""
        self.ctx = ctx
        self.store: Store = ctx.store
        self.ledger = ledger
        self.worker_cfg = worker_cfg
        self.workers_per_node = workers_per_node
        self.worker_cpus = worker_cpus
        self.progress = progress
        self.poll_s = poll_s
        self.max_deaths_without_progress = max_deaths_without_progress
        self.pool: WorkerPool | None = None
        self.autoscaler = autoscaler  # asks for worker nodes while shards outnumber workers
        self.local: LocalWorker | None = None  # the driver's own worker on the current stage
        self._ending: list[LocalWorker] = []  # those of earlier stages, asked to stop, reaped by close()
        self.ray_start = ray_start  # None: this process is connected to Ray already
        self.pool_warm = False  # a Ray worker has returned a report: the pool works, no more local starts
        self._ray_wanted_said = False  # the stage's `local_ray_wanted` line is written
        kinds = sorted({p.kind for p in worker_cfg.providers.values()})
        self._sdks = [m for k in kinds for m in kind_of(k).warm_modules()]  # each kind's module and its SDK
        self._calls_later = dict(calls_later or {})
        self._warmup = ForkWarmup(list(warm_imports))

    def start_local(self, plan: StagePlan, calls: set[str]) -> LocalStart:
        """Queue the planned stage's missing shards and start working them in this process, before Ray is up
        (cluster/run/local_worker.py); :meth:`execute` then goes on from there. ``complete``: every shard is
        committed already (only the reduce is left: no Ray needed). ``calls``: the providers its units call."""
        missing = self._missing(plan)
        if not missing:
            return "complete"
        if self.local is not None:  # the last stage's (all committed): it ends beside this one, close() reaps it
            self.local.ask_stop()
            self._ending.append(self.local)
        self._init(plan, missing)
        # only the providers this stage calls: each SDK costs seconds to import, before the first call
        providers = {n: s for n, s in self.worker_cfg.providers.items() if n in calls}
        self._warmup.settle(plan.stage)
        self.local = LocalWorker(msgspec.structs.replace(self.worker_cfg, providers=providers), plan).start()
        # its first call before Ray's start: Ray's processes and imports would otherwise share the CPU with
        # the worker's own (the providers' SDKs), and both would be late
        self.local.wait_ready(LOCAL_READY_WAIT_S)
        return "working"

    def close(self) -> None:
        """Stop the run's workers (at the end of the run, or when a stage fails)."""
        for ending in self._ending:
            ending.stop()
        self._ending.clear()
        if self.local is not None:
            self.local.stop()
            self.local = None
        if self.autoscaler is not None:
            self.autoscaler.release()
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None

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

    def execute(self, stage: Stage, plan: StagePlan, first_ids: list[str], *, queued: bool = False) -> ShardResults:
        """Work the stage's missing shards to the end. ``queued``: its queue was built already and a
        worker may hold leases in it (start_local): it is not rebuilt, which would drop those leases."""
        del stage  # the plan says what to work
        run_id, stage_name = self.ctx.run_id, plan.stage
        missing = self._missing(plan)
        log.info(
            "stage_start",
            run_id=run_id,
            stage=stage_name,
            shards=plan.shards_total,
            missing=len(missing),
            units=plan.units_total,
        )
        if missing:
            if not queued:
                self._init(plan, missing)
            plan_bytes = msgspec.msgpack.encode(plan)  # by value: it must outlive a killed driver
            if self.pool is not None:  # workers outlive a stage: starting Ray worker processes costs seconds
                self.pool.switch(stage_name, plan_bytes)
            try:
                self._supervise(plan, plan_bytes)
            except BaseException:
                self.close()
                raise
            if self.local is not None and self.local.stage == stage_name:  # every shard is committed: it ends
                if self._calls_after(stage_name):
                    self.local.ask_stop()  # while the stage is reduced (the next stage's start_local reaps it)
                else:  # no worker comes after it: gone before the reduce loads its writers (pyarrow's 40 MB
                    self.local.stop(LAST_STOP_WAIT_S)  # would sit beside the child's at the run's peak)
        if self.progress:
            self.progress(stage_name, patiently(self.ledger.counters, run_id, stage_name))
        return self._results(plan, first_ids)

    def _pool_now(self, stage: str, plan_bytes: bytes, pace: LocalPace | None = None) -> WorkerPool | _RayStarting:
        """The Ray workers' pool, started once Ray is up and the driver's own worker needs help with the stage
        (``pace``: its pace and CPU so far, cluster/run/executors/local_pace.py); waits for Ray only when that worker
        is not (or no longer) working this stage."""
        if self.pool is None:
            local_busy = self.local is not None and self.local.stage == stage and self.local.running()
            if local_busy and (pace is None or not pace.ray_helps()):
                return _RayStarting()  # joining Ray and starting its workers would cost more than it saves
            if local_busy and pace is not None and not self._ray_wanted_said:
                self._ray_wanted_said = True
                log.info("local_ray_wanted", run_id=self.ctx.run_id, stage=stage, **pace.why())
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

    def _calls_after(self, stage: str) -> bool:
        """Whether a stage after ``stage`` calls a provider (so a worker will be forked for it); unknown: yes."""
        return self._calls_later.get(stage, True)

    def _local_pace(self, stage: str) -> LocalPace | None:
        """A watch on the driver's own worker, when it works this stage: its window against the calls in flight
        the stage's providers allow together (another worker adds calls only below that)."""
        local = self.local
        if local is None or local.stage != stage:
            return None
        self._ray_wanted_said = False
        providers = local.cfg.providers.values()
        capacity = sum(p.max_concurrency for p in providers)
        return LocalPace(local.pid, window=local.cfg.window(), capacity=capacity)

    def _check_pool(self, stage: str, pool: WorkerPool | _RayStarting) -> None:
        """A stage no worker can finish fails now: every node blind to the store, or workers dying in a row."""
        blind = pool.every_node_excluded()
        if blind is not None:
            raise InfraError(f"stage {stage}: no node can see the store: {blind}")
        if pool.deaths_since_progress >= self.max_deaths_without_progress:
            raise InfraError(
                f"stage {stage}: {pool.deaths_since_progress} workers died in a row without committing a shard; "
                f"last error: {pool.last_death}"
            )

    def _supervise(self, plan: StagePlan, plan_bytes: bytes) -> None:
        """Watch the stage until every shard file is stored. Workers claim their shards (schedulers/claims.py); this
        keeps workers there (pool, Ray, autoscaler), rebuilds a lost queue, stops at the budget or a dead end."""
        run_id, stage = self.ctx.run_id, plan.stage
        budget_hit = False
        last_check = 0.0
        shards_done = -1
        # while Ray starts the first poll goes to the driver's own worker: it may have finished the stage
        pool = self._pool_now(stage, plan_bytes) if self.ray_start is None else self.pool or _RayStarting()
        pace = self._local_pace(stage)  # the driver's own worker on this stage, while alone
        wait_s = min(FIRST_POLL_S, self.poll_s)
        while True:
            if not budget_hit:
                pool.reconcile()
            reports = pool.poll(wait_s)
            wait_s = min(2 * wait_s, self.poll_s if self.pool is not None else min(LOCAL_POLL_S, self.poll_s))
            self.pool_warm |= bool(reports)
            if self.local is not None and self.local.stage == stage:
                reports += self.local.poll()
                if self.local.calling.is_set():
                    # it pays: the next stages' workers, forked from here (this thread, never during an import),
                    # find their SDKs imported; none are when no later stage calls (no fork is coming)
                    self._warmup.start(self._sdks if self._calls_after(stage) else ())
            for rep in reports:
                budget_hit |= rep.budget_exhausted
            counters = patiently(self.ledger.counters, run_id, stage)
            if self.autoscaler is not None and self.pool is not None:
                self.autoscaler.update(
                    pending_shards=counters.shards_total - counters.shards_done, live_workers=len(pool.slots)
                )
            if counters.shards_done != shards_done:
                shards_done, pool.deaths_since_progress = counters.shards_done, 0
            self._check_pool(stage, pool)
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
                left = counters.units_total - counters.units_done - counters.units_failed
                raise BudgetExceeded(
                    f"stage {stage}: stopped scheduling because the next units would exceed the budget "
                    f"(max_cost_usd); {left} of its {counters.units_total} units are not done; everything collected so "
                    "far is kept, and nothing answered is paid for again (resume with a higher --max-cost-usd)"
                )
            if not budget_hit:
                pool.resume_idle()
            if self.pool is None:  # Ray's workers join when it is up and helps (this stage's local worker works on)
                if pace is not None:
                    pace.see(counters.shards_done, counters.shards_total)
                pool = self._pool_now(stage, plan_bytes, pace)

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
