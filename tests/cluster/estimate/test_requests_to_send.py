"""``plan`` counts the requests a run will send: identical requests once (hashed as the engine keys them), the
response cache's answers not at all, and a stage whose prompts depend on earlier answers by the share an earlier
run of it sent (else every unit, said to be an upper bound)."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from punchline.cluster.cli.main import main
from punchline.cluster.config import load_config
from punchline.cluster.estimate import wall_estimate as w
from punchline.cluster.estimate.request_ratios import request_ratios
from punchline.cluster.pipeline import StageContext
from punchline.cluster.records.run_record import RunRecord, Services
from punchline.cluster.registry import pipeline_of
from punchline.cluster.run.planner import HASHED, NO_RATIO, plan_run
from punchline.data.requests import ProviderResponse
from punchline.data.storage.response_cache import ResponseCache
from punchline.data.storage.run_layout import RunLayout
from punchline.data.stores.local import LocalStore
from punchline.data.units import ModelUsage, ShardUsage, StageManifest
from punchline.schedulers.ledger import StageCounters

REPO = Path(__file__).resolve().parents[3]
SONNET = "claude-sonnet-4-20250514"


def _config(tmp_path: Path, copies: int = 2, judge_url: str = "simulated") -> Path:
    """The prompts demo over its 36 questions, each row written ``copies`` times under another id: the same
    prompt, so the same request."""
    rows = [json.loads(line) for line in (REPO / "data" / "samples" / "prompts_sample.jsonl").read_text().splitlines()]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(row | {"id": f"{row['id']}-{i}"}) + "\n" for row in rows for i in range(copies)))
    text = (REPO / "configs" / "prompts_demo.toml").read_text()
    text = text.replace('"../data/samples/prompts_sample.jsonl"', json.dumps(str(data)))
    text = text.replace('kind = "anthropic"\nbase_url = "simulated"', f'kind = "anthropic"\nbase_url = "{judge_url}"')
    path = tmp_path / "dup.toml"
    path.write_text(text)
    return path


def _recorded(runs: Path, cfg_path: Path, run_id: str, sent: int, units: int = 432, at: float = 200.0) -> None:
    """A finished run of the config in ``runs``: its judge sent ``sent`` of its ``units`` units (the others
    answered by the cache, or by another unit of the same key), to the config's judge model."""
    folder = RunLayout(run_id).local(runs)
    folder.folder.mkdir(parents=True)
    record = RunRecord(
        run_id=run_id,
        pipeline="prompts",
        config_path=str(cfg_path),
        config_toml=cfg_path.read_text(),
        created_at=at - 100,
        finished_at=at,
        state="finished",
        services=Services(redis_url="redis://x", store_url=str(runs)),
        stages=["generate", "judge"],
        counters={
            "generate": StageCounters(units_total=144, units_done=144, cache_hits=72),
            "judge": StageCounters(units_total=units, units_done=units, cache_hits=units - sent),
        },
    )
    folder.record.write_bytes(msgspec.json.encode(record))
    manifest = runs / RunLayout(run_id).manifest("judge")
    manifest.parent.mkdir(parents=True)
    usage = ShardUsage(models={SONNET: ModelUsage(calls=sent)})
    manifest.write_bytes(
        msgspec.json.encode(StageManifest(stage="judge", units=units, shards=54, failed=0, artifacts=[], usage=usage))
    )


def test_identical_requests_are_counted_once_and_timed_once(tmp_path: Path) -> None:
    cfg = load_config(_config(tmp_path))
    each = {e.stage: e for e in plan_run(cfg)}  # run's own checks: every unit a request
    hashed = {e.stage: e for e in plan_run(cfg, distinct=True)}
    # 72 questions (36 written twice) x 2 models: 144 units, 72 distinct requests
    assert each["generate"].requests == hashed["generate"].requests == 144 == hashed["generate"].units
    assert each["generate"].to_send == 144 and each["generate"].sent_from != HASHED
    assert hashed["generate"].distinct_requests == hashed["generate"].to_send == 72
    assert hashed["generate"].sent_from == HASHED and not hashed["generate"].sent_bound
    assert hashed["generate"].calls_s == pytest.approx(each["generate"].calls_s / 2)
    # the judge's prompts depend on the answers: every unit, an upper bound
    judge = hashed["judge"]
    assert judge.units == judge.requests == judge.to_send == 432 and judge.sent_bound and judge.sent_from == NO_RATIO


