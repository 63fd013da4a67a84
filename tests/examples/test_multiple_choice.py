"""``examples/multiple_choice``: the 43-line plug-in, run as its user would, against the simulated provider.

Through the CLI from a copy outside the repository (its tables and figures written: each model's accuracy with
its Wilson interval, the models compared on the same answers with McNemar's test; a second run pays 0 calls and
writes the same bytes), and by the plug-in's own kind of test: ``punchline.plugin.run_simulated``, in this
process, with the simulated providers derived from its settings.
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

from punchline.plugin import mcnemar, run_simulated, wilson

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "multiple_choice"
QUESTIONS = 8
MODELS = ("small", "large")
REPORT = ("per_model.csv", "paired.csv", "accuracy.png", "accuracy.svg", "paired.png", "paired.svg")


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


def check_report(graded: list[dict[str, Any]], files: dict[str, bytes]) -> None:
    """per_model.csv: each model's accuracy by exact match and by the judge, as counted here, with its Wilson
    interval; paired.csv: the two models on the same (question, sample) answers, McNemar's counts as counted
    here; both figures as PNG and SVG."""
    exact = {m: {(r["id"], r["sample"]): (r["parsed"] or {}).get("option") == r["answer"] for r in graded
                 if r["model"] == m} for m in MODELS}  # fmt: skip
    verdicts = {m: {(r["id"], r["sample"]): (r["judge_parsed"] or {}).get("verdict") for r in graded
                    if r["model"] == m} for m in MODELS}  # fmt: skip
    judged = {
        m: {k: v == "correct" for k, v in vs.items() if v in ("correct", "incorrect")} for m, vs in verdicts.items()
    }
    per_model = table(files["per_model.csv"])
    assert [r["model"] for r in per_model] == list(MODELS)
    for row in per_model:
        for metric, outcomes in (("exact_match", exact), ("judge", judged)):
            right, n = sum(outcomes[row["model"]].values()), len(outcomes[row["model"]])
            interval = wilson(right, n)
            assert interval is not None and int(row[f"{metric}_n"]) == n > 0
            assert float(row[metric]) == round(right / n, 6)
            assert (float(row[f"{metric}_low"]), float(row[f"{metric}_high"])) == (
                round(interval.low, 6), round(interval.high, 6))  # fmt: skip
    paired = table(files["paired.csv"])
    assert [(r["metric"], r["a"], r["b"]) for r in paired] == [("exact_match", *MODELS), ("judge", *MODELS)]
    assert int(paired[0]["items"]) == len(graded) // len(MODELS)  # every answer has its exact-match outcome
    for row, outcomes in zip(paired, (exact, judged), strict=True):
        a, b = (outcomes[m] for m in MODELS)
        shared = [k for k in a if k in b]
        only_a, only_b = sum(a[k] and not b[k] for k in shared), sum(b[k] and not a[k] for k in shared)
        assert (int(row["items"]), int(row["only_a"]), int(row["only_b"])) == (len(shared), only_a, only_b)
        assert float(row["mcnemar_p_mid"]) == round(mcnemar(only_a, only_b).p_mid, 6)
        assert float(row["difference_low"]) <= float(row["difference"]) <= float(row["difference_high"])
    for stem in ("accuracy", "paired"):
        assert files[f"{stem}.png"].startswith(b"\x89PNG") and files[f"{stem}.svg"].startswith(b"<?xml")


@pytest.mark.slow  # two whole runs through the CLI
def test_the_example_runs_through_the_cli_and_a_second_run_pays_nothing(project: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    runs = str(tmp_path / "runs")
    config = str(project / "mc.toml")
    first = punchline("run", config, "--run-id", "m1", "--runs-dir", runs, "--no-progress", cwd=elsewhere)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    assert "run m1: finished" in first.stdout and "per_model.csv, paired.csv, accuracy.png" in first.stdout
    artifacts = tmp_path / "runs" / "m1" / "artifacts"
    graded = [json.loads(line) for line in (artifacts / "grade.jsonl").read_text().splitlines()]
    assert len(graded) == QUESTIONS * len(MODELS) * 3  # rows x models x n, each with its input columns
    assert all(r["question"] and r["options"] and r["judge_text"] for r in graded)
    assert {r["judge_parsed"]["verdict"] for r in graded} <= {"correct", "incorrect"}
    check_report(graded, {name: (artifacts / name).read_bytes() for name in REPORT})
    record = json.loads((tmp_path / "runs" / "m1" / "run.json").read_text())
    assert record["stages"] == ["answer", "grade"]
    assert record["counters"]["answer"]["provider_requests"] == QUESTIONS * len(MODELS)

    again = punchline("run", config, "--run-id", "m2", "--runs-dir", runs, "--no-progress", cwd=elsewhere)
    assert again.returncode == 0, again.stderr[-3000:]
    second = json.loads((tmp_path / "runs" / "m2" / "run.json").read_text())
    assert sum(c["provider_requests"] for c in second["counters"].values()) == 0
    for name in ("grade.jsonl", "grade.parquet", *REPORT):
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
    assert first.artifacts == ["answer.jsonl", "answer.parquet", "grade.jsonl", "grade.parquet", *REPORT]
    assert len(first.rows("grade.jsonl")) == QUESTIONS * len(MODELS) * 2
    check_report(first.rows("grade.jsonl"), {name: first.artifact(name) for name in REPORT})
    again = run_simulated(MultipleChoice(), settings, tmp_dir=tmp_path / "sim", run_id="again")
    assert again.calls == 0 and again.cache_hits > 0
    assert again.artifact("per_model.csv") == first.artifact("per_model.csv")
