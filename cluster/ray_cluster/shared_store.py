"""A store every node can see, or a refusal before anything is paid for.

The driver calls :func:`ensure_shared` once Ray is up. A local folder inside a Ray job's temporary
working dir is refused at once (relative paths resolve there under ``ray job submit --working-dir``,
on every node differently, and it is deleted with the job). Otherwise the driver plants a sentinel
(``punchline.data.stores.sentinel``) and runs one tiny Ray task on every node that will get workers,
pinned to it, which reads the sentinel back; a node that reads nothing (its own disk, not a shared
mount) or fails (no S3 access) stops the run with one line. Workers check the same sentinel when
they start, so a node that joins later with a different view of the store cannot commit anything.

A local Ray (``punchline run`` on one machine) shares the driver's filesystem by construction and is
not checked.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import msgspec
import structlog

from punchline.cluster.config import RunConfig, resolve_path
from punchline.cluster.ray_cluster.ray_runtime import NodeInfo, alive_nodes, job_runtime_env, node_affinity
from punchline.data.errors import ConfigError, PunchlineError
from punchline.data.store import Store
from punchline.data.stores import open_store
from punchline.data.stores.sentinel import SHARED_HINT, Sentinel, not_shared, plant, sees

log = structlog.get_logger("punchline.shared_store")


class NodeView(msgspec.Struct, kw_only=True):
    """What one node saw when it looked for the sentinel."""

    node_id: str
    host: str
    sees: bool
    error: str = ""
    address: str = ""  # the node's IP as Ray knows it (filled in by the driver)


def config_store(cfg: RunConfig) -> str | None:
    """``[run] store`` of a config; a relative folder is relative to the config file, like every path in it."""
    value = cfg.run.store
    if not value or "://" in value:
        return value or None
    return str(resolve_path(cfg, value).absolute())


def job_working_dir(env: dict[str, str] | None = None) -> Path | None:
    """The folder Ray unpacked this job's ``working_dir`` into, when this process is the driver of a
    Ray job submitted with one (the supervisor starts the entrypoint there)."""
    return Path.cwd().resolve() if job_runtime_env(env).get("working_dir") else None


def refuse_job_working_dir(store_url: str, env: dict[str, str] | None = None) -> None:
    """A local store inside a Ray job's temporary working dir copy: refuse, naming the fix."""
    if "://" in store_url:
        return
    work = job_working_dir(env)
    if work is None:
        return
    path = Path(store_url).resolve()
    if path == work or work in path.parents:
        raise ConfigError(
            f"store {store_url} is inside this Ray job's temporary copy of its working dir (a relative "
            f"--store or runs folder resolves there, on each node differently, and is deleted with the job); "
            f"{SHARED_HINT}"
        )


def _look(store_url: str, sentinel_bytes: bytes, node_id: str) -> bytes:
    """Runs on one node: does it read the driver's sentinel?"""
    sentinel = msgspec.msgpack.decode(sentinel_bytes, type=Sentinel)
    try:
        seen = sees(open_store(store_url), sentinel)
        view = NodeView(node_id=node_id, host=socket.gethostname(), sees=seen)
    except PunchlineError as exc:
        view = NodeView(node_id=node_id, host=socket.gethostname(), sees=False, error=str(exc)[:300])
    return msgspec.msgpack.encode(view)


def check_nodes(store: Store, sentinel: Sentinel, *, timeout_s: float = 20.0) -> list[NodeView]:
    """Ask every alive node that can run workers whether it reads ``sentinel``. Nodes that do not
    answer within ``timeout_s`` (still starting, dying) are left to the workers' own check."""
    import ray  # lazy: ray takes seconds to import

    look = ray.remote(num_cpus=0, max_retries=0)(_look)
    payload = msgspec.msgpack.encode(sentinel)
    refs: dict[Any, NodeInfo] = {}
    for node in alive_nodes():
        if node.cpus <= 0:  # the head of a deploy (num-cpus 0) runs the driver, never workers
            continue
        task = look.options(scheduling_strategy=node_affinity(node.node_id), name="punchline:store-check")
        refs[task.remote(store.url, payload, node.node_id)] = node
    ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    views: list[NodeView] = []
    for ref in ready:
        try:
            view = msgspec.msgpack.decode(ray.get(ref), type=NodeView)
        except Exception as exc:  # the task could not run there (node died): the workers will check
            lines = str(exc).strip().splitlines() or [type(exc).__name__]
            log.warning("store_check_failed", node=refs[ref].node_id[:12], error=lines[-1][:300])
            continue
        view.address = refs[ref].address
        views.append(view)
    for ref in pending:
        log.warning("store_check_no_answer", node=refs[ref].node_id[:12], timeout_s=timeout_s)
        ray.cancel(ref, force=True)
    return views


def ensure_shared(store: Store, run_id: str, *, local_ray: bool, timeout_s: float = 20.0) -> Sentinel | None:
    """Refuse a store that not every node can see; the sentinel the workers check when they start
    (None for a local Ray: one machine, one filesystem)."""
    refuse_job_working_dir(store.url)
    if local_ray:
        return None
    sentinel = plant(store, run_id)
    views = check_nodes(store, sentinel, timeout_s=timeout_s)
    blind = [v for v in views if not v.sees]
    log.info("store_checked", store=store.url, nodes=len(views), blind=len(blind))
    if blind:
        first = blind[0]
        where = f"node {first.address or first.host} ({first.node_id[:12]})"
        if len(blind) > 1:
            where += f" and {len(blind) - 1} more"
        detail = f" ({first.error})" if first.error else ""
        raise ConfigError(not_shared(store.url, where) + detail)
    return sentinel
