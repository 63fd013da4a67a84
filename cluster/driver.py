"""The driver: sets up the services of a run (Redis, Ray, the store, the simulated provider), then
hands each stage to the coordinator in order.

With nothing configured it is self-contained: an embedded ``redis-server`` whose AOF lives in
``runs/<run-id>/redis/``, a local Ray, the local store under ``runs/``. Any of these can be pointed
at a cluster's services by flag, environment or config. Starting a run with an existing id resumes
it: finished stages are skipped, committed shards are not redone, cached answers are not re-paid.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import msgspec
import structlog

from punchline.cluster import autoscale
from punchline.cluster.autoscale import RequestResources
from punchline.cluster.config import SIMULATED, RunConfig, load_config
from punchline.cluster.coordinator import Coordinator, ProgressFn
from punchline.cluster.local_ledger import LocalLedger
from punchline.cluster.local_ray import LocalRay
from punchline.cluster.pipeline import Stage, StageContext
from punchline.cluster.preflight import check_providers, check_redis, read_store
from punchline.cluster.ray_runtime import (
    RaySettings,
    check_address,
    driver_node_ip,
    ensure_ray,
    ray_running,
    shutdown_ray,
)
from punchline.cluster.registry import pipeline_of
from punchline.cluster.run_checks import check_environment, check_keys, check_options, check_outputs, check_run
from punchline.cluster.run_claim import RunClaim
from punchline.cluster.run_log import LogShipper
from punchline.cluster.run_record import RunRecord, Services, load_record
from punchline.cluster.shared_store import config_store, ensure_shared
from punchline.cluster.store_guard import StoreGuard, redis_identity
from punchline.cluster.view.metrics import serve_driver_metrics
from punchline.data import settings as env_registry
from punchline.data.errors import BudgetExceeded, ConfigError, LedgerFailed, PluginError
from punchline.data.jsonio import atomic_write_bytes, overwrite_in_place
from punchline.data.redaction import redact_url, redact_urls
from punchline.data.response_cache import ResponseCache
from punchline.data.response_spool import ResponseSpool
from punchline.data.run_layout import LOG, RECORD, SPOOL, RunLayout
from punchline.data.store import Store
from punchline.data.stores import open_store
from punchline.data.units import StageManifest
from punchline.schedulers.budget import Budget, usage_rows
from punchline.schedulers.ledger import Ledger, patiently, with_store_totals
from punchline.schedulers.redis_client import connect, credentials_in_userinfo
from punchline.workers.fake.server import FakeConfig, FakeProviderServer
from punchline.workers.logs import configure_logging
from punchline.workers.shard_worker import WorkerConfig

log = structlog.get_logger("punchline.driver")


class RunOptions(msgspec.Struct, kw_only=True):
    """Command-line / environment overrides of the config's ``[run]`` table."""

    run_id: str | None = None
    runs_dir: str = env_registry.RUNS_DIR.default
    redis_url: str | None = None
    store: str | None = None
    ray_address: str | None = None
    max_cost_usd: float | None = None
    max_workers: int | None = None  # worker nodes to ask the autoscaler for (--max-workers)
    offline: bool | None = None
    verbose: bool = False  # human-readable log lines on stderr as well as the JSON log
    metrics_port: int | None = None  # serve the run's Prometheus text on 127.0.0.1:<port>/metrics while it runs

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RunOptions:
        """``PUNCHLINE_RUNS_DIR``, ``PUNCHLINE_REDIS_URL``, ``PUNCHLINE_STORE``, ``PUNCHLINE_RAY_ADDRESS``;
        flags go over it with :func:`punchline.data.settings.overlay`."""
        return cls(**env_registry.env_values(RUN_OPTIONS_ENV, env))


RUN_OPTIONS_ENV: dict[str, env_registry.EnvVar[Any]] = {
    "runs_dir": env_registry.RUNS_DIR,
    "redis_url": env_registry.REDIS_URL,
    "store": env_registry.STORE,
    "ray_address": env_registry.RAY_ADDRESS,
}


def new_run_id(cfg: RunConfig) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return f"{cfg.run.name or pipeline_of(cfg).name}-{stamp}-{secrets.token_hex(2)}"


def pipeline_stages(cfg: RunConfig) -> list[Stage]:
    return pipeline_of(cfg).stages(cfg)


