"""Ray starts small, our packages import in workers, and node loss is visible."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
import ray

from punchline.cluster.ray_cluster.ray_runtime import (
    alive_nodes,
    all_nodes,
    cluster_cpus,
    ensure_ray,
    node_affinity,
)
from punchline.data.errors import ConfigError
from punchline.services.ray_settings import RaySettings
from tests.fixtures.ray import timings_s


def test_settings_from_env() -> None:
    assert RaySettings.from_env({}).address is None
    assert RaySettings.from_env({"RAY_ADDRESS": "ray://h:10001"}).address == "ray://h:10001"
    both = {"RAY_ADDRESS": "ray://a:10001", "PUNCHLINE_RAY_ADDRESS": "ray://b:10001"}
    assert RaySettings.from_env(both).address == "ray://b:10001"
    assert RaySettings.from_env({"PUNCHLINE_RAY_ADDRESS": "local"}).is_local
    assert RaySettings.from_env({"PUNCHLINE_RAY_NUM_CPUS": "3"}).num_cpus == 3
    forwarded = RaySettings.from_env({"AWS_DEFAULT_REGION": "eu-west-1", "AWS_SECRET_ACCESS_KEY": "s", "HOME": "/h"})
    assert forwarded.env_vars == {"AWS_DEFAULT_REGION": "eu-west-1"}  # config yes, credentials never
    with pytest.raises(ConfigError):
        RaySettings.from_env({"PUNCHLINE_RAY_NUM_CPUS": "many"})


@ray.remote
def _where_is_schemas() -> tuple[str, int]:
    import punchline.pipelines.puns.data.schemas

    return punchline.pipelines.puns.data.schemas.__file__ or "", os.getpid()


@pytest.mark.slow  # Ray or several processes: not in `make test-fast`
def test_local_ray_imports_project_modules(ray_local: RaySettings) -> None:
    ensure_ray(ray_local)  # second call is a no-op
    path, pid = ray.get(_where_is_schemas.remote(), timeout=120)
    assert path.endswith(os.path.join("punchline", "pipelines", "puns", "data", "schemas.py"))
    assert pid != os.getpid()
    nodes = alive_nodes()
    assert len(nodes) == 1 and nodes[0].cpus == 2 and nodes[0].alive
    assert 0 < nodes[0].object_store_bytes <= 200 * 1024 * 1024
    assert cluster_cpus() == 2
    assert ray.get_runtime_context().namespace == "punchline"
    print(f"\nray local start: {timings_s.get('ray_local_start', float('nan')):.1f}s")


@ray.remote(num_cpus=1)
class _Probe:
    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()


@pytest.mark.slow
def test_cluster_place_actors_per_node_and_lose_one(ray_cluster: Any) -> None:
    nodes = alive_nodes()
    assert len(nodes) == 3 and sum(n.is_head for n in nodes) == 1
    assert all(n.cpus == 1 for n in nodes)

    probes = [_Probe.options(scheduling_strategy=node_affinity(n.node_id)).remote() for n in nodes]
    placed = ray.get([p.node.remote() for p in probes], timeout=120)
    assert placed == [n.node_id for n in nodes]
    for p in probes:
        ray.kill(p)

    victim = next(iter(ray_cluster.worker_nodes))
    victim_id = victim.node_id
    ray_cluster.remove_node(victim)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if victim_id not in {n.node_id for n in alive_nodes()}:
            break
        time.sleep(0.2)
    dead = {n.node_id: n for n in all_nodes()}
    assert dead[victim_id].alive is False
    assert len(alive_nodes()) == 2

    # Scale back up: a new node joins and takes work.
    ray_cluster.add_node(num_cpus=1, object_store_memory=100 * 1024 * 1024)
    ray_cluster.wait_for_nodes()
    assert len(alive_nodes()) == 3
    print(f"\nray cluster (head + 2 workers) start: {timings_s.get('ray_cluster_start', float('nan')):.1f}s")


@ray.remote
def _read_store(url: str, key: str) -> bytes | None:
    from punchline.data.stores import open_store

    return open_store(url).get(key)


@pytest.mark.slow  # Ray or several processes: not in `make test-fast`
def test_workers_reach_the_s3_store(ray_local: RaySettings, s3_url: str) -> None:
    from punchline.data.stores import open_store

    open_store(s3_url).put("from-driver", b"hello")
    assert ray.get(_read_store.remote(s3_url, "from-driver"), timeout=120) == b"hello"


@pytest.mark.slow  # Ray or several processes: not in `make test-fast`
def test_local_ray_is_back_after_cluster(ray_local: RaySettings) -> None:
    """Runs after the cluster test (file order): ray_local's Ray was restored."""
    assert ray.is_initialized()
    path, _ = ray.get(_where_is_schemas.remote(), timeout=120)
    assert path.endswith("schemas.py")
    assert len(alive_nodes()) == 1


@pytest.mark.slow  # Ray or several processes: not in `make test-fast`
def test_a_local_ray_listens_on_the_loopback_only(ray_local: RaySettings) -> None:
    """A private local Ray is not reachable from the network: its GCS, raylet and workers bind 127.0.0.1."""
    import subprocess

    import psutil

    from punchline.cluster.ray_cluster.ray_runtime import _is_loopback

    gcs = ray.get_runtime_context().gcs_address
    assert gcs.startswith("127.0.0.1:"), gcs
    ray.get(_where_is_schemas.remote(), timeout=120)  # a worker process exists
    ours = {p.pid for p in psutil.Process().children(recursive=True)}
    listening = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout.splitlines()
    mine = [line.split()[3] for line in listening if any(f"pid={pid}," in line for pid in ours)]
    assert mine, "no Ray process listening?"
    exposed = [addr for addr in mine if not addr.replace("[::ffff:", "").startswith("127.0.0.1")]
    assert exposed == [], exposed
    assert _is_loopback("127.0.0.1:6379") and _is_loopback("localhost:1") and not _is_loopback("ray://127.0.0.1:1")
    assert not _is_loopback("10.0.0.5:6379") and not _is_loopback(None)
