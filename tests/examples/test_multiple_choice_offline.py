"""``examples/multiple_choice`` offline: the simulated provider answers in the stage's own format, each model right
as often as ``[simulator] accuracy`` in ``mc.toml`` says, and its judge grades right as often as its own rate.

Run as its user would (``punchline run mc.toml`` from a copy), with more samples per question than the example's
3 (``n = 20``, its config's one change) so that each model's share is measured within a few points.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "multiple_choice"
SAMPLES = 20


@pytest.mark.slow  # a whole run through the CLI
def test_each_model_is_right_about_as_often_as_its_configured_accuracy(tmp_path: Path) -> None:
    project = tmp_path / "mc"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("__pycache__", "runs", "*.egg-info", "build"))
    config = project / "mc.toml"
    text = config.read_text()
    assert "\nn = 3\n" in text
    config.write_text(text.replace("\nn = 3\n", f"\nn = {SAMPLES}\n"))
    rates = tomllib.loads(text)["simulator"]["accuracy"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PUNCHLINE_", "PYTHONPATH"))}
    done = subprocess.run(
        [sys.executable, "-m", "punchline", "run", str(config), "--run-id", "acc", "--runs-dir",
         str(tmp_path / "runs"), "--no-progress"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "answers parsed" not in done.stdout + done.stderr  # no never-parsed warning
    graded = [json.loads(line) for line in (tmp_path / "runs/acc/artifacts/grade.jsonl").read_text().splitlines()]
    measured = {}
    for model in ("small", "large"):
        mine = [r for r in graded if r["model"] == model]
        assert len(mine) == 8 * SAMPLES and all(r["parsed"] is not None for r in mine)  # every answer parses
        measured[model] = sum(r["parsed"]["option"] == r["answer"] for r in mine) / len(mine)
        assert abs(measured[model] - rates[model]) < 0.1, measured  # 160 answers: ~2.5 standard deviations
    assert measured["large"] - measured["small"] > 0.25  # configured 0.4 and 0.8: the study tells them apart
    agree = [(r["judge_parsed"]["verdict"] == "correct") == (r["parsed"]["option"] == r["answer"]) for r in graded]
    assert abs(sum(agree) / len(agree) - rates["judge"]) < 0.06