class _Ledger(msgspec.Struct, kw_only=True):
    """The run's Redis as this process connects to it (``url``) and as it may be shown (``public_url``)."""

    url: str
    public_url: str
    password_file: str | None = None
    identity: str = ""  # what the store records as its ledger (cluster/store_guard.py): never a password
    driver_claim: str | None = None  # this driver's claim on the run id, watched by its workers


@contextlib.contextmanager
def _redis(url: str | None, runs_dir: Path) -> Iterator[_Ledger]:
    """The run's Redis: the given URL (checked by the caller: a wrong password or certificate stops
    the run at once), else the runs folder's shared embedded ledger (started by the first driver,
    stopped when the last one leaves)."""
    if url:
        url = credentials_in_userinfo(url)  # ?password= too: workers get it redacted, never in their arguments
        with _password_file(url) as password_file:
            yield _Ledger(
                url=url, public_url=redact_url(url), password_file=password_file, identity=redis_identity(url)
            )
        return
    with LocalLedger(runs_dir) as shared:  # restarted from its AOF if it dies; LedgerFailed if it cannot be
        log.info("ledger_joined", url=shared.public_url, started=shared.started)
        try:
            yield _Ledger(
                url=shared.url,
                public_url=shared.public_url,
                password_file=shared.password_file,
                identity=shared.identity,
            )
        except BaseException:
            # the watcher's LedgerFailed may surface wrapped (raised inside a C extension such as Ray's
            # wait, it comes out as a SystemError): the run ends with the ledger's one line either way
            if shared.failure is not None:
                raise LedgerFailed(shared.failure) from None
            raise


@contextlib.contextmanager
def _password_file(url: str) -> Iterator[str | None]:
    """A 0600 file in a private 0700 folder holding the URL's password, for the workers on this
    machine (they never get it as an argument); removed when the run ends. Workers elsewhere read
    ``PUNCHLINE_REDIS_URL`` from their own environment."""
    password = urlsplit(url).password
    if not password:
        yield None
        return
    folder = Path(tempfile.mkdtemp(prefix="punchline-ledger-"))  # mode 0700
    path = folder / "password"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(unquote(password))
    try:
        yield str(path)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def _simulator(cfg: RunConfig, host: str = "127.0.0.1") -> Iterator[str | None]:
    """Start the offline simulated provider if any provider's base_url says ``simulated``, listening on
    ``host`` (on a cluster the driver node's address, so that workers on other nodes reach it)."""
    sim = [n for n, p in cfg.providers.items() if p.base_url == SIMULATED]
    if not sim:
        yield None
        return
    sim_cfg = pipeline_of(cfg).simulator_knobs(cfg, cfg.simulator or FakeConfig())
    server = FakeProviderServer(sim_cfg, host=host)
    server.start()
    for name in sim:
        p = cfg.providers[name]
        base = server.openai_base_url if p.kind == "openai" else server.anthropic_base_url
        # the simulator needs no key: do not demand one from the environment
        cfg.providers[name] = msgspec.structs.replace(p, base_url=base, api_key_env=None, api_key_file=None)
    try:
        yield server.url
    finally:
        server.stop()


def _snapshot(store: Store, run_dir: Path, record: RunRecord) -> None:
    data = msgspec.json.format(msgspec.json.encode(record), indent=2)
    with contextlib.suppress(OSError) if record.state != "running" else contextlib.nullcontext():
        store.put(RunLayout(record.run_id).record, data)  # the local record below says how it ended even so
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        atomic_write_bytes(run_dir / RECORD, data)
    except OSError as exc:  # a full disk has no room for a second copy: the run's state must still show
        if exc.errno != errno.ENOSPC:
            raise
        overwrite_in_place(run_dir / RECORD, msgspec.json.encode(record))  # compact: fits the old blocks


def finished(record: RunRecord, store: Store, stages: list[str]) -> bool:
    """The run finished with these stages and every stage's manifest is in the store: resuming it
    has nothing to do, so it answers from its record without starting any service."""
    return (
        record.state == "finished"
        and record.stages == stages
        and all(store.get(RunLayout(record.run_id).manifest(s)) is not None for s in stages)
    )


def _commit_spooled(store: Store, run_dir: Path, slog: Any) -> None:
    """Put the answers this machine's workers paid for but could not store (a long outage) into the cache."""
    spool = ResponseSpool(run_dir / SPOOL)
    if spool.pending():
        slog.info("spooled_answers_committed", answers=spool.commit(ResponseCache(store)))


