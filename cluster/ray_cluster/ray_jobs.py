"""Running a pipeline as a Ray job: what ``punchline submit | jobs | logs | stop`` do, without printing.

A submitted run is a Ray job whose entrypoint is ``python -m punchline run CONFIG --run-id ID …`` on
the head node, so the driver is managed by Ray (it survives the laptop or the ``kubectl exec`` session
that started it) and its output is the job's log. The job's ``runtime_env`` carries a
``working_dir`` holding the config and the input files it names (staged under their paths relative
to each other, so the config's relative paths still resolve) and, for ``[run] pipeline =
"package.module:Name"``, ``py_modules`` with that one top-level package (or module file) as this
machine imports it: Ray puts it on the ``PYTHONPATH`` of the job's driver and of every worker on every
node, wherever the package lives here (beside the config, a ``src/`` layout, an editable install),
and ships nothing else of the user's project (no venv, no data, no runs folder). ``punchline`` itself
is the one installed in the cluster's image, never the submitter's checkout; a bare pipeline name
(a built-in, or an entry point) is resolved on the cluster, so a plug-in named that way is installed
there like punchline. Nothing else from the submitter's environment is sent. Secrets never go into the
entrypoint or the runtime_env (Ray stores both in the GCS and shows them on the dashboard): a
``--redis-url`` with a password is refused, the nodes take it from their own environment
(``PUNCHLINE_REDIS_URL`` from a Secret or SSM).

Resuming is submitting the same config with the same run id: the run continues from Redis and the
store (finished stages skipped, committed shards kept, cached answers free).
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import re
import secrets
import shlex
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec

from punchline.cluster.config import RunConfig, load_config, resolve_path
from punchline.cluster.ray_cluster.ray_runtime import raise_if_auth
from punchline.cluster.registry import FIELD, pipeline_of
from punchline.data.errors import ConfigError, InfraError, InputError
from punchline.data.extras import require_cluster_extra
from punchline.data.redaction import redact_text, secret_parts
from punchline.data.settings import BY_NAME, JOB_VARS, JOBS_ADDRESS, MAX_WORKERS

DEFAULT_ADDRESS = JOBS_ADDRESS.default
RUN_ID_KEY = "punchline_run_id"  # job metadata: which run a job drives
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})


# The variables ``submit --env`` may set for a job: punchline's own settings marked ``job`` in
# punchline.data.settings, none of them a secret (PUNCHLINE_REDIS_URL may carry a password: the nodes
# take it from their own environment).
JOB_ENV = JOB_VARS
_SUBMISSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")


class SubmitOptions(msgspec.Struct, kw_only=True):
    """What ``punchline submit`` passes on to the job's ``punchline run`` (never a secret)."""

    store: str | None = None
    redis_url: str | None = None
    max_workers: int | None = None
    max_cost_usd: float | None = None
    offline: bool = False
    python: str = "python"  # the interpreter on the cluster with punchline installed
    env: dict[str, str] = {}  # --env KEY=VALUE: the job's environment (only JOB_ENV names)
    entrypoint_num_cpus: float | None = None  # CPUs Ray reserves for the driver (--entrypoint-num-cpus)
    submission_id: str | None = None  # the job id (--submission-id); default punchline-<run>-<hex>
    metrics_port: int | None = None  # the driver serves /metrics on the head's 127.0.0.1:<port> (--metrics-port)


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
    given = JOBS_ADDRESS.given(env)
    if given:
        return given
    ray_address = (os.environ if env is None else env).get("RAY_ADDRESS", "").strip()
    return ray_address if ray_address.startswith(("http://", "https://")) else DEFAULT_ADDRESS


def refuse_secrets(opts: SubmitOptions) -> None:
    """No credential goes into a job in any form: a URL's ``user:password@``, a ``?password=`` (or any
    query parameter naming a secret: token, key, secret...), an ``--env`` outside the allowlist."""
    for flag, value in (("--redis-url", opts.redis_url), ("--store", opts.store)):
        found = secret_parts(value or "")
        if found:
            where = "PUNCHLINE_REDIS_URL" if flag == "--redis-url" else "the nodes' own environment"
            raise ConfigError(
                f"carries a secret ({', '.join(found)}), which would be stored in the job's entrypoint (kept by Ray "
                f"and shown on its dashboard); set {where} on the cluster's nodes instead (a Kubernetes Secret, "
                "SSM), or pass a URL without it",
                field=flag,
            )
    for name, value in opts.env.items():
        if name not in JOB_ENV:
            allowed = (
                ", ".join(sorted(n for n in JOB_ENV if not n.startswith("PUNCHLINE_RATE_"))) + ", PUNCHLINE_RATE_*"
            )
            raise ConfigError(
                f"{name} cannot be set for a job (only punchline's own settings, never a secret: {allowed}); "
                "give the nodes secrets in their own environment",
                field="--env",
            )
        if secret_parts(value) or redact_text(value) != value:
            raise ConfigError(f"the value of {name} looks like a secret; it would be stored by Ray", field="--env")
        if value.strip():  # typed and range-checked here, not in the job on the cluster
            BY_NAME[name].parse(value.strip())


