"""The driver: sets up the services of a run (Redis, Ray, the store, the simulated provider), then
hands each stage to the coordinator in order.

With nothing configured it is self-contained: an embedded ``redis-server`` whose AOF lives in
``runs/<run-id>/redis/``, a local Ray, the local store under ``runs/``. Any of these can be pointed
at a cluster's services by flag, environment or config. Starting a run with an existing id resumes
it: finished stages are skipped, committed shards are not redone, cached answers are not re-paid.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any

import msgspec
import structlog

from punchline.cluster.config import RunConfig, load_config
from punchline.cluster.estimate.machine_load import runnable_others
from punchline.cluster.pipeline import Stage, StageContext
from punchline.cluster.ray_cluster import autoscale
from punchline.cluster.ray_cluster.autoscale import RequestResources
from punchline.cluster.ray_cluster.ray_runtime import driver_node_ip, ray_running
from punchline.cluster.ray_cluster.shared_store import config_store
from punchline.cluster.records.retry_failed import drop_retryable_failures
from punchline.cluster.records.run_record import RunRecord, Services, check_run_id, load_record
from punchline.cluster.registry import pipeline_of
from punchline.cluster.run.coordinator import Coordinator, ProgressFn
from punchline.cluster.run.preflight import check_store_ledger, read_store
from punchline.cluster.run.run_checks import check_environment, check_keys, check_options, check_run
from punchline.cluster.run.run_options import RunOptions
from punchline.cluster.run.run_services import Prepared, RunServices, snapshot_at_end
from punchline.data.errors import BudgetExceeded, ConfigError, PluginError, PunchlineError
from punchline.data.redaction import redact_urls
from punchline.data.storage.run_layout import RunLayout
from punchline.data.store import Store
from punchline.data.stores import open_store
from punchline.data.units import StageManifest
from punchline.schedulers.budget import Budget, usage_rows
from punchline.schedulers.ledger import patiently, with_store_totals
from punchline.services.ray_settings import RaySettings
from punchline.workers.logs import configure_logging

__all__ = ["RunOptions", "RunRecord", "Services", "finished", "new_run_id", "pipeline_stages", "prepare", "run"]

log = structlog.get_logger("punchline.driver")


def new_run_id(cfg: RunConfig) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return f"{cfg.run.name or pipeline_of(cfg).name}-{stamp}-{secrets.token_hex(2)}"


def pipeline_stages(cfg: RunConfig) -> list[Stage]:
    return pipeline_of(cfg).stages(cfg)


def prepare(config_path: str, opts: RunOptions, marks: dict[str, float]) -> Prepared | RunRecord:
    """The whole-run preflight (cluster/run/run_checks.py): nothing is created or paid before it passes. A run that
    finished already is answered by its record (no service is started for it)."""
    busy = runnable_others()  # the machine's other work as the run starts (`plan` reads it from the log)
    if opts.run_id is not None:  # first: a run id never names a path outside the runs folder (read below)
        check_run_id(opts.run_id)
    check_environment()
    cfg = load_config(config_path)  # every value range-checked: a bad config writes nothing
    store_url = opts.store or config_store(cfg) or opts.runs_dir
    check_options(opts, cfg, store_url)  # the flags over the config, the folders, the address, the URLs
    ray_address = opts.ray_address or cfg.run.ray_address
    ray_settings = RaySettings.from_env()
    if ray_address:
        ray_settings = msgspec.structs.replace(ray_settings, address=ray_address)
    estimates = check_run(cfg)  # every stage's inputs, settings against inputs, and models
    run_id = opts.run_id or new_run_id(cfg)
    store = open_store(store_url)
    layout = RunLayout(run_id)
    existing = read_store(store, layout.record)  # a wrong key or bucket stops here, at once
    config_toml = redact_urls(Path(config_path).read_text())  # a password in [run] redis_url stays in the file
    stages = pipeline_stages(cfg)
    created_at = None
    if existing is not None:
        prev = load_record(existing, f"{store.url}/{layout.record}")
        if redact_urls(prev.config_toml) != config_toml:
            raise ConfigError(
                f"run {run_id} exists with a different config; start a new run id or restore the config "
                f"({prev.config_path})",
                file=config_path,
            )
        if finished(prev, store, [s.name for s in stages]):
            log.info("run_already_finished", run_id=run_id)
            return prev
        created_at = prev.created_at
    check_store_ledger(store, opts.redis_url or cfg.run.redis_url, opts.runs_dir)  # before the ledger starts
    offline = opts.offline if opts.offline is not None else cfg.run.offline
    if not offline and ray_settings.is_local:  # local workers read their keys from this machine
        check_keys(cfg)
    marks["preflight_done"] = time.time()
    later = runnable_others()  # once more after the preflight: one reading is a moment
    return Prepared(
        cfg=cfg,
        run_id=run_id,
        run_dir=Path(opts.runs_dir) / run_id,
        store=store,
        stages=stages,
        config_path=str(config_path),
        config_toml=config_toml,
        ray_settings=ray_settings,
        ray_address=ray_address,
        offline=offline,
        max_cost_usd=opts.max_cost_usd if opts.max_cost_usd is not None else cfg.run.max_cost_usd,
        created_at=created_at,
        marks=marks,
        redis_url=opts.redis_url or cfg.run.redis_url,
        runs_dir=opts.runs_dir,
        verbose=opts.verbose,
        metrics_port=opts.metrics_port,
        ray_dashboard_port=opts.ray_dashboard_port,
        max_workers=opts.max_workers,
        calls_later=calls_later([s.name for s in stages], {e.stage for e in estimates if e.requests}),
        runnable_others=None if busy is None or later is None else (busy + later) / 2,
    )


def calls_later(order: list[str], calling: set[str]) -> dict[str, bool]:
    """Per stage, whether a stage after it calls a provider (``calling``: those whose plan has requests)."""
    return {name: any(later in calling for later in order[i + 1 :]) for i, name in enumerate(order)}


def finished(record: RunRecord, store: Store, stages: list[str]) -> bool:
    """The run finished with these stages and every stage's manifest is in the store: resuming it
    has nothing to do, so it answers from its record without starting any service."""
    return (
        record.state == "finished"
        and record.stages == stages
        and all(store.get(RunLayout(record.run_id).manifest(s)) is not None for s in stages)
    )


def run(
    config_path: str,
    opts: RunOptions,
    *,
    progress: ProgressFn | None = None,
    request_resources: RequestResources | None = None,
) -> RunRecord:
    """Run (or resume) the pipeline a config names: preflight, open the services, run the stages, record how
    it ended (in the store and the run's folder, as soon as it is known)."""
    marks = {"driver_start": time.time()}  # start-up phases, logged as one `start_phases` event
    # until the run's folder exists, log lines go where the run's will (stderr with --verbose), never to
    # stdout: that is for what a command prints on purpose
    configure_logging(None, console=opts.verbose)
    prep = prepare(config_path, opts, marks)
    if isinstance(prep, RunRecord):
        return prep  # finished already: nothing to do
    # the driver works shards itself while the local Ray starts (not when this process has one already:
    # there is no start to overlap); the runs folder's head is found now (a resume's, the last run's) or
    # started once the driver's own worker is ready, and never waited for (services/local_ray.py)
    services = RunServices(
        prep,
        local_first=prep.local and not ray_running(),
        # on a cluster the simulator listens where the workers on other nodes can reach it
        sim_host="127.0.0.1" if prep.local else driver_node_ip(),
    )
    with services as svc:
        coord = _coordinator(prep, svc, progress, request_resources)
        svc.log.info("run_start", stages=svc.record.stages, store=prep.store.url)
        try:
            _run_stages(prep, svc, coord)
        except BaseException as exc:
            _ended_by(exc, svc.record)
            snapshot_at_end(prep.store, prep.run_dir, svc.record)  # at once: stopping the workers below can
            raise  # outlast the grace a `ray job stop` gives before its SIGKILL
        finally:
            coord.close()
            _final_counts(svc, coord)
            snapshot_at_end(prep.store, prep.run_dir, svc.record)
            svc.log.info("run_end", state=svc.record.state)
    return svc.record


def _coordinator(
    prep: Prepared,
    svc: RunServices,
    progress: ProgressFn | None,
    request_resources: RequestResources | None,
) -> Coordinator:
    run = prep.cfg.run
    return Coordinator(
        ctx=StageContext(prep.cfg, prep.run_id, prep.store),
        ledger=svc.ledger,
        worker_cfg=svc.worker_cfg,
        shard_size=run.shard_size,
        workers_per_node=run.workers_per_node,
        worker_cpus=run.worker_cpus,
        progress=progress,
        local_first=svc.lazy_ray is not None,
        ray_start=svc.lazy_ray,
        warm_imports=sorted({m for stage in prep.stages for m in getattr(stage, "warm_imports", ())}),
        calls_later=prep.calls_later,
        autoscaler=autoscale.for_run(
            run.max_workers,
            run.workers_per_node,
            run.worker_cpus,
            flag=prep.max_workers,
            request_resources=request_resources or _ray_request_resources,
        ),
    )


def _run_stages(prep: Prepared, svc: RunServices, coord: Coordinator) -> None:
    """Each stage in order: skipped when its manifest is in the store, else run by the coordinator; the record
    is written after each."""
    record, lazy_ray = svc.record, svc.lazy_ray
    if lazy_ray is None:  # a cluster's Ray was joined, or this process had one
        svc.log_phases()
    if prep.created_at is not None:  # a resume calls again the units that failed with a retryable error
        requeued = drop_retryable_failures(record, prep.store)
        if requeued.count:
            svc.log.info("retryable_failures_requeued", shards={s: len(k) for s, k in requeued.shards.items()})
    for stage in prep.stages:
        if coord.stage_done(stage.name):
            svc.log.info("stage_skipped", stage=stage.name, reason="manifest present")
            record.artifacts += _manifest_artifacts(prep.store, prep.run_id, stage.name)
            continue
        # each stage begins with the driver's own worker while the local Ray starts; the coordinator
        # connects (on this, the main, thread: cluster/run/local_worker.py says why) and adds Ray's
        # workers once the head is up; a stage whose shards are all committed is reduced without Ray
        working = lazy_ray is not None and not lazy_ray.connected and coord.start_local(stage) == "working"
        if working and "local_worker_started" not in prep.marks:  # the phases so far: Ray comes later, or never
            prep.marks["local_worker_started"] = time.time()
            svc.log_phases()
        artifacts, failures = coord.run_stage(stage)
        record.artifacts += artifacts
        record.counters[stage.name] = with_store_totals(
            patiently(svc.ledger.counters, prep.run_id, stage.name), coord.store_usage[stage.name]
        )
        record.failures.pop(stage.name, None)
        if failures:
            record.failures[stage.name] = failures
        svc.snapshot()
    record.state = "finished" if not record.failures else "failed"


def _ended_by(exc: BaseException, record: RunRecord) -> None:
    """How a run that raised ended, in its record (and the run id on the exception, for the resume line)."""
    record.state = "budget" if isinstance(exc, BudgetExceeded) else "failed"
    if isinstance(exc, (KeyboardInterrupt, SystemExit)):  # Ctrl-C; SIGTERM (Ray's handler exits):
        record.state = "interrupted"  # `punchline stop`, `ray job stop`, a deleted pod
        exc.run_id = record.run_id  # type: ignore[union-attr]  # for the resume command the CLI prints
    if isinstance(exc, PluginError):
        exc.run_id = record.run_id  # the pipeline's bug: resumed once fixed


def _final_counts(svc: RunServices, coord: Coordinator) -> None:
    """The ledger's last counters and the run's usage into the record. A ledger gone by now (its outage may be
    what ended the run) leaves the counts of the last finished stage, logged, never raised over the run's end."""
    record = svc.record
    try:
        for name in record.stages:
            counters = svc.ledger.counters(record.run_id, name)
            done = coord.store_usage.get(name)
            record.counters[name] = with_store_totals(counters, done) if done else counters
        record.usage = usage_rows(Budget(svc.ledger.r, record.run_id, None).usage(), coord.store_usage)
    except PunchlineError as exc:
        svc.log.warning("final_counts_unavailable", error=str(exc))
    record.finished_at = time.time()


def _ray_request_resources(*, bundles: list[dict[str, float]]) -> Any:
    """Ray's ``request_resources``, imported when first asked (after Ray started), not before the first call."""
    return autoscale.ray_request_resources()(bundles=bundles)


def _manifest_artifacts(store: Store, run_id: str, stage: str) -> list[str]:
    raw = store.get(RunLayout(run_id).manifest(stage))
    if raw is None:
        return []
    return msgspec.json.decode(raw, type=StageManifest).artifacts
