"""``examples/multiple_choice``: the 60-line plug-in, run as its user would, against the simulated provider.

Through the CLI from a copy outside the repository (its table and plot written, a second run pays 0 calls
and writes the same bytes), and by the plug-in's own kind of test: ``punchline.plugin.run_simulated``, in
this process, with the simulated providers derived from its settings.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from punchline.plugin import run_simulated

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "multiple_choice"
QUESTIONS = 8
MODELS = ("small", "large")


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    proj = tmp_path / "mc"
    shutil.copytree(EXAMPLE, proj, ignore=shutil.ignore_patterns("__pycache__", "runs", "*.egg-info", "build"))
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield proj
    for name in [m for m in sys.modules if m.partition(".")[0] == "multiple_choice"]:
        del sys.modules[name]


def punchline(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PUNCHLINE_", "PYTHONPATH"))}
    return subprocess.run(
        [sys.executable, "-m", "punchline", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


def table(raw: bytes) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(raw.decode())))


@pytest.mark.slow  # two whole runs through the CLI
def test_the_example_runs_through_the_cli_and_a_second_run_pays_nothing(project: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    runs = str(tmp_path / "runs")
    config = str(project / "mc.toml")
    first = punchline("run", config, "--run-id", "m1", "--runs-dir", runs, "--no-progress", cwd=elsewhere)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    assert "run m1: finished" in first.stdout and "per_model.csv, accuracy.png" in first.stdout  # the headlines
    artifacts = tmp_path / "runs" / "m1" / "artifacts"
    graded = [json.loads(line) for line in (artifacts / "grade.jsonl").read_text().splitlines()]
    assert len(graded) == QUESTIONS * len(MODELS) * 3  # rows x models x n, each with its input columns
    assert all(r["question"] and r["options"] and r["judge_text"] for r in graded)
    assert {r["judge_parsed"]["verdict"] for r in graded} <= {"correct", "incorrect"}
    per_model = table((artifacts / "per_model.csv").read_bytes())
    assert [r["model"] for r in per_model] == list(MODELS)
    for row in per_model:
        mine = [r for r in graded if r["model"] == row["model"]]
        exact = sum((r["parsed"] or {}).get("option") == r["answer"] for r in mine) / len(mine)
        assert int(row["answers"]) == len(mine) and float(row["exact_match"]) == exact
    assert (artifacts / "accuracy.png").read_bytes().startswith(b"\x89PNG")
    record = json.loads((tmp_path / "runs" / "m1" / "run.json").read_text())
    assert record["stages"] == ["answer", "grade"]
    assert record["counters"]["answer"]["provider_requests"] == QUESTIONS * len(MODELS)

    again = punchline("run", config, "--run-id", "m2", "--runs-dir", runs, "--no-progress", cwd=elsewhere)
    assert again.returncode == 0, again.stderr[-3000:]
    second = json.loads((tmp_path / "runs" / "m2" / "run.json").read_text())
    assert sum(c["provider_requests"] for c in second["counters"].values()) == 0
    for name in ("grade.jsonl", "grade.parquet", "per_model.csv", "accuracy.png"):
        assert (tmp_path / "runs" / "m2" / "artifacts" / name).read_bytes() == (artifacts / name).read_bytes(), name


@pytest.mark.slow  # two whole runs, in this process
def test_run_simulated_is_a_plugins_own_test(
    project: Path, tmp_path: Path, ray_local: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sys.path.insert(0, str(project))
    from multiple_choice import MultipleChoice  # type: ignore[import-not-found]

    monkeypatch.chdir(project)  # a plug-in's test names its files relative to where it runs
    settings = {"questions": "data/questions.jsonl", "models": list(MODELS), "judge": "j", "n": 2}
    first = run_simulated(MultipleChoice(), settings, tmp_dir=tmp_path / "sim")
    assert first.record.state == "finished" and first.calls > 0
    assert first.artifacts == [
        "answer.jsonl", "answer.parquet", "grade.jsonl", "grade.parquet", "per_model.csv", "accuracy.png"
    ]  # fmt: skip
    assert [r["model"] for r in table(first.artifact("per_model.csv"))] == list(MODELS)
    assert len(first.rows("grade.jsonl")) == QUESTIONS * len(MODELS) * 2
    again = run_simulated(MultipleChoice(), settings, tmp_dir=tmp_path / "sim", run_id="again")
    assert again.calls == 0 and again.cache_hits > 0
    assert again.artifact("per_model.csv") == first.artifact("per_model.csv")