def parse_env(pairs: list[str]) -> dict[str, str]:
    """``--env KEY=VALUE`` flags as a dict (one line naming the flag for a malformed one)."""
    env: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not re.fullmatch(r"[A-Z_][A-Z0-9_]*", name):
            raise ConfigError(f"want KEY=VALUE with an upper-case KEY, got {redact_text(pair)!r}", field="--env")
        env[name] = value
    return env


def check_submit_options(opts: SubmitOptions) -> None:
    """Everything ``submit`` is given, checked before anything is staged or sent."""
    refuse_secrets(opts)
    if opts.entrypoint_num_cpus is not None and not (
        math.isfinite(opts.entrypoint_num_cpus) and 0 <= opts.entrypoint_num_cpus <= 1024
    ):
        raise ConfigError(f"must be between 0 and 1024, got {opts.entrypoint_num_cpus}", field="--entrypoint-num-cpus")
    if opts.submission_id is not None and not _SUBMISSION_ID.fullmatch(opts.submission_id):
        raise ConfigError(
            f"want 1-128 letters, digits, '.', '_', '-', got {opts.submission_id!r}", field="--submission-id"
        )
    if opts.max_workers is not None:
        MAX_WORKERS.check(opts.max_workers, "--max-workers")
    if opts.max_cost_usd is not None and not (math.isfinite(opts.max_cost_usd) and 0 <= opts.max_cost_usd <= 1e9):
        raise ConfigError(f"must be a finite number of dollars >= 0, got {opts.max_cost_usd}", field="--max-cost-usd")


def input_paths(cfg: RunConfig) -> list[str]:
    """Relative input paths a config names (as written; relative to the config's folder)."""
    values = pipeline_of(cfg).input_paths(cfg.settings)
    return [v for v in values if v and not Path(v).expanduser().is_absolute() and "://" not in v]


def user_code(cfg: RunConfig) -> list[str]:
    """What ``py_modules`` ships: the local path of the top-level package (or ``.py`` file) that
    ``[run] pipeline = "package.module:Name"`` names, as this process imports it (the config loader
    already did, from ``sys.path`` or beside the config); nothing for a name the cluster resolves."""
    module_name, sep, _ = cfg.run.pipeline.partition(":")
    top = module_name.split(".")[0]
    if not sep or top == "punchline":
        return []
    module = importlib.import_module(top)
    paths = list(getattr(module, "__path__", None) or [])  # a package: its folder
    path = paths[0] if paths else getattr(module, "__file__", None)
    if not path or not (Path(path).is_dir() or path.endswith(".py")):
        raise ConfigError(
            f"pipeline {cfg.run.pipeline!r}: {top!r} is not a package folder or a .py file here ({path}), "
            "so it cannot be shipped with the job; install it on the cluster and name it by its entry point",
            file=cfg.source or None,
            field=FIELD,
        )
    return [str(Path(path).absolute())]


def stage(config_path: str, into: Path) -> str:
    """Copy the config and its relative inputs into ``into`` keeping their relative layout; the
    config's path inside ``into``. Absolute paths in the config are left alone (they name files on
    the cluster, e.g. a shared mount); ``api_key_file`` is never copied (a secret)."""
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
    if opts.metrics_port is not None:
        argv += ["--metrics-port", str(opts.metrics_port)]
    return shlex.join(argv)


def client(address: str) -> Any:
    """A ``JobSubmissionClient`` for the cluster's dashboard (token auth when a token is configured)."""
    require_cluster_extra("Ray's job SDK (submit, jobs, logs, stop, delete)")
    from ray.job_submission import JobSubmissionClient  # lazy: ray takes seconds to import

    try:
        from ray._private.authentication import authentication_token_setup as token_setup  # lazy: ray

        # Ray announces the mode with a warning; our commands print one line, so keep it quiet
        logging.getLogger(token_setup.__name__).setLevel(logging.ERROR)
        token_setup.maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    except Exception:  # older or newer Ray without token auth: nothing to enable
        pass
    try:
        return JobSubmissionClient(address)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise InfraError(f"cannot reach the Ray dashboard at {address}: {_one_line(exc)}") from None
    except Exception as exc:
        raise_if_auth(exc, f"the Ray dashboard at {address}")
        raise


