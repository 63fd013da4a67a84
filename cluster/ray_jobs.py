"""Running a pipeline as a Ray job: what ``punchline submit | jobs | logs | stop`` do, without printing.

A submitted run is a Ray job whose entrypoint is ``python -m punchline run CONFIG --run-id ID …`` on
the head node, so the driver is managed by Ray (it survives the laptop or the ``kubectl exec`` session
that started it) and its output is the job's log. The job's ``runtime_env`` carries only a
``working_dir`` holding the config and the input files it names (staged under their paths relative
to each other, so the config's relative paths still resolve); the code is the ``punchline``
installed in the cluster's image, never the submitter's checkout, and nothing from the submitter's
environment is sent. Secrets never go into the entrypoint or the runtime_env (Ray stores both in the
GCS and shows them on the dashboard): a ``--redis-url`` with a password is refused, the nodes take
it from their own environment (``PUNCHLINE_REDIS_URL`` from a Secret or SSM).

Resuming is submitting the same config with the same run id: the run continues from Redis and the
store (finished stages skipped, committed shards kept, cached answers free).
"""

from __future__ import annotations

import logging
import os
import secrets
import shlex
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec

from punchline.cluster.config import RunConfig, load_config
from punchline.cluster.registry import pipeline_of
from punchline.data.errors import ConfigError, InfraError, InputError

DEFAULT_ADDRESS = "http://127.0.0.1:8265"
ADDRESS_ENV = ("PUNCHLINE_JOBS_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")
RUN_ID_KEY = "punchline_run_id"  # job metadata: which run a job drives
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})


class SubmitOptions(msgspec.Struct, kw_only=True):
    """What ``punchline submit`` passes on to the job's ``punchline run`` (never a secret)."""

    store: str | None = None
    redis_url: str | None = None
    max_workers: int | None = None
    max_cost_usd: float | None = None
    offline: bool = False
    python: str = "python"  # the interpreter on the cluster with punchline installed


class JobRow(msgspec.Struct, kw_only=True):
    job_id: str
    status: str
    run_id: str
    entrypoint: str
    start_time_s: float | None = None
    end_time_s: float | None = None
    message: str = ""


def jobs_address(flag: str | None, env: dict[str, str] | None = None) -> str:
    """``--address``, else ``PUNCHLINE_JOBS_ADDRESS``, ``RAY_API_SERVER_ADDRESS``, an http(s)
    ``RAY_ADDRESS``, else the dashboard on this machine."""
    if flag:
        return flag
    source = os.environ if env is None else env
    for name in ADDRESS_ENV:
        value = source.get(name, "").strip()
        if value and (name != "RAY_ADDRESS" or value.startswith(("http://", "https://"))):
            return value
    return DEFAULT_ADDRESS


def refuse_secrets(opts: SubmitOptions) -> None:
    if opts.redis_url and urlsplit(opts.redis_url).password:
        raise ConfigError(
            "--redis-url carries a password, which would be stored in the job's entrypoint (kept by Ray and "
            "shown on its dashboard); set PUNCHLINE_REDIS_URL on the cluster's nodes instead (a Kubernetes "
            "Secret, SSM), or pass a URL without a password",
            field="--redis-url",
        )


def input_paths(cfg: RunConfig) -> list[str]:
    """Relative input paths a config names (as written; relative to the config's folder)."""
    values = pipeline_of(cfg).input_paths(cfg.settings)
    return [v for v in values if v and not Path(v).expanduser().is_absolute() and "://" not in v]


def stage(config_path: str, into: Path) -> str:
    """Copy the config and its relative inputs into ``into`` keeping their relative layout; the
    config's path inside ``into``. Absolute paths in the config are left alone (they name files on
    the cluster, e.g. a shared mount); ``api_key_file`` is never copied (a secret)."""
    from punchline.cluster.config import resolve_path

    cfg = load_config(config_path)
    config = Path(config_path).absolute()
    folder = config.parent
    placed: list[tuple[Path, Path]] = []  # (source on this machine, where the job will look for it)
    for value in input_paths(cfg):
        source = resolve_path(cfg, value).absolute()
        if not source.exists():
            raise InputError(f"input {value!r} does not exist ({source})", file=config_path)
        placed.append((source, Path(os.path.normpath(folder / value))))
    root = Path(os.path.commonpath([folder, *(dest.parent for _, dest in placed)]))
    into.mkdir(parents=True, exist_ok=True)
    for source, dest in [(config, config), *placed]:
        target = into / dest.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, dirs_exist_ok=True)
        else:
            shutil.copy2(source, target)
    return config.relative_to(root).as_posix()


