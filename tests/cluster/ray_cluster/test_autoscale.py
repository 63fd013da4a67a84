"""Asking the autoscaler for worker nodes (cluster/ray_cluster/autoscale.py) while a stage has more pending shards
than live workers, and withdrawing the request when it drains. The SDK is a fake that records what
it was asked; one test sends a request through Ray's real SDK and reads it back from the GCS."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from punchline.cluster.ray_cluster.autoscale import Autoscaler, AutoscaleSettings, ray_request_resources, run_settings
from punchline.cluster.run.driver import RunOptions, run
from punchline.data.errors import ConfigError
from punchline.workers.fake.server import FakeProviderServer


class FakeAutoscalerSDK:
    """Stands in for ``ray.autoscaler.sdk.request_resources``: records every request."""

    def __init__(self) -> None:
        self.requests: list[list[dict[str, float]]] = []

    def __call__(self, *, bundles: list[dict[str, float]]) -> None:
        self.requests.append([dict(b) for b in bundles])


def scaler(sdk: FakeAutoscalerSDK, *, max_workers: int, per_node: int = 2, node_cpus: list[float] | None = None):
    return Autoscaler(
        AutoscaleSettings(max_workers=max_workers),
        per_node=per_node,
        request_resources=sdk,
        worker_node_cpus=lambda: node_cpus or [],
    )


def test_asks_for_the_nodes_pending_shards_could_use_bounded_by_max_workers() -> None:
    sdk = FakeAutoscalerSDK()
    auto = scaler(sdk, max_workers=5, node_cpus=[4.0, 2.0])
    auto.update(pending_shards=40, live_workers=4)  # 20 nodes' worth of shards: capped at 5
    assert sdk.requests == [[{"CPU": 4.0}] * 5]
    auto.update(pending_shards=38, live_workers=6)  # same target: nothing new is sent
    assert len(sdk.requests) == 1
    auto.update(pending_shards=7, live_workers=6)  # 4 nodes' worth now
    assert sdk.requests[-1] == [{"CPU": 4.0}] * 4
    auto.update(pending_shards=6, live_workers=6)  # no more shards than workers: withdrawn
    assert sdk.requests[-1] == [] and auto.requested_nodes == 0
    auto.update(pending_shards=0, live_workers=6)
    auto.release()
    assert len(sdk.requests) == 3


def test_never_asks_with_max_workers_zero_and_survives_a_failing_sdk() -> None:
    sdk = FakeAutoscalerSDK()
    auto = scaler(sdk, max_workers=0)
    auto.update(pending_shards=100, live_workers=1)
    auto.release()
    assert sdk.requests == []

    def broken(*, bundles: list[dict[str, float]]) -> None:
        raise RuntimeError("GCS unavailable")

    failing = Autoscaler(
        AutoscaleSettings(max_workers=2), per_node=1, request_resources=broken, worker_node_cpus=lambda: []
    )
    failing.update(pending_shards=10, live_workers=1)  # logged, not raised
    assert failing.requests == 1


def test_settings_config_then_environment_then_flag() -> None:
    assert run_settings(3, None, {}).max_workers == 3
    env = {"PUNCHLINE_MAX_WORKERS": "8", "PUNCHLINE_WORKER_NODE_CPUS": "4"}
    assert run_settings(3, None, env) == AutoscaleSettings(max_workers=8, node_cpus=4.0)
    assert run_settings(3, 2, env).max_workers == 2
    assert AutoscaleSettings.from_env(env) == AutoscaleSettings(max_workers=8, node_cpus=4.0)
    bad_envs = [{"PUNCHLINE_MAX_WORKERS": "many"}, {"PUNCHLINE_MAX_WORKERS": "-1"}, {"PUNCHLINE_WORKER_NODE_CPUS": "0"}]
    for bad in bad_envs:
        with pytest.raises(ConfigError, match=next(iter(bad))):
            AutoscaleSettings.from_env(bad)


@pytest.mark.slow  # Ray or several processes: not in `make test-fast`
def test_a_request_through_rays_sdk_reaches_the_gcs(ray_local: Any) -> None:
    auto = Autoscaler(
        AutoscaleSettings(max_workers=3),
        per_node=1,
        request_resources=ray_request_resources(),
        worker_node_cpus=lambda: [2.0],
    )
    auto.update(pending_shards=10, live_workers=1)
    assert _requested() == [{"CPU": 2.0}] * 3
    auto.release()
    assert _requested() == []


def _requested() -> list[dict[str, float]]:
    """The standing resource request as the autoscaler will read it (v1: GCS KV; v2: GCS constraints)."""
    from ray.autoscaler.v2.utils import is_autoscaler_v2

    if is_autoscaler_v2():
        from ray.autoscaler.v2.sdk import get_cluster_resource_state
        from ray.experimental.internal_kv import internal_kv_get_gcs_client

        state = get_cluster_resource_state(internal_kv_get_gcs_client())
        return [
            dict(b.resources_bundle)
            for c in state.cluster_resource_constraints
            for r in c.resource_requests
            for b in [r.request] * r.count
        ]
    from ray.autoscaler._private.constants import AUTOSCALER_RESOURCE_REQUEST_CHANNEL
    from ray.experimental.internal_kv import _internal_kv_get

    raw = _internal_kv_get(AUTOSCALER_RESOURCE_REQUEST_CHANNEL)
    return json.loads(raw) if raw else []


@pytest.mark.slow
def test_a_stage_with_more_shards_than_workers_asks_for_nodes_and_lets_them_go(
    tmp_path: Path, make_config, fake: FakeProviderServer, redis_url: str, ray_local: Any
) -> None:
    cfg = make_config(jokes=6, models=("3b",), shard_size=1, workers_per_node=1)
    cfg.write_text(cfg.read_text().replace("workers_per_node = 1", "workers_per_node = 1\nmax_workers = 3"))
    sdk = FakeAutoscalerSDK()
    opts = RunOptions(run_id="elastic", runs_dir=str(tmp_path / "runs"), redis_url=redis_url, store=str(tmp_path / "s"))
    rec = run(str(cfg), opts, request_resources=sdk)
    assert rec.state == "finished"
    # 12 shards and one worker on the one local node (2 CPUs): ask for 3 nodes of that size, then withdraw
    assert sdk.requests[0] == [{"CPU": 2.0}] * 3, sdk.requests
    assert all(len(r) <= 3 for r in sdk.requests)
    assert sdk.requests[-1] == []
    assert len(sdk.requests) <= 6  # changes only, never a request per poll

    sdk.requests.clear()  # the same stage with the flag saying never: no request at all
    opts2 = RunOptions(
        run_id="fixed", runs_dir=str(tmp_path / "runs"), redis_url=redis_url, store=str(tmp_path / "s2"), max_workers=0
    )
    assert run(str(cfg), opts2, request_resources=sdk).state == "finished"
    assert sdk.requests == []
