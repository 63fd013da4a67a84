"""Starting or joining Ray, and asking it which nodes are alive.

A run either starts a private local Ray (``address=None``: always a *new* instance, never a
stray one left by ``ray start`` or by a test) or joins a cluster (``PUNCHLINE_RAY_ADDRESS`` /
``RAY_ADDRESS``: ``ray://head:10001`` through Ray Client, or ``head:6379`` / ``auto`` from a
process on a cluster node). Our packages are installed (editable) into the same Python the
workers run, so they import in workers without shipping code; on a cluster the image must have
punchline installed the same way (see ``deploy/``).

Ray's own logging is left alone (``configure_logging=False``) and worker output is not copied to
the driver (``log_to_driver=False``): our processes log JSON lines themselves (``punchline.workers.logs``).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
from collections.abc import Iterator
from typing import Any

import msgspec

from punchline.data.errors import ConfigError, InfraError, ServiceRejected
from punchline.data.extras import require_cluster_extra
from punchline.services.ray_settings import RaySettings

JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # set by Ray's job supervisor for a job's driver


def job_runtime_env(env: dict[str, str] | None = None) -> dict[str, Any]:
    """The ``runtime_env`` of the Ray job this process drives ({} when it is not a job's driver)."""
    raw = (os.environ if env is None else env).get(JOB_CONFIG_ENV)
    if not raw:
        return {}
    try:
        found = json.loads(raw).get("runtime_env") or {}
    except (ValueError, AttributeError):
        return {}
    return found if isinstance(found, dict) else {}


def ensure_ray(settings: RaySettings) -> None:
    """Initialise Ray once per process; a second call (or a caller that already connected) is a no-op.

    ``env_vars`` reach every worker of this job (e.g. ``PUNCHLINE_REDIS_URL``, credentials names);
    prefer passing configuration explicitly in actor arguments, and use this only for what
    libraries read from the environment (boto3, provider SDKs).
    """
    import ray  # lazy: importing Ray costs about a second; commands that never start it must not pay it

    if ray.is_initialized():
        return
    kwargs: dict[str, Any] = {
        "namespace": settings.namespace,
        "ignore_reinit_error": True,
        "include_dashboard": False,
        "log_to_driver": False,
        "configure_logging": False,
    }
    # a Ray job's own env_vars (`submit --env`) already reach every worker of the job, and Ray refuses to
    # merge a variable given twice: forward only the others
    env_vars = {k: v for k, v in settings.env_vars.items() if k not in job_runtime_env().get("env_vars", {})}
    if env_vars:
        kwargs["runtime_env"] = {"env_vars": env_vars}
    if settings.is_local:
        kwargs["address"] = "local"  # never silently join a cluster someone else started
        kwargs["num_cpus"] = settings.num_cpus
        if settings.object_store_bytes is not None:
            kwargs["object_store_memory"] = settings.object_store_bytes
    else:
        kwargs["address"] = settings.address
    try:
        with _loopback_only(settings.is_local or _is_loopback(settings.address)):
            ray.init(**kwargs)
    except (ConnectionError, TimeoutError) as exc:
        raise InfraError(f"cannot reach Ray at {settings.address}: {exc}") from exc
    except RuntimeError as exc:  # ray raises bare RuntimeError/ConnectionError for unreachable heads
        raise InfraError(f"cannot start or join Ray ({settings.address or 'local'}): {exc}") from exc
    except Exception as exc:
        raise_if_auth(exc, f"Ray at {settings.address or 'local'}")
        raise


def ray_running() -> bool:
    """Whether this process is connected to Ray already (a notebook's or a test's ``ray.init``), without
    importing Ray when it is not."""
    ray = sys.modules.get("ray")
    return ray is not None and bool(ray.is_initialized())


def raise_if_auth(exc: BaseException, what: str) -> None:
    """Ray's ``AuthenticationError`` (a token-auth cluster, no token or a wrong one) as one line and exit 2,
    naming the setting to fix; any other exception is left to the caller."""
    if type(exc).__name__ != "AuthenticationError":
        return
    text = str(getattr(exc, "message", "") or exc).lower()
    # Ray's words: "Authentication required ... no authentication token was found" (401, or no token here)
    # versus "Authentication failed ... the authentication token is invalid or incorrect" (403)
    wrong = text.startswith("authentication failed") or "token is invalid" in text
    raise ServiceRejected(
        f"{what} refused {'the' if wrong else 'a missing'} authentication token (token auth is on): "
        f"{'fix' if wrong else 'set'} RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token) to the "
        "cluster's token",
        field="RAY_AUTH_TOKEN",
    ) from None


def check_address(address: str | None, *, field: str = "--ray-address / PUNCHLINE_RAY_ADDRESS") -> None:
    """Refuse, in one line and within seconds, a cluster address where nothing listens (a refused
    connection, an unknown host, a malformed address): ``ray.init`` would wait for it far longer.
    ``auto`` and addresses Ray resolves itself are left to Ray; a slow network is not refused."""
    if not address or address in ("auto", "local"):
        return
    if address.startswith("ray://"):
        require_cluster_extra("a ray:// address (Ray Client)", field=field)
    target = address.split("://", 1)[1] if address.startswith("ray://") else address
    host, sep, port_text = target.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigError(f"want HOST:PORT (the head's GCS) or ray://HOST:PORT, got {address!r}", field=field)
    try:
        with socket.create_connection((host, int(port_text)), timeout=5.0):
            return
    except ConnectionRefusedError:
        raise ConfigError(f"nothing listens at {address} (is the Ray head started there?)", field=field) from None
    except socket.gaierror:
        raise ConfigError(f"unknown host in {address!r}", field=field) from None
    except OSError:  # a timeout or an unreachable network: Ray's own wait decides
        return


def driver_node_ip() -> str:
    """The address other nodes reach this process's Ray node at (after :func:`ensure_ray`)."""
    import ray  # lazy: Ray (see ensure_ray)

    return str(ray.util.get_node_ip_address())


def _is_loopback(address: str | None) -> bool:
    """A cluster address on this machine's loopback (a local Ray another driver started): joining
    it must use the loopback too, or Ray looks for a raylet on the machine's outside address."""
    if not address or "://" in address:
        return False
    host = address.rsplit(":", 1)[0].strip("[]")
    return host == "localhost" or host.startswith("127.") or host == "::1"


@contextlib.contextmanager
def _loopback_only(local: bool) -> Iterator[None]:
    """A private local Ray listens on 127.0.0.1 only (Ray binds every interface for a node that could
    join a cluster: its GCS, raylet and workers would be reachable from the network). Ray decides
    with ``ENABLE_RAY_CLUSTER``, read by the processes it starts from the environment."""
    if not local:
        yield
        return
    from ray._private import ray_constants  # lazy: Ray (see ensure_ray)

    name = ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR
    saved_env, saved_flag = os.environ.get(name), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[name] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag
        if saved_env is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved_env


def shutdown_ray() -> None:
    import ray  # lazy: Ray (see ensure_ray)

    if ray.is_initialized():
        ray.shutdown()


class NodeInfo(msgspec.Struct, frozen=True):
    """One Ray node as the scheduler sees it."""

    node_id: str
    address: str
    cpus: float
    alive: bool
    is_head: bool = False
    object_store_bytes: int = 0


def _node_info(raw: dict[str, Any]) -> NodeInfo:
    resources = raw.get("Resources") or {}
    labels = raw.get("Labels") or {}
    return NodeInfo(
        node_id=str(raw["NodeID"]),
        address=str(raw.get("NodeManagerAddress", "")),
        cpus=float(resources.get("CPU", 0.0)),
        alive=bool(raw.get("Alive", False)),
        is_head=bool(
            raw.get("IsHeadNode", False)
            or "node:__internal_head__" in resources
            or labels.get("ray.io/node-type") == "head"
        ),
        object_store_bytes=int(resources.get("object_store_memory", 0)),
    )


def all_nodes() -> list[NodeInfo]:
    """Every node Ray has known in this cluster's lifetime, dead ones included."""
    import ray  # lazy: Ray (see ensure_ray)

    return [_node_info(n) for n in ray.nodes()]


def alive_nodes() -> list[NodeInfo]:
    """Nodes that can take work right now, head first then by id (stable for placement)."""
    return sorted((n for n in all_nodes() if n.alive), key=lambda n: (not n.is_head, n.node_id))


def cluster_cpus() -> float:
    """CPUs currently in the cluster (alive nodes only)."""
    return sum(n.cpus for n in alive_nodes())


def node_affinity(node_id: str, *, soft: bool = False) -> Any:
    """A scheduling strategy pinning a task/actor to ``node_id`` (``soft`` lets Ray move it if
    that node is gone, instead of failing)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # lazy: Ray (see ensure_ray)

    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=soft)
