"""The optional parts of the install, and the one line that names the extra a missing part comes from.

Why: the runtime (``pip install punchline``, ``make run``) carries plain ``ray``, enough for a local run and
for the runs folder's Ray head; Ray's dashboard, its job SDK and Ray Client need the packages of
``ray[default]`` (aiohttp, grpcio, opentelemetry, ...: 33 more packages), which only a cluster's user needs:
the ``cluster`` extra (docs/install.md). A feature that needs them checks here before anything starts, so a
user reads one line naming the extra rather than Ray's own advice (``pip install ray[default]``, which would
not pin the Ray release punchline runs on) or a head that ends with its log.

The check looks the modules up without importing them (an import of aiohttp or grpc costs a second).
"""

from __future__ import annotations

import importlib.util

from punchline.data.errors import ConfigError

CLUSTER_EXTRA = "punchline[cluster]"
CLUSTER_INSTALL = f"pip install '{CLUSTER_EXTRA}'"

# What Ray's dashboard and job SDK import before they work (ray/dashboard/optional_deps.py; the job SDK
# needs aiohttp, Ray Client grpc): all come with the extra, so one missing is the extra missing.
CLUSTER_MODULES = ("aiohttp", "aiohttp_cors", "grpc", "opencensus", "opentelemetry", "prometheus_client", "pydantic")


def missing_cluster_modules() -> list[str]:
    """The modules of the ``cluster`` extra this Python cannot import ([] when it is installed)."""
    return [name for name in CLUSTER_MODULES if importlib.util.find_spec(name) is None]


def ray_client_installed() -> bool:
    """Whether Ray Client's gRPC is here: without it ``ray start`` starts no client server (and refuses a
    ``--ray-client-server-port``)."""
    return importlib.util.find_spec("grpc") is not None


def require_cluster_extra(feature: str, *, field: str | None = None) -> None:
    """Refuse ``feature`` in one line naming the extra when the ``cluster`` extra is not installed."""
    missing = missing_cluster_modules()
    if missing:
        raise ConfigError(
            f"{feature} needs the cluster extra (Ray's dashboard and client packages; no {missing[0]} here): "
            f"{CLUSTER_INSTALL}, or in a checkout `make venv`",
            field=field,
        )
