"""S3 unreachable for 20 s in the middle of a run (a TCP proxy in front of moto's server is switched
off): the run waits it out and finishes, its artifacts are byte-identical to an uninterrupted run's,
and no request is paid for twice: answers paid for during the outage wait in memory for the store."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import boto3
import pytest

from punchline.cluster.run.driver import RunOptions, run
from punchline.workers.fake.server import FakeProviderServer
from tests.fixtures.s3 import BUCKET, REGION, TcpProxy

pytestmark = pytest.mark.slow

OUTAGE_S = 20.0


def wait_for(cond: Any, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def test_s3_unreachable_for_20_s_mid_run_costs_no_call_and_no_byte(
    tmp_path: Path,
    make_config,
    fake: FakeProviderServer,
    redis_url: str,
    ray_local: Any,
    s3_env: dict[str, str],
    s3_url: str,
    s3_proxy: TcpProxy,
) -> None:
    cfg = make_config(jokes=8, models=("3b", "70b"), shard_size=2, lease_ms=3000)
    units = 8 * 2 * 2
    base = run(
        str(cfg), RunOptions(run_id="base", runs_dir=str(tmp_path / "runs"), redis_url=redis_url, store=str(tmp_path))
    )
    assert base.state == "finished"
    expected = (tmp_path / "base" / "artifacts" / "raw_completions.json").read_bytes()
    fake.reset()
    fake.configure(latency_ms_min=300, latency_ms_max=600)  # long enough a run for the cut to land mid-way

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PUNCHLINE_", "RAY_", "AWS_"))}
    env.update(s3_env)
    env["PUNCHLINE_S3_ENDPOINT_URL"] = s3_proxy.url  # the driver and (forwarded) its workers go through the proxy
    env["PUNCHLINE_RAY_NUM_CPUS"] = "2"
    argv = [
        sys.executable,
        "-m",
        "punchline.cluster.cli.main",
        "run",
        str(cfg),
        "--store",
        s3_url,
        "--run-id",
        "outage",
    ]
    argv += ["--redis-url", redis_url, "--runs-dir", str(tmp_path / "runs"), "--no-progress"]
    driver = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: fake.stats().total_calls >= units // 4 or driver.poll() is not None)
        assert driver.poll() is None, driver.communicate()[1][-3000:]
        s3_proxy.down()
        at_cut = fake.stats().total_calls
        time.sleep(OUTAGE_S)
        assert driver.poll() is None, f"the run ended during the outage: {driver.communicate()[1][-3000:]}"
        during = fake.stats().total_calls
        s3_proxy.up()
        _, err = driver.communicate(timeout=600)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    print(f"\ncalls: {at_cut} before the cut, {during - at_cut} during the {OUTAGE_S:.0f}s outage, {units} in all")
    print(f"connections reset by the outage: {s3_proxy.resets}")
    assert driver.returncode == 0, err[-3000:]
    assert s3_proxy.resets > 0
    calls = fake.stats().calls
    assert len(calls) == units and set(calls.values()) == {1}, calls  # nothing paid twice
    s3 = boto3.client(
        "s3",
        endpoint_url=s3_env["PUNCHLINE_S3_ENDPOINT_URL"],
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    key = f"{s3_url.removeprefix(f's3://{BUCKET}/')}/outage/artifacts/raw_completions.json"
    assert s3.get_object(Bucket=BUCKET, Key=key)["Body"].read() == expected