@contextlib.contextmanager
def _services(
    cfg: RunConfig,
    opts: RunOptions,
    run_id: str,
    store: Store,
    *,
    check_keys: bool,
    keys_here: bool,
    sim_host: str,
    marks: dict[str, float],
) -> Iterator[tuple[str | None, _Ledger]]:
    """The simulator, the providers checked (a bad key stops the run before anything starts), the
    ledger, this driver's claim on the run id (a second driver of a running run stops here) and its
    mark on the store (a run with another ledger on the same store stops here)."""
    redis_url = opts.redis_url or cfg.run.redis_url
    if redis_url:  # cheap, and before the providers' SDKs are loaded (seconds on a busy machine)
        check_redis(redis_url)
    simulated = {n for n, p in cfg.providers.items() if p.base_url == SIMULATED}
    with _simulator(cfg, sim_host) as sim_url:
        if check_keys:
            # simulated providers are our own server in this process: nothing to find out; the others at once
            # (local workers share this machine's environment: a key missing here is missing there)
            real = {n: p for n, p in cfg.providers.items() if n not in simulated}
            check_providers(real, key_required=keys_here, file=cfg.source)
        marks["providers_checked"] = time.time()
        with (
            _redis(redis_url, Path(opts.runs_dir)) as conn,
            RunClaim(connect(conn.url), run_id) as claim,
            StoreGuard(store, conn.identity),
        ):
            conn.driver_claim = claim.value
            marks["ledger_up"] = time.time()
            yield sim_url, conn


class _LazyRay:
    """Connects the driver to the runs folder's local Ray head once it is up (``Coordinator.ray_start``):
    ``ray.init`` stays on the main thread, and a run that finishes before the head is up never waits for it.

    The head is started by the first call (``LocalRay.ready`` starts one if none runs), that is once the
    coordinator finds a stage the driver's own worker would not finish alone soon: a small run (the demo)
    never pays Ray's start, whose half-dozen processes would take the CPU from that worker on a small machine."""

    def __init__(self, head: LocalRay, settings: RaySettings, on_connect: Callable[[], None]) -> None:
        self.head = head
        self.settings = settings
        self.on_connect = on_connect
        self.connected = False

    def __call__(self, wait: bool) -> bool:
        if self.connected:
            return True
        if not wait and not self.head.ready():
            return False
        address = self.head.wait()
        self.head.auth_for_join()
        ensure_ray(msgspec.structs.replace(self.settings, address=address))  # joined, never owned: no shutdown
        self.connected = True
        self.on_connect()
        return True

    def close(self) -> None:
        """Disconnect (never a shutdown of the head: the keeper stops it after the linger), so that a process
        that runs again (a notebook's ``punchline.run``) joins the head then up instead of a stopped one."""
        if self.connected:
            self.connected = False
            shutdown_ray()


@contextlib.contextmanager
def _local_ray(runs_dir: str, settings: RaySettings, wanted: bool) -> Iterator[LocalRay | None]:
    """The runs folder's local Ray head, started (not waited for) if none runs; None when not ``wanted``."""
    if not wanted:
        yield None
        return
    with LocalRay(runs_dir, settings) as head:
        yield head


