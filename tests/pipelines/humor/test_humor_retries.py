"""Under ``preset = "mera"`` MERA's judge posts each call once and scores a failed one 0; ``retry-failed`` asks the
failed calls again, which moves the score: the report says so (issue 41 item 9). Real Redis and Ray, the
simulated provider over HTTP told to fail every first attempt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from punchline.cluster.cli.main import main
from punchline.cluster.run.driver import RunOptions, run
from punchline.pipelines.humor.data.mera import mera_readings
from punchline.workers.fake.server import FakeProviderServer
from tests.pipelines.humor.test_humor_pipeline import JUDGE_ID, _answers, _artifact, humor_config


@pytest.mark.slow
def test_retry_failed_under_the_mera_preset_is_recorded_in_the_report(
    tmp_path: Path, fake: FakeProviderServer, redis_url: str, ray_local
) -> None:
    fake.configure(fail_first_attempts=1)  # answers and our judge retry past it; MERA's judge calls fail
    cfg = humor_config(
        tmp_path / "humor.toml",
        openai_url=fake.openai_base_url,
        anthropic_url=fake.anthropic_base_url,
        models={"a": "sim/humor-small"},
        extra='preset = "mera"',
    )
    store, runs = tmp_path / "store", tmp_path / "runs"
    rec = run(str(cfg), RunOptions(run_id="m", runs_dir=str(runs), redis_url=redis_url, store=str(store)))
    assert rec.state == "failed"
    first = json.loads(_artifact(store, "m", "report/a/report.json"))
    answers = _answers(_artifact(store, "m", "answers/a.jsonl"))
    calls = {item: len(mera_readings(text)) for item, text in answers.items()}
    assert first["judge_mera"] == 0.0 and first["judge_mera_failed_calls"] == sum(calls.values())
    assert first["judge_mera_retried"] == []
    assert "judge calls asked again: none" in _artifact(store, "m", "report/a/report.md").decode()

    assert main(["retry-failed", "m", "--runs-dir", str(runs), "--no-progress"]) == 0
    report = json.loads(_artifact(store, "m", "report/a/report.json"))
    assert report["judge_mera_failed_calls"] == 0 and report["judge_mera"] > 0.0  # the score moved: ...
    retried = report["judge_mera_retried"]  # ... and the report lists every call asked again, by item
    assert [r["item"] for r in retried] == sorted(calls)
    for r in retried:
        assert (r["model"], r["judge"], r["by"], r["calls"]) == ("a", JUDGE_ID, "retry-failed", calls[r["item"]])
        assert r["score_before"] == 0.0 and r["score_after"] == report["judge_mera_scores"][str(r["item"])]
    md = _artifact(store, "m", "report/a/report.md").decode()
    assert f"{sum(calls.values())} failed calls answered after retry-failed" in md
    item = retried[0]
    assert f"| {item['item']} | a | {JUDGE_ID} | retry-failed | {item['calls']} | 0 → {item['score_after']:g} |" in md
