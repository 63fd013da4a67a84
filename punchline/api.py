"""The Python API, for notebooks and scripts: ``punchline.run(config)`` and ``punchline.status(run_id)``.

The same engine as ``punchline run``, with the same guarantees (exactly-once, resume by run id, the
response cache), called without a shell: keyword arguments are the command's flags, and the
environment fills in what they leave out (``PUNCHLINE_REDIS_URL``, ``PUNCHLINE_STORE``, ...). Nothing
is printed: the run's log goes to ``<runs_dir>/<run id>/log.jsonl``, bad input raises
:class:`~punchline.data.errors.ConfigError` / :class:`~punchline.data.errors.InputError`, a failing
service an :class:`~punchline.data.errors.InfraError`, a spent budget
:class:`~punchline.data.errors.BudgetExceeded`: all :class:`~punchline.data.errors.PunchlineError`.
The result is the run's :class:`~punchline.cluster.driver.RunRecord` (a msgspec Struct, also kept as
``run.json``): run id, state, artifacts, counters per stage, usage per (stage, model), failures.
"""

from __future__ import annotations

import os

import structlog

from punchline.cluster.coordinator import ProgressFn
from punchline.cluster.driver import RunOptions, RunRecord
from punchline.cluster.driver import run as run_driver
from punchline.cluster.runs import load_run_record
from punchline.data.settings import overlay

__all__ = ["RunRecord", "artifact_url", "run", "status"]


def run(
    config: str | os.PathLike[str],
    *,
    run_id: str | None = None,
    store: str | None = None,
    runs_dir: str | None = None,
    redis_url: str | None = None,
    ray_address: str | None = None,
    max_cost_usd: float | None = None,
    max_workers: int | None = None,
    offline: bool | None = None,
    progress: ProgressFn | None = None,
) -> RunRecord:
    """Run (or, with the ``run_id`` of an earlier run, resume) the pipeline of the config file
    ``config``; returns when the run ends. ``state`` is ``finished``, or ``failed`` when some units
    failed (``failures`` names them; ``punchline retry-failed`` retries them). ``progress(stage,
    counters)`` is called as shards commit."""
    opts = overlay(
        RunOptions.from_env(),
        run_id=run_id,
        store=store,
        runs_dir=runs_dir,
        redis_url=redis_url,
        ray_address=ray_address,
        max_cost_usd=max_cost_usd,
        max_workers=max_workers,
        offline=offline,
    )
    if not structlog.is_configured():  # until the driver sends its log to log.jsonl: not to stdout
        structlog.configure(logger_factory=structlog.ReturnLoggerFactory())
    return run_driver(os.fspath(config), opts, progress=progress)


def status(run_id: str, *, runs_dir: str | None = None, store: str | None = None) -> RunRecord:
    """The record of run ``run_id``: from ``<runs_dir>/<run_id>/run.json``, else (a run submitted as a
    Ray job) from ``store``; a run whose driver on this machine is gone says ``interrupted``."""
    opts = overlay(RunOptions.from_env(), runs_dir=runs_dir, store=store)
    record: RunRecord = load_run_record(opts.runs_dir, run_id, opts.store)
    if record.driver_gone():
        record.state = "interrupted"
    return record


def artifact_url(record: RunRecord, name: str) -> str:
    """Where the run's artifact ``name`` is: a path under a local store, or an ``s3://`` URL."""
    return f"{record.services.store_url.rstrip('/')}/{record.run_id}/artifacts/{name}"
