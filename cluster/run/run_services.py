"""The services one run holds open (the simulated provider, the ledger, this driver's claim on the run id, the
store's mark, the runs folder's Ray head, the log shipper, ``/metrics``), opened once and closed in one place.

``cluster/run/driver.py`` then reads as the run does: preflight → open the services → run the stages → record how it
ended. Opening them is ordered so that every check that can refuse (the ledger's URL, the providers' keys, a second
driver of the same run, a store marked by another ledger) refuses before anything is written; closing them is the
reverse, by one :class:`contextlib.ExitStack`.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import unquote, urlsplit

import msgspec
import structlog

from punchline.cluster.config import SIMULATED, RunConfig
from punchline.cluster.pipeline import Stage
from punchline.cluster.ray_cluster.ray_runtime import ensure_ray, shutdown_ray
from punchline.cluster.ray_cluster.shared_store import ensure_shared
from punchline.cluster.records.metrics import serve_driver_metrics
from punchline.cluster.records.run_log import LogShipper
from punchline.cluster.records.run_record import RunRecord, Services
from punchline.cluster.registry import pipeline_of
from punchline.cluster.run.preflight import check_providers, check_redis
from punchline.cluster.run.store_guard import StoreGuard, redis_identity
from punchline.data.errors import InfraError, LedgerFailed
from punchline.data.redaction import redact_url
from punchline.data.simulator import FakeConfig
from punchline.data.storage.jsonio import atomic_write_bytes, overwrite_in_place
from punchline.data.storage.response_cache import ResponseCache
from punchline.data.storage.response_spool import ResponseSpool
from punchline.data.storage.run_layout import LOG, RECORD, SPOOL, RunLayout
from punchline.data.store import Store
from punchline.schedulers.ledger import Ledger
from punchline.schedulers.run_claim import RunClaim
from punchline.schedulers.server.ledger_access import check_loaded
from punchline.schedulers.server.redis_client import connect, credentials_in_userinfo
from punchline.services.local_ray import LocalRay, notice
from punchline.services.local_redis import LocalRedis
from punchline.services.ray_settings import RaySettings
from punchline.workers.logs import configure_logging
from punchline.workers.shard_worker import WorkerConfig

log = structlog.get_logger("punchline.driver")


@dataclass
class Prepared:
    """What the driver's preflight settled: the config, the run's id and folder, the store, the stages, and
    where Ray runs. Nothing of it is a service yet (opening one is :class:`RunServices`'s job)."""

    cfg: RunConfig
    run_id: str
    run_dir: Path
    store: Store
    stages: list[Stage]
    config_path: str
    config_toml: str  # the config as recorded: passwords in URLs redacted
    ray_settings: RaySettings
    ray_address: str | None
    offline: bool
    max_cost_usd: float | None
    created_at: float | None = None  # a resumed run keeps the time it was first created
    marks: dict[str, float] = field(default_factory=dict)  # start-up phases, logged as one `start_phases` event
    # the run's options as the flags over the config settled them (cluster/run/driver.py RunOptions): read here,
    # never from the options again
    redis_url: str | None = None  # None: the runs folder's embedded Redis
    runs_dir: str = "runs"
    verbose: bool = False
    metrics_port: int | None = None
    ray_dashboard_port: int | None = None
    max_workers: int | None = None  # --max-workers over [run] max_workers (the autoscaler's bound)
    calls_later: dict[str, bool] = field(default_factory=dict)  # per stage: does a later one call a provider
    runnable_others: float | None = (
        None  # other tasks runnable as the driver started (cluster/estimate/machine_load.py)
    )

    @property
    def local(self) -> bool:
        return self.ray_settings.is_local


class RedisConn(msgspec.Struct, kw_only=True):
    """The run's Redis as this process connects to it (``url``) and as it may be shown (``public_url``)."""

    url: str
    public_url: str
    password_file: str | None = None
    identity: str = ""  # what the store records as its ledger (cluster/run/store_guard.py): never a password
    driver_claim: str | None = None  # this driver's claim on the run id, watched by its workers


def check_ledger(url: str) -> None:
    """A user's own Redis (``--redis-url``), before anything starts (``run``, and ``plan`` as run would): it answers
    with these credentials, and it holds the engine's scripts or lets this user load them. A Redis set up as
    ``docs/deploy.md`` says lets the run's user load nothing: its scripts are loaded by its loader user, after every
    restart of it; without them a run's workers could only wait, so the run is refused at once, saying how."""
    check_redis(url)
    client = connect(url)
    try:
        check_loaded(client, url)
    finally:
        client.close()


@contextlib.contextmanager
def open_redis(url: str | None, runs_dir: Path) -> Iterator[RedisConn]:
    """The run's Redis: the given URL (checked by the caller: a wrong password or certificate stops
    the run at once), else the runs folder's shared embedded ledger (started by the first driver,
    stopped when the last one leaves)."""
    if url:
        url = credentials_in_userinfo(url)  # ?password= too: workers get it redacted, never in their arguments
        with _password_file(url) as password_file:
            yield RedisConn(
                url=url, public_url=redact_url(url), password_file=password_file, identity=redis_identity(url)
            )
        return
    with LocalRedis(runs_dir) as shared:  # restarted from its AOF if it dies; LedgerFailed if it cannot be
        log.info("ledger_joined", url=shared.public_url, started=shared.started)
        try:
            yield RedisConn(
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


# loaded by name, when a provider is simulated: a run against real endpoints carries none of the simulator's modules
SIMULATOR = "punchline.workers.fake.for_run"


@contextlib.contextmanager
def open_simulator(cfg: RunConfig, host: str = "127.0.0.1") -> Iterator[str | None]:
    """Start the offline simulated provider if any provider's base_url says ``simulated``, listening on
    ``host`` (on a cluster the driver node's address, so that workers on other nodes reach it)."""
    sim = [n for n, p in cfg.providers.items() if p.base_url == SIMULATED]
    if not sim:
        yield None
        return
    pipeline = pipeline_of(cfg)
    sim_cfg = pipeline.simulator_knobs(cfg, cfg.simulator or FakeConfig())
    start = importlib.import_module(SIMULATOR).start_simulator
    server = start(sim_cfg, pipeline.stages(cfg), cfg, cfg.source, host=host)
    try:
        for name in sim:
            p = cfg.providers[name]
            base = server.base_url_for(p.kind, record=f"providers.{name}", file=cfg.source)  # the kind's own wire
            # the simulator needs no key: do not demand one from the environment
            cfg.providers[name] = msgspec.structs.replace(p, base_url=base, api_key_env=None, api_key_file=None)
        yield server.url
    finally:
        server.stop()


@contextlib.contextmanager
def open_checked(
    prep: Prepared, redis_url: str | None, runs_dir: str, *, check_keys: bool, sim_host: str
) -> Iterator[tuple[str | None, RedisConn]]:
    """The simulator, the providers checked (a bad key stops the run before anything starts), the
    ledger, this driver's claim on the run id (a second driver of a running run stops here) and its
    mark on the store (a run with another ledger on the same store stops here)."""
    cfg = prep.cfg
    if redis_url:  # cheap, and before the providers' SDKs are loaded (seconds on a busy machine)
        check_ledger(redis_url)
    simulated = {n for n, p in cfg.providers.items() if p.base_url == SIMULATED}
    with open_simulator(cfg, sim_host) as sim_url:
        if check_keys:
            # simulated providers are our own server in this process: nothing to find out; the others at once
            # (local workers share this machine's environment: a key missing here is missing there)
            real = {n: p for n, p in cfg.providers.items() if n not in simulated}
            check_providers(real, key_required=prep.local, file=cfg.source)
        prep.marks["providers_checked"] = time.time()
        with (
            open_redis(redis_url, Path(runs_dir)) as conn,
            RunClaim(connect(conn.url), prep.run_id) as claim,
            StoreGuard(prep.store, conn.identity),
        ):
            conn.driver_claim = claim.value
            prep.marks["ledger_up"] = time.time()
            yield sim_url, conn


class LazyRay:
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


def snapshot(store: Store, run_dir: Path, record: RunRecord) -> None:
    """The run's record, in the store and in the run's local folder (the local one says how it ended even when
    the store cannot be written: a full disk gets a compact copy over the old blocks)."""
    data = msgspec.json.format(msgspec.json.encode(record), indent=2)
    with contextlib.suppress(OSError) if record.state != "running" else contextlib.nullcontext():
        store.put(RunLayout(record.run_id).record, data)
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        atomic_write_bytes(run_dir / RECORD, data)
    except OSError as exc:  # a full disk has no room for a second copy: the run's state must still show
        if exc.errno != errno.ENOSPC:
            raise
        overwrite_in_place(run_dir / RECORD, msgspec.json.encode(record))  # compact: fits the old blocks


def snapshot_at_end(store: Store, run_dir: Path, record: RunRecord) -> None:
    """:func:`snapshot` when the run is ending anyway: a store or ledger that fails now is logged, not raised
    over the error that ended the run."""
    try:
        snapshot(store, run_dir, record)
    except (OSError, InfraError) as exc:
        log.warning("run_record_not_written", run_id=record.run_id, state=record.state, error=str(exc))


class RunServices:
    """The run's services, opened in order by ``with`` and closed in reverse by one exit stack.

    Inside: ``record`` (written to the store), ``ledger``, ``worker_cfg`` (what every worker of the run gets),
    ``lazy_ray`` (None when this process does not start the runs folder's head) and ``log`` (bound to the run)."""

    def __init__(self, prep: Prepared, *, local_first: bool, sim_host: str) -> None:
        self.prep = prep
        self.redis_url = prep.redis_url
        self.runs_dir = prep.runs_dir
        self.verbose = prep.verbose
        self.metrics_port = prep.metrics_port
        self.ray_dashboard_port = prep.ray_dashboard_port
        self.local_first = local_first
        self.sim_host = sim_host
        self._stack = contextlib.ExitStack()
        self.lazy_ray: LazyRay | None = None

    def __enter__(self) -> RunServices:
        try:
            self._open()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stack.__exit__(kind, exc, tb)

    def _open(self) -> None:
        prep, stack = self.prep, self._stack
        # the services first: their checks (the ledger's URL, the providers' keys) refuse before anything is
        # written, the folder's Ray head included
        sim_url, conn = stack.enter_context(
            open_checked(prep, self.redis_url, self.runs_dir, check_keys=not prep.offline, sim_host=self.sim_host)
        )
        head = None
        if self.local_first:
            head = stack.enter_context(LocalRay(self.runs_dir, prep.ray_settings, self.ray_dashboard_port))
            if head.dashboard_port is not None:
                head.start()  # the dashboard was asked for: the head starts now, not only once a stage needs Ray
        elif self.ray_dashboard_port is not None:
            used = f"it joins the Ray at {prep.ray_address}" if prep.ray_address else "Ray runs in this process already"
            notice(f"--ray-dashboard: this run uses no head of the runs folder ({used}): no dashboard started")
        prep.run_dir.mkdir(parents=True, exist_ok=True)
        configure_logging(prep.run_dir, console=self.verbose)
        self.log = log.bind(run_id=prep.run_id)
        if not prep.local:  # the store check below asks every node of the cluster
            ensure_ray(prep.ray_settings)
        sentinel = ensure_shared(prep.store, prep.run_id, local_ray=prep.local)  # before any paid call
        self.record = self._new_record(sim_url, conn)
        snapshot(prep.store, prep.run_dir, self.record)
        self._commit_spooled()  # answers paid before an earlier session lost the store
        self.ledger = Ledger(connect(conn.url))
        self.worker_cfg = self._worker_config(conn, sentinel)
        if head is not None:
            self.lazy_ray = LazyRay(head, prep.ray_settings, self._ray_connected)
            stack.callback(self.lazy_ray.close)
        metrics = serve_driver_metrics(self.metrics_port, self.record, self.ledger, prep.run_dir / LOG)
        if metrics is not None:
            stack.callback(metrics.close)
        shipper = LogShipper(prep.store, prep.run_id, prep.run_dir / LOG).start()  # the log beside run.json
        stack.callback(shipper.close)

    def _new_record(self, sim_url: str | None, conn: RedisConn) -> RunRecord:
        prep = self.prep
        services = Services(
            redis_url=conn.public_url,
            redis_password_file=conn.password_file,
            store_url=prep.store.url,
            ray_address=prep.ray_address,
            simulator_url=sim_url,
        )
        return RunRecord(
            run_id=prep.run_id,
            pipeline=prep.cfg.run.pipeline,
            config_path=prep.config_path,
            config_toml=prep.config_toml,
            created_at=prep.created_at or time.time(),
            services=services,
            stages=[s.name for s in prep.stages],
            driver_host=socket.gethostname(),
            driver_pid=os.getpid(),
        )

    def _worker_config(self, conn: RedisConn, sentinel: Any) -> WorkerConfig:
        prep, run = self.prep, self.prep.cfg.run
        return WorkerConfig(
            run_id=prep.run_id,
            redis_url=conn.public_url,  # the password stays on this machine (see resolve_url)
            redis_password_file=conn.password_file,
            store_url=prep.store.url,  # absolute: a worker's cwd is not the driver's
            providers=prep.cfg.providers,
            lease_ms=run.lease_ms,
            offline=prep.offline,
            max_cost_usd=prep.max_cost_usd,
            log_path=str((prep.run_dir / LOG).resolve()),
            spool_dir=str((prep.run_dir / SPOOL).resolve()),
            max_in_flight=run.units_in_flight,
            store_sentinel=sentinel,
            driver_claim=conn.driver_claim,
        )

    def _commit_spooled(self) -> None:
        """Put the answers this machine's workers paid for but could not store (a long outage) into the cache."""
        spool = ResponseSpool(self.prep.run_dir / SPOOL)
        if spool.pending():
            self.log.info("spooled_answers_committed", answers=spool.commit(ResponseCache(self.prep.store)))

    def _ray_connected(self) -> None:
        self.prep.marks["ray_up"] = time.time()
        self.log_phases()

    def log_phases(self) -> None:
        marks = {k: round(v, 3) for k, v in self.prep.marks.items()}
        self.log.info("start_phases", **marks, runnable_others=self.prep.runnable_others)

    def snapshot(self) -> None:
        snapshot(self.prep.store, self.prep.run_dir, self.record)