def entrypoint(config_rel: str, run_id: str, opts: SubmitOptions) -> str:
    argv = [opts.python, "-m", "punchline", "run", config_rel, "--run-id", run_id, "--verbose"]
    if opts.store:
        argv += ["--store", opts.store]
    if opts.redis_url:
        argv += ["--redis-url", opts.redis_url]
    if opts.max_workers is not None:
        argv += ["--max-workers", str(opts.max_workers)]
    if opts.max_cost_usd is not None:
        argv += ["--max-cost-usd", repr(opts.max_cost_usd)]
    if opts.offline:
        argv += ["--offline"]
    return shlex.join(argv)


def client(address: str) -> Any:
    """A ``JobSubmissionClient`` for the cluster's dashboard (token auth when a token is configured)."""
    from ray.job_submission import JobSubmissionClient

    try:
        from ray._private.authentication import authentication_token_setup as token_setup

        # Ray announces the mode with a warning; our commands print one line, so keep it quiet
        logging.getLogger(token_setup.__name__).setLevel(logging.ERROR)
        token_setup.maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    except Exception:  # older or newer Ray without token auth: nothing to enable
        pass
    try:
        return JobSubmissionClient(address)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise InfraError(f"cannot reach the Ray dashboard at {address}: {_one_line(exc)}") from None


def submit(address: str, config_path: str, run_id: str, opts: SubmitOptions, *, staging: Path) -> str:
    """Submit run ``run_id`` of a config (a new one, or a resume); the job id."""
    refuse_secrets(opts)
    config_rel = stage(config_path, staging)
    jobs = client(address)
    job_id = f"punchline-{run_id}-{secrets.token_hex(3)}"
    try:
        jobs.submit_job(
            entrypoint=entrypoint(config_rel, run_id, opts),
            submission_id=job_id,
            runtime_env={"working_dir": str(staging)},
            metadata={RUN_ID_KEY: run_id, "punchline_config": config_rel},
        )
    except (ConnectionError, RuntimeError) as exc:
        raise InfraError(f"cannot submit to {address}: {_one_line(exc)}") from None
    return job_id


def run_id_of(metadata: dict[str, str] | None, entrypoint: str) -> str | None:
    """The run a job drives: from ``punchline submit``'s metadata, else from a ``punchline run``
    entrypoint (``ray job submit … -- punchline run CONFIG --run-id ID``; "" when it has none);
    None for a job that is not a punchline run."""
    if metadata and metadata.get(RUN_ID_KEY):
        return metadata[RUN_ID_KEY]
    try:
        argv = shlex.split(entrypoint)
    except ValueError:
        return None
    if not any(a.rsplit("/", 1)[-1] == "punchline" for a in argv) or "run" not in argv:
        return None
    return next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--run-id"), "")


def list_jobs(address: str, *, everything: bool = False) -> list[JobRow]:
    """Submitted jobs that run punchline (every submitted job with ``everything``), oldest first."""
    rows = []
    for job in _call(address, "list", lambda c: c.list_jobs()):
        if not job.submission_id:  # drivers attached by ray.init, not submitted jobs
            continue
        found = run_id_of(job.metadata, job.entrypoint or "")
        if found is None and not everything:
            continue
        run_id = found or ""
        rows.append(
            JobRow(
                job_id=job.submission_id,
                status=str(getattr(job.status, "value", job.status)),
                run_id=run_id,
                entrypoint=job.entrypoint,
                start_time_s=job.start_time / 1000 if job.start_time else None,
                end_time_s=job.end_time / 1000 if job.end_time else None,
                message=job.message or "",
            )
        )
    rows.sort(key=lambda r: r.start_time_s or 0.0)
    return rows


def status(address: str, job_id: str) -> str:
    return str(_call(address, job_id, lambda c: getattr(c.get_job_status(job_id), "value", "")))


def logs(address: str, job_id: str) -> str:
    return str(_call(address, job_id, lambda c: c.get_job_logs(job_id)))


def follow(address: str, job_id: str) -> AsyncIterator[str]:
    status(address, job_id)  # an unknown job is one clear line, not a stream error
    return client(address).tail_job_logs(job_id)


def stop(address: str, job_id: str) -> bool:
    return bool(_call(address, job_id, lambda c: c.stop_job(job_id)))


def _call(address: str, job_id: str, fn: Any) -> Any:
    jobs = client(address)
    try:
        return fn(jobs)
    except RuntimeError as exc:
        text = _one_line(exc)
        if "does not exist" in text or "404" in text:
            raise InputError(f"no job {job_id!r} on {address} (see `punchline jobs`)") from None
        raise InfraError(f"{address}: {text}") from None
    except ConnectionError as exc:
        raise InfraError(f"cannot reach the Ray dashboard at {address}: {_one_line(exc)}") from None


def _one_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[0][:400] if lines else type(exc).__name__
