"""The whole-run preflight: everything a run will need, checked before anything is created or paid.

A mistake found after the first paid call costs money (a 10-joke config once paid 101 calls
before its cloze stage refused it), and one found after the run folder or the ledger exists leaves
litter behind. So ``punchline run`` (and ``plan``, with the same checks) first checks, in this
order and without touching the network or the disk beyond reading:

1. the run id (``--run-id``), then the config (ranges, providers named by stages:
   :func:`punchline.cluster.config.load_config`);
2. flags and environment variables over it (``--max-workers``, ``--store``, ``PUNCHLINE_MAX_WORKERS``, ...),
   the cluster address and every folder the run will write: :func:`check_options`, the one place a run's
   options are checked (each goes one way, downwards, from here);
3. every input file of every stage, and every stage's settings against those inputs (the
   pipeline's ``check_inputs``: e.g. enough jokes for the cloze pairs);
4. every stage's units as ``plan`` expands them (earlier artifacts missing: the pipeline's upper
   bound), so any model a stage would call must be a configured model with both prices declared (0
   written out for a free one; an offline run needs none): an unknown nickname would otherwise go to
   the provider as a model id, and a price left out would be $0, out of the budget's sight;
5. the API keys the local workers will read (a key file that is missing or empty).

Each mistake is one line naming the file, record or field (ConfigError / InputError, exit 2).
Services (the store, Redis, the providers' endpoints) are checked afterwards by
:mod:`punchline.cluster.run.preflight`, still before the run folder or the ledger is made.
"""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path

from punchline.cluster.config import SIMULATED, RunConfig, check_service_urls
from punchline.cluster.estimate.call_time import Latencies
from punchline.cluster.estimate.request_ratios import Ratios
from punchline.cluster.estimate.wall_estimate import CacheLookup
from punchline.cluster.ray_cluster.ray_runtime import check_address
from punchline.cluster.registry import pipeline_of
from punchline.cluster.run.planner import StageEstimate, plan_run
from punchline.cluster.run.run_options import RunOptions
from punchline.cluster.run.store_guard import PREFIX as STORE_MARKS
from punchline.data import settings as env_registry
from punchline.data.errors import ConfigError, LedgerUnavailable
from punchline.data.storage.response_cache import CACHE_PREFIX
from punchline.data.storage.run_layout import LOG, RECORD, SPOOL
from punchline.data.stores.local import TMP_DIR
from punchline.schedulers.server.redis_client import control_characters
from punchline.services.private_files import check_folder_files


def check_options(opts: RunOptions, cfg: RunConfig, store_url: str) -> None:
    """Flags and the environment variables behind them (over the loaded config), checked like the config: their
    values, every folder the run will write (:func:`check_outputs`), the cluster's address and the services'
    URLs. The run id was checked first, by the driver: the folders here are read under it. Each check below
    sends an option one way, down to the module that knows its form (the walk of a run's options visits
    every module once)."""
    if opts.max_cost_usd is not None and not (math.isfinite(opts.max_cost_usd) and 0 <= opts.max_cost_usd <= 1e9):
        raise ConfigError(f"must be a finite number of dollars >= 0, got {opts.max_cost_usd}", field="--max-cost-usd")
    if opts.store is not None:
        local = Path(opts.store).expanduser() if "://" not in opts.store else None
        if local is not None and local.exists() and not local.is_dir():
            raise ConfigError("is a file, not a folder", file=opts.store, field="--store / PUNCHLINE_STORE")
    if not opts.runs_dir.strip():
        raise ConfigError("is empty: give a folder (default runs)", field="--runs-dir / PUNCHLINE_RUNS_DIR")
    runs = Path(opts.runs_dir)
    if runs.exists() and not runs.is_dir():
        raise ConfigError("is a file, not a folder", file=str(runs), field="--runs-dir")
    if opts.run_id is not None and (runs / opts.run_id).exists() and not (runs / opts.run_id).is_dir():
        raise ConfigError("is a file, not a run's folder", file=str(runs / opts.run_id), field="--run-id")
    check_outputs(store_url, opts.runs_dir, opts.run_id)  # an unwritable store or a planted link stops here
    check_address(opts.ray_address or cfg.run.ray_address)  # nothing listening there: one line now, not a hang
    check_service_urls(  # their form, before anything connects
        [(opts.store, "--store / PUNCHLINE_STORE"), (opts.redis_url, "--redis-url / PUNCHLINE_REDIS_URL")]
    )
    if opts.max_workers is not None:
        env_registry.MAX_WORKERS.check(opts.max_workers, "--max-workers")


def check_outputs(store_url: str, runs_dir: str, run_id: str | None = None) -> None:
    """Every folder the run will write (the runs folder, where ``_ledger`` and the run's folder go, and a
    local store) is a folder it can create or write in, before any of them is created; and nothing the run
    writes or reads back in the runs folder is a link (:func:`check_run_files`)."""
    places = [(runs_dir, "--runs-dir / PUNCHLINE_RUNS_DIR")]
    if "://" not in store_url:
        places.append((store_url, STORE_FIELD))
    for place, field in places:
        problem = _unwritable(Path(place).expanduser())
        if problem is not None:
            raise ConfigError(problem, file=place, field=field)
    if "://" not in store_url:
        check_store_folders(Path(store_url).expanduser(), run_id)
    check_run_files(Path(runs_dir).expanduser(), run_id)


STORE_FIELD = "--store / PUNCHLINE_STORE / [run] store"
# the folders of a local store a run writes into as it starts (the store's temp files, the ledgers' marks, the
# response cache): a file or an unwritable folder in place of one refused the run only once its ledger had started
STORE_FOLDERS = (TMP_DIR, STORE_MARKS.rstrip("/"), CACHE_PREFIX.rstrip("/"))


