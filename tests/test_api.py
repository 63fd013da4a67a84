"""The Python API: ``punchline.run`` / ``punchline.status`` return the run's record and raise the project's
errors, print nothing, and ``import punchline`` alone loads neither the engine nor Ray."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import punchline
from punchline.cluster.driver import RunRecord
from punchline.data.errors import ConfigError, InputError, PunchlineError

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "sentiment_pipeline"


def test_importing_punchline_stays_cheap() -> None:
    code = (
        "import sys, punchline\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'redis', 'boto3', 'openai')"
        " or m.startswith('punchline.'))\n"
        "print(heavy)\n"
        "punchline.run\n"  # the first use imports the API
        "print('punchline.cluster.driver' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.splitlines() == ["[]", "True"]
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        punchline.nope  # noqa: B018


@pytest.fixture
def example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    proj = tmp_path / "sentiment"
    shutil.copytree(EXAMPLE, proj, ignore=shutil.ignore_patterns("__pycache__", "runs"))
    monkeypatch.setattr(sys, "path", list(sys.path))  # the run appends the config's folder: undo it
    yield proj
    for name in [m for m in sys.modules if m.partition(".")[0] == "sentiment_pipeline"]:
        del sys.modules[name]


def test_run_returns_the_runs_record_and_prints_nothing(
    example: Path, tmp_path: Path, ray_local: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    runs = str(tmp_path / "runs")
    result = punchline.run(example / "sentiment.toml", run_id="api-1", runs_dir=runs)
    assert isinstance(result, RunRecord)
    assert (result.run_id, result.state, result.stages) == ("api-1", "finished", ["label", "judge"])
    assert result.artifacts == ["labels.jsonl", "judged.jsonl", "summary.json"]
    assert result.counters["label"].units_done == result.counters["judge"].units_done == 12
    assert {(u.stage, u.model) for u in result.usage} == {("label", "sim-labeller-8b"), ("judge", "sim-judge-70b")}
    assert all(u.input_tokens > 0 and u.usd > 0 for u in result.usage)
    summary = Path(punchline.artifact_url(result, "summary.json"))
    assert json.loads(summary.read_text())["reviews"] == 12
    out = capfd.readouterr().out
    assert out == "", out[-2000:]

    assert punchline.status("api-1", runs_dir=runs) == result
    again = punchline.run(example / "sentiment.toml", run_id="api-1", runs_dir=runs)  # resume a finished run
    assert again.state == "finished" and again.artifacts == result.artifacts


def test_errors_raise_the_projects_exceptions(example: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    config = example / "sentiment.toml"
    config.write_text(config.read_text().replace('model = "small"', 'model = "small"\nmax_tokens = 0'))
    with pytest.raises(ConfigError) as err:
        punchline.run(config, runs_dir=str(tmp_path / "runs"))
    assert err.value.field == "sentiment.label.max_tokens" and isinstance(err.value, PunchlineError)
    with pytest.raises(InputError, match="no run 'nope'"):
        punchline.status("nope", runs_dir=str(tmp_path / "runs"))
    with pytest.raises(ConfigError, match="run id"):
        punchline.run(example / "sentiment.toml", run_id="../escape", runs_dir=str(tmp_path / "runs"))
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == ""