def run(
    config_path: str,
    opts: RunOptions,
    *,
    progress: ProgressFn | None = None,
    request_resources: RequestResources | None = None,
) -> RunRecord:
    marks = {"driver_start": time.time()}  # start-up phases, logged as one `start_phases` event
    # until the run's folder exists (below), log lines go where the run's will (stderr with --verbose), never to
    # stdout: that is for what a command prints on purpose
    configure_logging(None, console=opts.verbose)
    # the whole-run preflight (cluster/run_checks.py): nothing is created or paid before it passes
    check_options(opts)
    check_environment()
    cfg = load_config(config_path)  # every value range-checked: a bad config writes nothing
    max_cost = opts.max_cost_usd if opts.max_cost_usd is not None else cfg.run.max_cost_usd
    offline = opts.offline if opts.offline is not None else cfg.run.offline
    ray_address = opts.ray_address or cfg.run.ray_address
    check_address(ray_address)  # nothing listening there: one line now, not a hang after the ledger started
    ray_settings = RaySettings.from_env()
    if ray_address:
        ray_settings = msgspec.structs.replace(ray_settings, address=ray_address)
    check_run(cfg)  # every stage's inputs, settings against inputs, and models
    run_id = opts.run_id or new_run_id(cfg)
    run_dir = Path(opts.runs_dir) / run_id
    store_url = opts.store or config_store(cfg) or opts.runs_dir
    check_outputs(store_url, opts.runs_dir, opts.run_id)  # an unwritable store or a planted link stops here
    store = open_store(store_url)
    existing = read_store(store, RunLayout(run_id).record)  # a wrong key or bucket stops here, at once
    config_toml = redact_urls(Path(config_path).read_text())  # a password in [run] redis_url stays in the file
    stages = pipeline_stages(cfg)
    if existing is not None:
        prev = load_record(existing, f"{store.url}/{RunLayout(run_id).record}")
        if redact_urls(prev.config_toml) != config_toml:
            raise ConfigError(
                f"run {run_id} exists with a different config; start a new run id or restore the config "
                f"({prev.config_path})",
                file=config_path,
            )
        if finished(prev, store, [s.name for s in stages]):
            log.info("run_already_finished", run_id=run_id)
            return prev  # nothing to do: no service is started
    if not offline and ray_settings.is_local:  # local workers read their keys from this machine
        check_keys(cfg)
    marks["preflight_done"] = time.time()
    # on a cluster the simulator listens where the workers on other nodes can reach it
    sim_host = "127.0.0.1" if ray_settings.is_local else driver_node_ip()
    local = ray_settings.is_local
    # the driver works shards itself while the local Ray starts (not when this process has one already:
    # there is no start to overlap); the runs folder's head is found now (a resume's, the last run's) or
    # started once the driver's own worker is ready, and never waited for (cluster/local_ray.py)
    local_first = local and not ray_running()
    with (
        # the services first: their checks (the ledger's URL, the providers' keys) refuse before anything is
        # written, the folder's Ray head included
        _services(
            cfg, opts, run_id, store, check_keys=not offline, keys_here=local, sim_host=sim_host, marks=marks
        ) as (sim_url, conn),
        _local_ray(opts.runs_dir, ray_settings, local_first) as head,
    ):
        run_dir.mkdir(parents=True, exist_ok=True)
        configure_logging(run_dir, console=opts.verbose)
        slog = log.bind(run_id=run_id)
        if not ray_settings.is_local:  # the store check below asks every node of the cluster
            ensure_ray(ray_settings)
        sentinel = ensure_shared(store, run_id, local_ray=ray_settings.is_local)  # before any paid call
        services = Services(
            redis_url=conn.public_url,
            redis_password_file=conn.password_file,
            store_url=store.url,
            ray_address=ray_address,
            simulator_url=sim_url,
        )
        record = RunRecord(
            run_id=run_id,
            pipeline=cfg.run.pipeline,
            config_path=str(config_path),
            config_toml=config_toml,
            created_at=time.time(),
            services=services,
            stages=[s.name for s in stages],
            driver_host=socket.gethostname(),
            driver_pid=os.getpid(),
        )
        if existing is not None:
            record.created_at = load_record(existing, f"{store.url}/{RunLayout(run_id).record}").created_at
        _snapshot(store, run_dir, record)
        _commit_spooled(store, run_dir, slog)  # answers paid before an earlier session lost the store
        ledger = Ledger(connect(conn.url))
        worker_cfg = WorkerConfig(
            run_id=run_id,
            redis_url=conn.public_url,  # the password stays on this machine (see resolve_url)
            redis_password_file=conn.password_file,
            store_url=store.url,  # absolute: a worker's cwd is not the driver's
            providers=cfg.providers,
            lease_ms=cfg.run.lease_ms,
            offline=offline,
            max_cost_usd=max_cost,
            log_path=str((run_dir / LOG).resolve()),
            spool_dir=str((run_dir / SPOOL).resolve()),
            max_in_flight=cfg.run.units_in_flight,
            store_sentinel=sentinel,
            driver_claim=conn.driver_claim,
        )
        ctx = StageContext(cfg, run_id, store)

        def ray_connected() -> None:
            marks["ray_up"] = time.time()
            slog.info("start_phases", **{k: round(v, 3) for k, v in marks.items()})

        lazy_ray = _LazyRay(head, ray_settings, ray_connected) if head is not None else None
        coord = Coordinator(
            ctx=ctx,
            ledger=ledger,
            worker_cfg=worker_cfg,
            shard_size=cfg.run.shard_size,
            workers_per_node=cfg.run.workers_per_node,
            worker_cpus=cfg.run.worker_cpus,
            progress=progress,
            local_first=local_first,
            ray_start=lazy_ray,
            warm_imports=sorted({m for stage in stages for m in getattr(stage, "warm_imports", ())}),
            autoscaler=autoscale.for_run(
                cfg.run.max_workers,
                cfg.run.workers_per_node,
                cfg.run.worker_cpus,
                flag=opts.max_workers,
                request_resources=request_resources or _ray_request_resources,
            ),
        )
        slog.info("run_start", stages=record.stages, store=store.url)
        shipper = LogShipper(store, run_id, run_dir / LOG).start()  # the log beside run.json in the store
        metrics = serve_driver_metrics(opts.metrics_port, record, ledger, run_dir / LOG)  # --metrics-port
        try:
            if lazy_ray is None:  # a cluster's Ray was joined above, or this process had one
                slog.info("start_phases", **{k: round(v, 3) for k, v in marks.items()})
            for stage in stages:
                if coord.stage_done(stage.name):
                    slog.info("stage_skipped", stage=stage.name, reason="manifest present")
                    record.artifacts += _manifest_artifacts(store, run_id, stage.name)
                    continue
                # each stage begins with the driver's own worker while the local Ray starts; the coordinator
                # connects (on this, the main, thread: cluster/local_worker.py says why) and adds Ray's
                # workers once the head is up; a stage whose shards are all committed is reduced without Ray
                working = lazy_ray is not None and not lazy_ray.connected and coord.start_local(stage) == "working"
                if working and "local_worker_started" not in marks:  # the phases so far: Ray comes later, or never
                    marks["local_worker_started"] = time.time()
                    slog.info("start_phases", **{k: round(v, 3) for k, v in marks.items()})
                artifacts, failures = coord.run_stage(stage)
                record.artifacts += artifacts
                record.counters[stage.name] = with_store_totals(
                    patiently(ledger.counters, run_id, stage.name), coord.store_usage[stage.name]
                )
                record.failures.pop(stage.name, None)
                if failures:
                    record.failures[stage.name] = failures
                _snapshot(store, run_dir, record)
            record.state = "finished" if not record.failures else "failed"
        except BaseException as exc:
            record.state = "budget" if isinstance(exc, BudgetExceeded) else "failed"
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):  # Ctrl-C; SIGTERM (Ray's handler exits):
                record.state = "interrupted"  # `punchline stop`, `ray job stop`, a deleted pod
                exc.run_id = run_id  # type: ignore[union-attr]  # for the resume command the CLI prints
            if isinstance(exc, PluginError):
                exc.run_id = run_id  # the pipeline's bug: resumed once fixed
            with contextlib.suppress(Exception):  # how it ended, at once: stopping the workers below can outlast
                _snapshot(store, run_dir, record)  # the grace a `ray job stop` gives before its SIGKILL
            raise
        finally:
            coord.close()
            for name in record.stages:
                with contextlib.suppress(Exception):
                    counters = ledger.counters(run_id, name)
                    done = coord.store_usage.get(name)
                    record.counters[name] = with_store_totals(counters, done) if done else counters
            with contextlib.suppress(Exception):
                record.usage = usage_rows(Budget(ledger.r, run_id, None).usage(), coord.store_usage)
            record.finished_at = time.time()
            with contextlib.suppress(Exception):
                _snapshot(store, run_dir, record)
            slog.info("run_end", state=record.state)
            shipper.close()
            if metrics is not None:
                metrics.close()
            if lazy_ray is not None:
                lazy_ray.close()
    return record


def _ray_request_resources(*, bundles: list[dict[str, float]]) -> Any:
    """Ray's ``request_resources``, imported when first asked (after Ray started), not before the first call."""
    return autoscale.ray_request_resources()(bundles=bundles)


def _manifest_artifacts(store: Store, run_id: str, stage: str) -> list[str]:
    raw = store.get(RunLayout(run_id).manifest(stage))
    if raw is None:
        return []
    return msgspec.json.decode(raw, type=StageManifest).artifacts