def submit(address: str, config_path: str, run_id: str, opts: SubmitOptions, *, staging: Path) -> str:
    """Submit run ``run_id`` of a config (a new one, or a resume); the job id."""
    check_submit_options(opts)
    config_rel = stage(config_path, staging)
    job_id = opts.submission_id or f"punchline-{run_id}-{secrets.token_hex(3)}"
    runtime_env: dict[str, Any] = {"working_dir": str(staging)}
    code = user_code(load_config(config_path))
    if code:
        runtime_env["py_modules"] = code
    if opts.env:
        runtime_env["env_vars"] = dict(opts.env)
    extra: dict[str, Any] = {}
    if opts.entrypoint_num_cpus is not None:
        extra["entrypoint_num_cpus"] = opts.entrypoint_num_cpus

    def send(jobs: Any) -> None:
        jobs.submit_job(
            entrypoint=entrypoint(config_rel, run_id, opts),
            submission_id=job_id,
            runtime_env=runtime_env,
            metadata={RUN_ID_KEY: run_id, "punchline_config": config_rel},
            **extra,
        )

    _call(address, job_id, send, doing="submit")
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
                entrypoint=redact_text(job.entrypoint or ""),
                start_time_s=job.start_time / 1000 if job.start_time else None,
                end_time_s=job.end_time / 1000 if job.end_time else None,
                message=redact_text(job.message or ""),
            )
        )
    rows.sort(key=lambda r: r.start_time_s or 0.0)
    return rows


def status(address: str, job_id: str) -> str:
    return str(_call(address, job_id, lambda c: getattr(c.get_job_status(job_id), "value", "")))


def wait_until_ended(address: str, job_id: str, *, poll_s: float = 0.5) -> str:
    """The job's state once it has ended (one of :data:`TERMINAL`), asking every ``poll_s`` seconds (a log
    stream can end a moment before the status does; a stop takes Ray's grace period)."""
    state = status(address, job_id)
    while state not in TERMINAL:
        time.sleep(poll_s)
        state = status(address, job_id)
    return state


def logs(address: str, job_id: str) -> str:
    return redact_text(str(_call(address, job_id, lambda c: c.get_job_logs(job_id))))


def follow(address: str, job_id: str) -> AsyncIterator[str]:
    status(address, job_id)  # an unknown job is one clear line, not a stream error
    return client(address).tail_job_logs(job_id)


def stop(address: str, job_id: str) -> bool:
    return bool(_call(address, job_id, lambda c: c.stop_job(job_id)))


def delete(address: str, job_id: str) -> bool:
    """Delete a finished job and what Ray keeps of it (its info; the log files stay on the head)."""
    state = status(address, job_id)
    if state not in TERMINAL:
        raise InputError(f"job {job_id} is {state}: stop it first (`punchline stop {job_id} --wait`)")
    return bool(_call(address, job_id, lambda c: c.delete_job(job_id), doing="delete"))


def _call(address: str, job_id: str, fn: Any, *, doing: str = "") -> Any:
    jobs = client(address)
    try:
        return fn(jobs)
    except RuntimeError as exc:
        text = redact_text(_one_line(exc))
        if doing != "submit" and ("does not exist" in text or "404" in text):
            raise InputError(f"no job {job_id!r} on {address} (see `punchline jobs`)") from None
        if doing == "submit" and "already exists" in text:
            raise InputError(f"a job {job_id!r} exists on {address}; pick another", field="--submission-id") from None
        raise InfraError(f"{address}: {f'cannot {doing}: ' if doing else ''}{text}") from None
    except ConnectionError as exc:
        raise InfraError(f"cannot reach the Ray dashboard at {address}: {_one_line(exc)}") from None
    except Exception as exc:
        raise_if_auth(exc, f"the Ray dashboard at {address}")
        raise


_EXIT_CODE = re.compile(r"failed with exit code (\d+)")


def shorten(text: str, width: int = 160) -> str:
    """A job's message on one line, cut at ``width`` (``punchline logs`` shows the rest). A failed entrypoint's
    message is Ray's "failed with exit code N, last available logs: ..." and the driver's output: the cause is the
    last line of that output that says why (punchline's own ``punchline: error: ...`` line, or a Python error such
    as ``ModuleNotFoundError: No module named 'punchline'``), shown after the exit code."""
    line = _one_line_text(text)
    code = _EXIT_CODE.search(line)
    cause = _cause_line(text) if code else None
    if code and cause:
        line = f"exit {code.group(1)}: {cause}"
    return line if len(line) <= width else line[: width - 1] + "…"


def _cause_line(text: str) -> str | None:
    lines = [ln.strip() for ln in text.splitlines()[1:] if ln.strip()]
    ours = [ln for ln in lines if ln.startswith("punchline: ")]
    if ours:
        return ours[-1].removeprefix("punchline: ")
    errors = [ln for ln in lines if re.match(r"^[A-Za-z_.]*(Error|Exception|Interrupt)\b", ln)]
    return errors[-1] if errors else (lines[-1] if lines else None)


def _one_line_text(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0] if lines else ""


def _one_line(exc: BaseException) -> str:
    return _one_line_text(str(exc))[:400] or type(exc).__name__
