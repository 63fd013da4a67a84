"""A store every node can see, or a refusal before any paid call (cluster/ray_cluster/shared_store.py,
data/stores/sentinel.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest

from punchline.cluster.config import load_config
from punchline.cluster.ray_cluster.ray_runtime import JOB_CONFIG_ENV, job_runtime_env
from punchline.cluster.ray_cluster.shared_store import config_store, refuse_job_working_dir
from punchline.data.errors import ConfigError, StoreError
from punchline.data.stores import open_store
from punchline.data.stores.sentinel import ensure_sees, plant, sees
from punchline.workers.fake.server import FakeProviderServer
from tests.fixtures.ray_start import RayStartCluster
from tests.fixtures.s3 import BUCKET, REGION

JOB_ENV = {JOB_CONFIG_ENV: json.dumps({"runtime_env": {"working_dir": "gcs://_ray_pkg_0123abcd.zip"}})}


def test_a_store_inside_a_ray_jobs_working_dir_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "runtime_resources" / "working_dir_files" / "_ray_pkg_0123abcd"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    store = open_store("runs")  # the default, relative to the job's copy of the working dir
    with pytest.raises(ConfigError) as caught:
        refuse_job_working_dir(store.url, JOB_ENV)
    message = str(caught.value)
    assert "\n" not in message and "--store s3://bucket/prefix" in message and "working dir" in message
    # outside the working dir, on S3, or not a job with a working dir: fine
    refuse_job_working_dir(str(tmp_path / "shared"), JOB_ENV)
    refuse_job_working_dir("s3://bucket/prefix", JOB_ENV)
    refuse_job_working_dir(store.url, {})
    refuse_job_working_dir(store.url, {JOB_CONFIG_ENV: json.dumps({"runtime_env": {}})})


def test_a_relative_store_in_a_config_is_relative_to_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "project" / "configs"
    folder.mkdir(parents=True)
    text = (Path(__file__).resolve().parents[3] / "configs" / "demo.toml").read_text()
    text = text.replace('name = "demo"', 'name = "demo"\nstore = "../store"')
    text = text.replace('"../data/samples/puns_sample.json"', '"jokes.json"')
    (folder / "run.toml").write_text(text)
    monkeypatch.chdir(tmp_path)
    assert config_store(load_config("project/configs/run.toml")) == str(tmp_path / "project" / "configs" / "../store")
    (folder / "run.toml").write_text(text.replace('"../store"', '"s3://bucket-b/p"'))
    assert config_store(load_config("project/configs/run.toml")) == "s3://bucket-b/p"


def test_the_sentinel_is_seen_only_where_the_driver_wrote_it(tmp_path: Path) -> None:
    here = open_store(str(tmp_path / "shared"))
    sentinel = plant(here, "run-1")
    assert sees(here, sentinel) and sees(open_store(str(tmp_path / "shared")), sentinel)
    elsewhere = open_store(str(tmp_path / "a-nodes-own-disk"))
    assert not sees(elsewhere, sentinel)
    with pytest.raises(StoreError, match="not shared: worker w1 cannot see"):
        ensure_sees(elsewhere, sentinel, "worker w1")
    ensure_sees(elsewhere, None, "worker w1")  # a local run checks nothing
    here.put(sentinel.key, b"not json")
    assert not sees(here, sentinel)


def _clean_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PUNCHLINE_", "RAY_", "AWS_"))}
    env.update(extra)
    return env


def _run_cli(args: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "punchline.cluster.cli.main", "run", *args, "--no-progress"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,  # a hang is the bug this guards against; a pass takes seconds
        check=False,
    )
    return done, time.monotonic() - started


@pytest.mark.slow
def test_a_folder_one_node_cannot_see_stops_the_run_before_any_call(
    tmp_path: Path, make_config, fake: FakeProviderServer, redis_url: str, s3_env: dict[str, str], s3_url: str
) -> None:
    store = tmp_path / "store"
    store.mkdir()
    env = _clean_env(s3_env)
    cluster = RayStartCluster(env, logs=tmp_path / "ray-logs")
    try:
        cluster.start_head()
        cluster.add_worker(private=(store,))  # like a node on another machine: its own empty disk there
        cluster.wait_for_nodes(2)
        cfg = make_config(jokes=4, models=("3b",))
        common = ["--redis-url", redis_url, "--ray-address", cluster.address, "--runs-dir", str(tmp_path / "runs")]

        done, elapsed_s = _run_cli([str(cfg), "--store", str(store), "--run-id", "local", *common], cluster.env)
        print(f"refused after {elapsed_s:.1f}s (driver start included): {done.stderr.strip()}")
        assert done.returncode == 2, done.stderr[-3000:]
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert f"store {store} is not shared: node" in lines[0] and "--store s3://bucket/prefix" in lines[0]
        assert fake.stats().total_calls == 0
        assert not list(store.glob("local/stages/*/shards/*"))

        # the same cluster with a store every node shares runs to the end
        done, _ = _run_cli([str(cfg), "--store", s3_url, "--run-id", "shared", *common], cluster.env)
        assert done.returncode == 0, done.stderr[-3000:]
        assert set(fake.stats().calls.values()) == {1} and len(fake.stats().calls) == 4 * 2
        s3 = boto3.client(
            "s3",
            endpoint_url=s3_env["PUNCHLINE_S3_ENDPOINT_URL"],
            region_name=REGION,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        prefix = s3_url.removeprefix(f"s3://{BUCKET}/")
        listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{prefix}/shared/artifacts/")
        assert any(o["Key"].endswith("raw_completions.json") for o in listed.get("Contents", []))
    finally:
        cluster.shutdown()


@pytest.mark.slow  # Ray or several processes: not in `make test-fast`
def test_a_node_whose_workers_cannot_see_the_store_is_excluded_not_restarted(
    tmp_path: Path, redis_url: str, ray_local: object
) -> None:
    """A node with its own view of the store is left out of scheduling (not restarted in a loop); with
    no node left, the stage stops with the store's one line (here: the only, local, node)."""
    from punchline.cluster.run.executors.shards import WorkerPool
    from punchline.workers.shard_worker import WorkerConfig

    sentinel = plant(open_store(str(tmp_path / "drivers-view")), "r1")
    cfg = WorkerConfig(
        run_id="r1",
        redis_url=redis_url,
        store_url=str(tmp_path / "nodes-own-disk"),
        providers={},
        store_sentinel=sentinel,
    )
    pool = WorkerPool(cfg, per_node=2, cpus=0.1, stage="collect", plan_bytes=b"")
    deadline = time.monotonic() + 300  # generous: actors start slowly on a loaded machine
    try:
        while pool.every_node_excluded() is None or pool.slots:
            assert time.monotonic() < deadline, f"not excluded: {pool.excluded} {pool.last_death}"
            pool.reconcile()
            pool.poll(1.0)
        for _ in range(3):  # later ticks start nothing on the excluded node
            pool.reconcile()
            pool.poll(0.2)
        assert pool.started == 2 and pool.replaced == 0 and pool.deaths_since_progress == 0 and not pool.slots
        reason = pool.every_node_excluded()
        assert reason is not None and "cannot see what the driver wrote" in reason
        assert pool.alive_nodes() == []
    finally:
        pool.shutdown()


def test_a_jobs_own_env_vars_are_not_forwarded_again_by_the_driver() -> None:
    """Ray refuses to merge a job's runtime_env env_vars (`submit --env`) with ray.init's when a variable is
    in both; the driver reads the job's and leaves those out of what it forwards."""
    env = {JOB_CONFIG_ENV: json.dumps({"runtime_env": {"working_dir": "gcs://x.zip", "env_vars": {"A": "1"}}})}
    assert job_runtime_env(env)["env_vars"] == {"A": "1"}
    assert job_runtime_env({}) == {} and job_runtime_env({JOB_CONFIG_ENV: "not json"}) == {}