def test_the_cache_answers_a_request_for_all_its_copies(tmp_path: Path) -> None:
    cfg = load_config(_config(tmp_path))
    runs = tmp_path / "runs"
    generate = pipeline_of(cfg).stages(cfg)[0]
    first = next(iter(generate.plan(StageContext(cfg, "plan", LocalStore(tmp_path / "scratch"))))).request
    ResponseCache(LocalStore(runs)).put(first, ProviderResponse(texts=['{"answer": "Saturn", "confidence": 1}']))
    cached = w.cache_lookup(str(runs))
    assert cached is not None
    estimate = next(e for e in plan_run(cfg, cached, distinct=True) if e.stage == "generate")
    assert estimate.distinct_requests == 72 and estimate.cached_requests == 1 and estimate.to_send == 71
    # a request the cache answers, asked by two units, is one answer (not two)
    per_unit = next(e for e in plan_run(cfg, cached) if e.stage == "generate")
    assert per_unit.cached_requests == 2


def test_a_dependent_stage_is_counted_by_the_share_an_earlier_run_of_it_sent(tmp_path: Path) -> None:
    path = _config(tmp_path)
    cfg = load_config(path)
    runs = tmp_path / "runs"
    assert request_ratios(runs, "prompts") == {}
    _recorded(runs, path, "prompts-1", sent=108)
    ratios = request_ratios(runs, "prompts")
    assert [r.run_id for r in ratios["judge"]] == ["prompts-1"] and ratios["judge"][0].ratio == 0.25
    judge = next(e for e in plan_run(cfg, ratios=ratios, distinct=True) if e.stage == "judge")
    bound = next(e for e in plan_run(cfg, distinct=True) if e.stage == "judge")
    assert judge.requests == 432 and judge.to_send == judge.distinct_requests == 108 and not judge.sent_bound
    assert "prompts-1" in judge.sent_from and "108 sent of 432 units" in judge.sent_from
    assert judge.calls_s == pytest.approx(bound.calls_s / 4)
    # a later run that sent none of the judge's requests (all cached) says nothing of the share; one that sent
    # fewer (an earlier run's cache answered some) is not taken over the higher share
    _recorded(runs, path, "prompts-2", sent=0, at=300.0)
    assert [r.run_id for r in request_ratios(runs, "prompts")["judge"]] == ["prompts-1"]
    _recorded(runs, path, "prompts-3", sent=27, at=400.0)
    ratios = request_ratios(runs, "prompts")
    assert [r.run_id for r in ratios["judge"]] == ["prompts-3", "prompts-1"]
    judge = next(e for e in plan_run(cfg, ratios=ratios, distinct=True) if e.stage == "judge")
    assert judge.to_send == 108 and "prompts-1" in judge.sent_from
    # another pipeline's runs are not read
    assert request_ratios(runs, "puns") == {}


def test_an_earlier_run_against_another_endpoint_gives_no_share(tmp_path: Path) -> None:
    """The answers make a dependent stage's prompts: the simulator's agree with each other more or less often
    than a real model's, so a run that called the judge elsewhere is not taken."""
    runs = tmp_path / "runs"
    _recorded(runs, _config(tmp_path), "simulated-1", sent=108)
    (tmp_path / "elsewhere").mkdir()
    elsewhere = load_config(_config(tmp_path / "elsewhere", judge_url="http://127.0.0.1:9"))
    judge = next(
        e for e in plan_run(elsewhere, ratios=request_ratios(runs, "prompts"), distinct=True) if e.stage == "judge"
    )
    assert judge.sent_bound and judge.to_send == 432 and judge.sent_from == NO_RATIO


def test_plan_prints_units_requests_to_send_and_the_time_per_stage(tmp_path: Path, capsys) -> None:
    path = _config(tmp_path)
    runs = tmp_path / "runs"
    assert main(["plan", str(path), "--runs-dir", str(runs)]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "stage" in line)
    for column in ("units", "requests", "to send", "calls time"):
        assert column in header
    generate = next(line for line in out.splitlines() if line.startswith("│ generate"))
    assert "│ 144 " in generate and "│ 72 " in generate and "72 identical requests sent once" in generate
    assert "│ ≤ 432 " in next(line for line in out.splitlines() if line.startswith("│ judge"))
    assert "requests to send at most (a stage's units counted as its requests: the time is an upper bound)" in (
        " ".join(out.split())
    )

    _recorded(runs, path, "prompts-1", sent=108)
    assert main(["plan", str(path), "--runs-dir", str(runs), "--json"]) == 0
    judge = next(e for e in json.loads(capsys.readouterr().out) if e["stage"] == "judge")
    assert judge["to_send"] == 108 and judge["sent_bound"] is False
    assert judge["sent_from"] == "run prompts-1 (108 sent of 432 units)"
    assert main(["plan", str(path), "--runs-dir", str(runs)]) == 0
    out = capsys.readouterr().out
    assert "│ ~108 " in next(line for line in out.splitlines() if line.startswith("│ judge"))
    out = " ".join(out.split())
    assert "at most" not in out and "180 requests to send" in out
