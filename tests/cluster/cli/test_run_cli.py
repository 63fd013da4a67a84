"""The run CLI end to end: budget stop and resume, retry-failed, status and runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from punchline.cluster.cli.main import main
from punchline.workers.fake.server import FakeProviderServer

pytestmark = pytest.mark.slow


def cli(tmp: Path, redis_url: str, *args: str) -> int:
    return main(
        [
            *args,
            "--runs-dir",
            str(tmp / "runs"),
            *(["--redis-url", redis_url, "--store", str(tmp / "store"), "--no-progress"] if args[0] == "run" else []),
        ]
    )


def test_budget_stops_scheduling_then_a_resume_finishes_without_paying_twice(
    tmp_path: Path, make_config, fake: FakeProviderServer, redis_url: str, ray_local: Any, capsys
) -> None:
    cfg = make_config(jokes=6, models=("3b", "70b"), samples=4, shard_size=2, workers_per_node=1)
    # each request is held at its bound, ~(300 in * 1 + 12 out * 2) / 1e6 $; 0.0008 $ covers only part of the 24
    code = cli(tmp_path, redis_url, "run", str(cfg), "--run-id", "b1", "--max-cost-usd", "0.0008")
    assert code == 2
    assert "budget" in capsys.readouterr().err
    rec = json.loads((tmp_path / "runs" / "b1" / "run.json").read_text())
    assert rec["state"] == "budget"
    paid = fake.stats().total_calls
    assert 0 < paid < 24
    assert cli(tmp_path, redis_url, "run", str(cfg), "--run-id", "b1", "--max-cost-usd", "10") == 0
    calls = fake.stats().calls
    assert len(calls) == 24 and set(calls.values()) == {1}


def test_retry_failed_calls_only_the_failed_units(
    tmp_path: Path, make_config, fake: FakeProviderServer, redis_url: str, ray_local: Any, capsys
) -> None:
    cfg = make_config(jokes=3, models=("3b", "70b"), samples=2)
    fake.configure(status_for_model={"sim/llama-70b": 404})
    assert cli(tmp_path, redis_url, "run", str(cfg), "--run-id", "f1") == 1
    assert main(["status", "f1", "--runs-dir", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert "6 failed units in collect" in out and "collect/00000/70b/greedy" in out and "404" in out
    fake.restore_defaults()
    fake.reset()
    assert main(["retry-failed", "f1", "--runs-dir", str(tmp_path / "runs"), "--no-progress"]) == 0
    calls = fake.stats().calls
    assert len(calls) == 6 and set(calls.values()) == {1}  # only the 70b units, once each
    assert fake.stats().calls_by_model == {"sim/llama-70b": 6}
    rec = json.loads((tmp_path / "runs" / "f1" / "run.json").read_text())
    assert rec["state"] == "finished" and rec["failures"] == {}
    assert main(["runs", "--runs-dir", str(tmp_path / "runs")]) == 0
    assert "f1" in capsys.readouterr().out


def test_a_finished_run_answers_from_its_record_without_starting_a_service(
    tmp_path: Path, make_config, fake: FakeProviderServer, redis_url: str, ray_local: Any, capsys, monkeypatch
) -> None:
    cfg = make_config(jokes=2, models=("3b",), samples=2)
    assert cli(tmp_path, redis_url, "run", str(cfg), "--run-id", "done") == 0
    capsys.readouterr()
    fake.reset()

    def no_service(*args: object, **kwargs: object) -> None:
        raise AssertionError("a service was started for a run with nothing to do")

    monkeypatch.setattr("punchline.cluster.run.driver.RunServices", no_service)
    monkeypatch.setattr("punchline.cluster.run.run_services.ensure_ray", no_service)
    assert cli(tmp_path, redis_url, "run", str(cfg), "--run-id", "done") == 0  # resumed: nothing to do
    assert "run done: finished" in capsys.readouterr().out
    assert main(["retry-failed", "done", "--runs-dir", str(tmp_path / "runs"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "run done: finished" in out and "artifacts in" in out
    assert fake.stats().total_calls == 0
    # a stage manifest gone (e.g. dropped by a retry): the run is resumed for real
    next((tmp_path / "store" / "done" / "stages").glob("*/manifest.json")).unlink()
    assert cli(tmp_path, redis_url, "run", str(cfg), "--run-id", "done") != 0
    assert "a service was started" in capsys.readouterr().err