def check_store_folders(store: Path, run_id: str | None) -> None:
    """Each folder a run writes in a local store (``STORE_FOLDERS`` and the run's own) is a folder it can write
    (a link to one is fine: the store root may be one too), or does not exist yet. One line naming it (exit 2),
    before the runs folder or the ledger is created."""
    for name in (*STORE_FOLDERS, *((run_id,) if run_id is not None else ())):
        path = store / name
        if not os.path.lexists(path):
            continue
        if not path.is_dir():
            problem = "is not a folder (the store keeps its keys under it): remove it"
        elif not os.access(path, os.W_OK | os.X_OK):
            problem = "is a folder of the store this user cannot write"
        else:
            continue
        raise ConfigError(problem, file=str(path), field=STORE_FIELD)


# what the runs folder holds for a run: its record, its log (appended to by every worker on this machine),
# and its spool of paid answers the store could not take (read back into the store on resume)
RUN_FILES = (RECORD, LOG)
RUN_FOLDERS = (SPOOL,)


def check_run_files(runs: Path, run_id: str | None) -> None:
    """The runs folder's own entries are ours and none is a link (a link would have the run append its log,
    or read "paid answers", through it): ``_ledger`` and everything in it (the server's files, its AOF),
    ``_ray``, and the run's folder, ``run.json``, ``log.jsonl``, ``spool/`` and its files. One line naming
    the entry (exit 2), before anything is created or started."""
    for name in ("_ledger", "_ray"):
        _own(runs / name, folder=True)
    if run_id is not None:
        run_dir = runs / run_id
        _own(run_dir, folder=True)
        for name in RUN_FILES:
            _own(run_dir / name, folder=False)
        for name in RUN_FOLDERS:
            if _own(run_dir / name, folder=True):
                for entry in sorted((run_dir / name).iterdir()):
                    _own(entry, folder=False)
    try:
        check_folder_files(runs / "_ledger")
    except LedgerUnavailable as exc:
        raise ConfigError(str(exc), file=str(runs / "_ledger"), field="--runs-dir") from None


def _own(path: Path, *, folder: bool) -> bool:
    """Whether ``path`` exists; refuses it (ConfigError) when it is a link, not of its kind, or not ours."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    kind = "folder" if folder else "file"
    if stat.S_ISLNK(st.st_mode):
        problem = f"is a symbolic link; the run never writes or reads through links: remove it (a real {kind})"
    elif not (stat.S_ISDIR(st.st_mode) if folder else stat.S_ISREG(st.st_mode)):
        problem = f"is not a {kind}: remove it"
    elif st.st_uid != os.getuid():
        problem = f"is owned by uid {st.st_uid}, not by this user: remove it"
    else:
        return True
    raise ConfigError(problem, file=str(path), field="--runs-dir")


def _unwritable(path: Path) -> str | None:
    """Why nothing can be written at ``path`` (its nearest existing folder is a file or not writable)."""
    probe = path.absolute()
    while not probe.exists() and probe != probe.parent:
        if probe.is_symlink():
            return f"cannot be created: {probe} is a broken link"
        probe = probe.parent
    if not probe.is_dir():
        return f"cannot be created: {probe} is a file, not a folder"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"cannot be written: {probe} is not writable"
    return None


def check_environment() -> None:
    """The ``PUNCHLINE_*`` variables the driver and its workers read, decoded now rather than mid-run
    (every variable of :mod:`punchline.data.settings` that is set)."""
    env_registry.check_environment()
    for var in env_registry.ENV_VARS:  # URLs, addresses and paths: a newline or a tab in one is always a mistake
        text = os.environ.get(var.name) if var.kind == "str" else None
        if text and control_characters(text):
            shown = "the value" if var.secret else repr(text)
            raise ConfigError(f"{shown} contains a control character (a newline, a tab...)", field=var.name)


def check_keys(cfg: RunConfig) -> None:
    """The key of every provider a stage calls, as the workers on this machine will read it."""
    used = {name for _, name in pipeline_of(cfg).provider_refs(cfg.settings)}
    for name in sorted(used):
        settings = cfg.providers[name]
        if settings.base_url == SIMULATED:
            continue  # the simulator needs no key
        settings.api_key(name)


def cap_warning(cfg: RunConfig, estimates: list[StageEstimate], cap_usd: float | None = None) -> str | None:
    """A warning when the run's cap (``cap_usd``, else ``[run] max_cost_usd``) is below what ``plan`` estimates
    the run costs as configured (each stage's mode, batches at the batch price): the run would stop at the cap
    with requests unanswered. The estimate is an upper bound (``max_tokens`` per answer), so a run may well fit."""
    cap = cap_usd if cap_usd is not None else cfg.run.max_cost_usd
    total = sum(e.mode_cost_usd for e in estimates)
    if cap is None or total <= cap:
        return None
    return (
        f"max_cost_usd ${cap:g} is below the estimate of ${total:.4g} (an upper bound, batches at the batch price): "
        "the run stops creating batches and starting units at the cap, leaving requests unanswered"
    )


def check_run(
    cfg: RunConfig,
    latencies: Latencies | None = None,
    cached: CacheLookup | None = None,
    ratios: Ratios | None = None,
    distinct: bool = False,
) -> list[StageEstimate]:
    """Steps 3 and 4 (``plan``'s checks): the inputs, the settings against them, every stage's units (each model
    configured and priced: ``planner.check_model``). Returns the plan, its calls timed by ``latencies`` (the ones
    the runs folder measured) and its requests counted as ``plan`` asks (``planner.plan_run``), so ``plan`` does
    not expand it twice."""
    pipeline_of(cfg).check_inputs(cfg)
    return plan_run(cfg, cached, latencies, ratios=ratios, distinct=distinct)
