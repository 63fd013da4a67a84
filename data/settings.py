"""Every ``PUNCHLINE_*`` environment variable, defined once: name, type, default, range, description.

The settings structs that read the environment (``RunOptions``, ``RaySettings``, ``AutoscaleSettings``,
``S3Settings``, ``RateLimitSettings``, ``RedisSettings``) and the few modules that read one variable
(the start wait, the ledger's staleness, the debug switch) all go through :class:`EnvVar` here, so
a variable is typed and range-checked the same way wherever it is read, a bad value is one line
naming the variable (``ConfigError``, exit 2, as a bad TOML value), ``punchline submit --env`` knows
which ones a job may set, and ``punchline settings`` (docs/settings.md) lists them all. The TOML
keys are described beside their msgspec Structs (``msgspec.Meta(description=...)``); this module is
the environment's half of the same reference. An empty value counts as unset.

It lives on the ground floor because every floor reads the environment.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

import msgspec

from punchline.data.errors import ConfigError

T = TypeVar("T")
S = TypeVar("S", bound=msgspec.Struct)
Kind = Literal["int", "float", "str", "bool"]
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


@dataclass(frozen=True)
class EnvVar(Generic[T]):
    """One environment variable. ``also``: other tools' variables read when this one is unset (Ray's
    ``RAY_ADDRESS``); ``flag``: the command-line option that wins over it; ``job``: ``punchline submit
    --env`` may set it for one job (never a secret); ``secret``: its value may hold a credential; an
    empty value counts as unset unless ``empty_ok`` is False."""

    name: str
    kind: Kind
    default: T
    description: str
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    choices: tuple[str, ...] = ()
    also: tuple[str, ...] = ()
    flag: str = ""
    job: bool = False
    secret: bool = False
    empty_ok: bool = True  # False: set but empty is a mistake, not "unset" (an empty folder name)

    def raw(self, env: Mapping[str, str] | None = None) -> tuple[str, str] | None:
        """(the variable's name, its text) of the first of ``name``, ``also`` that is set and not empty."""
        source = os.environ if env is None else env
        for name in (self.name, *self.also):
            text = source.get(name, "").strip()
            if text:
                return name, text
            if name in source and not self.empty_ok:
                raise ConfigError("is set but empty: give a value or unset it", field=name)
        return None

    def given(self, env: Mapping[str, str] | None = None) -> T | None:
        """The value if the variable is set (typed and range-checked), else None."""
        found = self.raw(env)
        return None if found is None else self.parse(found[1], found[0])

    def get(self, env: Mapping[str, str] | None = None) -> T:
        """The value if the variable is set, else its default."""
        found = self.raw(env)
        return self.default if found is None else self.parse(found[1], found[0])

    def parse(self, text: str, name: str | None = None) -> T:
        """``text`` as this variable's type within its range; ConfigError naming the variable if not."""
        field = name or self.name
        shown = "***" if self.secret else repr(text)
        value: Any
        if self.kind == "str":
            if self.choices and text not in self.choices:
                raise ConfigError(f"want {', '.join(self.choices)}, got {shown}", field=field)
            return text  # type: ignore[return-value]
        if self.kind == "bool":
            if text.lower() not in _TRUE | _FALSE:
                raise ConfigError(f"want 1/0, true/false, yes/no or on/off, got {shown}", field=field)
            return text.lower() in _TRUE  # type: ignore[return-value]
        try:
            value = int(text) if self.kind == "int" else float(text)
        except ValueError:
            raise ConfigError(
                f"not {'an integer' if self.kind == 'int' else 'a number'}: {shown}", field=field
            ) from None
        self.check(value, field, shown)
        return value  # type: ignore[no-any-return,unused-ignore]

    def check(self, value: float, field: str | None = None, shown: str | None = None) -> None:
        """Refuse a value out of this variable's range, naming ``field`` (e.g. the flag that gave it)."""
        if not self.in_range(value):
            raise ConfigError(f"must be in {self.range_text()}, got {shown or value}", field=field or self.name)

    def in_range(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        return (
            (self.ge is None or value >= self.ge)
            and (self.gt is None or value > self.gt)
            and (self.le is None or value <= self.le)
        )

    def range_text(self) -> str:
        """The range in words (``0 – 100000``, ``> 0 and <= 86400``); "" for none."""
        return bounds_text(ge=self.ge, gt=self.gt, le=self.le)


def number(value: float) -> str:
    """A bound as people write it: ``86400``, ``0.5``, ``1e-06``."""
    if isinstance(value, int):
        return str(value)
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else f"{value:g}"


def bounds_text(
    *, ge: float | None = None, gt: float | None = None, le: float | None = None, lt: float | None = None
) -> str:
    """Numeric bounds in words, for error messages and the settings reference alike."""
    if ge is not None and le is not None:
        return f"{number(ge)} – {number(le)}"
    low = f">= {number(ge)}" if ge is not None else f"> {number(gt)}" if gt is not None else ""
    high = f"<= {number(le)}" if le is not None else f"< {number(lt)}" if lt is not None else ""
    return " and ".join(p for p in (low, high) if p)


def env_values(fields: Mapping[str, EnvVar[Any]], env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The struct fields whose variable is set, as typed values (``fields``: field name -> variable).
    This is the one reader behind every settings struct's ``from_env``."""
    out: dict[str, Any] = {}
    for field, var in fields.items():
        found = var.raw(env)
        if found is not None:
            out[field] = var.parse(found[1], found[0])
    return out


def overlay(settings: S, **values: Any) -> S:
    """``settings`` with every value that is not None put over it: flags over the environment over
    the config, one rule for every command."""
    given = {k: v for k, v in values.items() if v is not None}
    return msgspec.structs.replace(settings, **given) if given else settings


def _seconds(name: str, default: float, description: str, *, le: float = 86_400.0, job: bool = False) -> EnvVar[float]:
    return EnvVar(name, "float", default, description, gt=0.0, le=le, job=job)


# --- where a run keeps its state and which services it uses -------------------------------------

RUNS_DIR: EnvVar[str] = EnvVar(
    "PUNCHLINE_RUNS_DIR",
    "str",
    "runs",
    "local folder of run records, logs, the embedded ledger and the default store (every command that reads runs)",
    flag="--runs-dir",
    empty_ok=False,
)
STORE: EnvVar[str | None] = EnvVar(
    "PUNCHLINE_STORE",
    "str",
    None,
    "checkpoint store: a folder or s3://bucket/prefix (default: the runs folder)",
    flag="--store",
    job=True,
)
REDIS_URL: EnvVar[str | None] = EnvVar(
    "PUNCHLINE_REDIS_URL",
    "str",
    None,
    "the ledger's Redis (redis://, rediss://, unix://; default: the runs folder's embedded one); may hold a "
    "password, so set it on every node, never per job",
    flag="--redis-url",
    secret=True,
)
CONFIG: EnvVar[str | None] = EnvVar(
    "PUNCHLINE_CONFIG",
    "str",
    None,
    "the settings file the notebook API (punchline.prompts, punchline.run of a pipeline object) reads its "
    "[providers] tables from when none are passed (default: ./punchline.toml)",
)
RAY_ADDRESS: EnvVar[str | None] = EnvVar(
    "PUNCHLINE_RAY_ADDRESS",
    "str",
    None,
    "the Ray cluster to join (ray://head:10001, head:6379, auto; local: a private local Ray, the default); "
    "over [run] ray_address, which is over Ray's own RAY_ADDRESS",
    flag="--ray-address",
)
RAY_NUM_CPUS: EnvVar[int | None] = EnvVar(
    "PUNCHLINE_RAY_NUM_CPUS",
    "int",
    None,
    "CPUs of the local Ray a run starts (default: the machine's)",
    ge=1,
    le=100_000,
)
MAX_WORKERS: EnvVar[int] = EnvVar(
    "PUNCHLINE_MAX_WORKERS",
    "int",
    0,
    "worker nodes to ask the autoscaler for while shards outnumber workers, over [run] max_workers (0: never)",
    ge=0,
    le=100_000,
    flag="--max-workers",
    job=True,
)
WORKER_NODE_CPUS: EnvVar[float | None] = EnvVar(
    "PUNCHLINE_WORKER_NODE_CPUS",
    "float",
    None,
    "CPUs of one worker node, the bundle asked of the autoscaler per node (default: the largest alive node's)",
    gt=0.0,
    le=100_000.0,
    job=True,
)
JOBS_ADDRESS: EnvVar[str] = EnvVar(
    "PUNCHLINE_JOBS_ADDRESS",
    "str",
    "http://127.0.0.1:8265",
    "the cluster's dashboard for submit, jobs, logs, stop, delete; else RAY_API_SERVER_ADDRESS, an http(s) RAY_ADDRESS",
    also=("RAY_API_SERVER_ADDRESS",),
    flag="--address",
)
START_WAIT_S = _seconds(
    "PUNCHLINE_START_WAIT_S",
    60.0,
    "how long a run waits at its start for a Redis or provider address where nothing answers before it stops",
)
LEDGER_STALE_S = _seconds(
    "PUNCHLINE_LEDGER_STALE_S",
    60.0,
    "a driver registered with the embedded ledger and silent this long counts as gone (the keeper may stop it)",
)
LOCAL_RAY_LINGER_S = _seconds(
    "PUNCHLINE_LOCAL_RAY_LINGER_S",
    20.0,
    "the runs folder's local Ray head stays up this long after its last driver left (the next run joins it)",
    le=3600.0,
)
LOCAL_RAY_DASHBOARD_PORT: EnvVar[int] = EnvVar(
    "PUNCHLINE_LOCAL_RAY_DASHBOARD_PORT",
    "int",
    0,
    "serve Ray's dashboard of the runs folder's local head on 127.0.0.1:PORT (0: no dashboard; the flag with no "
    "PORT or 0: a free port); it asks for the head's token, runs/_ray/<env>/auth_token",
    ge=0,
    le=65535,
    flag="--ray-dashboard",
)
LOCAL_RAY_CPU_SHARE: EnvVar[float] = EnvVar(
    "PUNCHLINE_LOCAL_RAY_CPU_SHARE",
    "float",
    0.85,
    "a local run adds Ray's workers to a long stage (10 s or more left) only when the driver's own worker uses "
    "at least this share of a core, or its window holds fewer calls than the stage's providers allow: a worker "
    "waiting on its calls gains nothing from more (0: whenever the stage is long)",
    ge=0.0,
    le=1.0,
)
DEBUG: EnvVar[bool] = EnvVar(
    "PUNCHLINE_DEBUG",
    "bool",
    False,
    "an internal error shows its traceback instead of one line",
    job=True,
)

# --- S3 ---------------------------------------------------------------------------------------------

S3_ENDPOINT_URL: EnvVar[str | None] = EnvVar(
    "PUNCHLINE_S3_ENDPOINT_URL",
    "str",
    None,
    "an S3-compatible server (MinIO, R2, moto) instead of AWS; else AWS_ENDPOINT_URL",
    also=("AWS_ENDPOINT_URL",),
    job=True,
)
S3_ADDRESSING_STYLE: EnvVar[str] = EnvVar(
    "PUNCHLINE_S3_ADDRESSING_STYLE",
    "str",
    "auto",
    "bucket in the host name (virtual) or in the path (path)",
    choices=("auto", "path", "virtual"),
    job=True,
)
S3_OUTAGE_S: EnvVar[float] = EnvVar(
    "PUNCHLINE_S3_OUTAGE_S",
    "float",
    600.0,
    "how long an S3 operation waits out connection errors and 5xx before the run stops (answers paid "
    "meanwhile are kept in the node's spool)",
    ge=0.0,
    le=604_800.0,
    job=True,
)

# --- the rate limiter (schedulers/rate_limit.py RateLimitSettings, one variable per field) ----------

RATE_NAMESPACE: EnvVar[str] = EnvVar(
    "PUNCHLINE_RATE_NAMESPACE", "str", "pl", "prefix of the rate limiter's Redis keys", job=True
)
RATE_BURST_REQUESTS: EnvVar[float] = EnvVar(
    "PUNCHLINE_RATE_BURST_REQUESTS",
    "float",
    1.0,
    "requests that may go back to back after an idle spell",
    gt=0.0,
    le=1e6,
    job=True,
)
RATE_BURST_S_TOKENS: EnvVar[float] = EnvVar(
    "PUNCHLINE_RATE_BURST_S_TOKENS",
    "float",
    1.0,
    "token burst, in seconds' worth of the token rate",
    gt=0.0,
    le=3600.0,
    job=True,
)
RATE_HEADROOM: EnvVar[float] = EnvVar(
    "PUNCHLINE_RATE_HEADROOM",
    "float",
    0.99,
    "share of the configured rates that slots are paced at",
    gt=0.0,
    le=1.0,
    job=True,
)
RATE_DECREASE_FACTOR: EnvVar[float] = EnvVar(
    "PUNCHLINE_RATE_DECREASE_FACTOR",
    "float",
    0.9,
    "a 429 that quotes no limit multiplies the rate by this",
    gt=0.0,
    le=1.0,
    job=True,
)
RATE_MIN_FACTOR: EnvVar[float] = EnvVar(
    "PUNCHLINE_RATE_MIN_FACTOR",
    "float",
    0.05,
    "the lowest share of the configured rate that 429s can push a provider to",
    gt=0.0,
    le=1.0,
    job=True,
)
RATE_INCREASE_STEP: EnvVar[float] = EnvVar(
    "PUNCHLINE_RATE_INCREASE_STEP",
    "float",
    0.02,
    "how much the rate factor grows back per quiet recover window",
    ge=0.0,
    le=1.0,
    job=True,
)
RATE_RECOVER_WINDOW_S = _seconds(
    "PUNCHLINE_RATE_RECOVER_WINDOW_S", 1.0, "seconds without a 429 before the rate factor grows a step", job=True
)
RATE_THROTTLE_COOLDOWN_S = _seconds(
    "PUNCHLINE_RATE_THROTTLE_COOLDOWN_S",
    2.0,
    "at most one decrease per this many seconds, however many workers saw a 429",
    job=True,
)
RATE_IDLE_TTL_S = _seconds(
    "PUNCHLINE_RATE_IDLE_TTL_S", 3600.0, "Redis forgets a rate scope idle this long", le=2_592_000.0, job=True
)

ENV_VARS: tuple[EnvVar[Any], ...] = (
    RUNS_DIR,
    STORE,
    REDIS_URL,
    CONFIG,
    RAY_ADDRESS,
    RAY_NUM_CPUS,
    MAX_WORKERS,
    WORKER_NODE_CPUS,
    JOBS_ADDRESS,
    START_WAIT_S,
    LEDGER_STALE_S,
    LOCAL_RAY_LINGER_S,
    LOCAL_RAY_DASHBOARD_PORT,
    LOCAL_RAY_CPU_SHARE,
    DEBUG,
    S3_ENDPOINT_URL,
    S3_ADDRESSING_STYLE,
    S3_OUTAGE_S,
    RATE_NAMESPACE,
    RATE_BURST_REQUESTS,
    RATE_BURST_S_TOKENS,
    RATE_HEADROOM,
    RATE_DECREASE_FACTOR,
    RATE_MIN_FACTOR,
    RATE_INCREASE_STEP,
    RATE_RECOVER_WINDOW_S,
    RATE_THROTTLE_COOLDOWN_S,
    RATE_IDLE_TTL_S,
)
BY_NAME: dict[str, EnvVar[Any]] = {v.name: v for v in ENV_VARS}
JOB_VARS: frozenset[str] = frozenset(v.name for v in ENV_VARS if v.job and not v.secret)


def check_environment(env: Mapping[str, str] | None = None) -> None:
    """Every registered variable that is set, decoded now (before anything starts) rather than mid-run."""
    for var in ENV_VARS:
        var.given(env)


RUNS_DIR_HELP = "local folder of run records, logs and the embedded ledger (env PUNCHLINE_RUNS_DIR; default: runs)"


def runs_dir(flag: str | None, env: Mapping[str, str] | None = None) -> str:
    """The runs folder every command uses: ``--runs-dir``, else ``PUNCHLINE_RUNS_DIR``, else ``runs``."""
    return flag if flag is not None else RUNS_DIR.get(env)
