"""A run's options from the command line and the environment (``RunOptions``): what the driver runs with and what
its checks (``cluster/run/run_checks.py``) check.

Why a module of its own: both the driver and its checks need the type, and the driver calls the checks; with the
type in the driver, the checks imported the driver back (a circle closed under ``TYPE_CHECKING``). Here it sits
below both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from punchline.data import settings as env_registry


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
    # Ray's dashboard of the runs folder's head on 127.0.0.1:<port> if this run starts it (0: a free port);
    # None: PUNCHLINE_LOCAL_RAY_DASHBOARD_PORT's (--ray-dashboard)
    ray_dashboard_port: int | None = None

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
