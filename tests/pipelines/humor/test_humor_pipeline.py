"""The Humor benchmark on the engine: real Redis, real Ray, the fake provider over HTTP."""

from __future__ import annotations

import io
import json
import uuid
import zipfile
from pathlib import Path

import msgspec
import pytest

from punchline.cluster.cli.main import main
from punchline.cluster.config import load_config
from punchline.cluster.pipeline import StageContext
from punchline.cluster.run.driver import RunOptions, RunRecord, run
from punchline.data.errors import ConfigError
from punchline.data.requests import ProviderResponse
from punchline.data.stores import open_store
from punchline.data.units import UnitResult
from punchline.pipelines.humor.data.judge import JUDGE_SYSTEM
from punchline.pipelines.humor.data.loaders import load_items
from punchline.pipelines.humor.data.mera import mera_readings
from punchline.pipelines.humor.data.prompts import mera_answer_request, render_prompt
from punchline.pipelines.humor.data.shots import lm_eval_shots
from punchline.pipelines.humor.pipeline import GenerateStage, JudgeStage, stages
from punchline.workers.fake.server import FakeProviderServer

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = ROOT / "data" / "samples" / "humor_sample.json"
N_ITEMS = 24
JUDGE_ID = "claude-judge-sim"


def humor_config(
    path: Path,
    *,
    openai_url: str,
    anthropic_url: str,
    models: dict[str, str],
    judge: bool = True,
    extra: str = "",
) -> Path:
    rows = "\n".join(
        f'"{nick}" = {{ id = "{mid}", input_usd_per_mtok = 1.0, output_usd_per_mtok = 1.0 }}'
        for nick, mid in models.items()
    )
    text = f"""
[run]
pipeline = "humor"
name = "humor-test"
shard_size = 8
lease_ms = 5000
workers_per_node = 2

[providers.sim]
kind = "openai"
base_url = "{openai_url}"
max_concurrency = 8
timeout_s = 5

[providers.sim.models]
{rows}

[providers.claude]
kind = "anthropic"
base_url = "{anthropic_url}"
max_concurrency = 8
timeout_s = 5

[providers.claude.models]
judge = {{ id = "{JUDGE_ID}", input_usd_per_mtok = 3.0, output_usd_per_mtok = 15.0 }}

[humor]
data = "{SAMPLE}"
provider = "sim"
models = {json.dumps(list(models))}
{extra}
"""
    if judge:
        text += 'judge = { provider = "claude", model = "judge" }\n'
    path.write_text(text)
    return path


def _artifact(store: Path, run_id: str, name: str) -> bytes:
    return (store / run_id / "artifacts" / name).read_bytes()


def _answers(raw: bytes) -> dict[int, str]:
    rows = [json.loads(line) for line in raw.decode().splitlines()]
    ids = [r["id"] for r in rows]
    assert ids == sorted(ids)
    return {r["id"]: r["text"] for r in rows}


@pytest.mark.slow
def test_generate_judge_score_once_per_request_and_identical_on_rerun(
    tmp_path: Path,
    fake: FakeProviderServer,
    redis_url: str,
    ray_local,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    models = {"small": "sim/humor-small", "big": "sim/humor-big"}
    cfg = humor_config(
        tmp_path / "humor.toml", openai_url=fake.openai_base_url, anthropic_url=fake.anthropic_base_url, models=models
    )
    store = tmp_path / "store"
    first = f"h1-{uuid.uuid4().hex[:8]}"
    rec = run(
        str(cfg), RunOptions(run_id=first, runs_dir=str(tmp_path / "runs"), redis_url=redis_url, store=str(store))
    )
    assert rec.state == "finished", rec.failures
    assert rec.stages == ["generate", "judge"]
    stats = fake.stats()
    assert set(stats.calls.values()) == {1}
    assert {m: stats.calls_by_model[m] for m in models.values()} == {m: N_ITEMS for m in models.values()}

    answers = {nick: _answers(_artifact(store, first, f"answers/{nick}.jsonl")) for nick in models}
    assert all(sorted(a) == list(range(1, N_ITEMS + 1)) for a in answers.values())
    # one judge unit per (model, item) and one MERA judge unit per MERA reading; the same question is one
    # request, judged once
    readings = {(i, r) for a in answers.values() for i, text in a.items() for r in mera_readings(text)}
    mera_units = sum(len(mera_readings(text)) for a in answers.values() for text in a.values())
    judge_units = N_ITEMS * len(models) + mera_units
    assert rec.counters["judge"].units_total == rec.counters["judge"].units_done == judge_units
    distinct = {(i, text) for a in answers.values() for i, text in a.items()}
    assert stats.calls_by_model[JUDGE_ID] == len(distinct) + len(readings)

    reports = {}
    for nick in models:
        report = json.loads(_artifact(store, first, f"report/{nick}/report.json"))
        assert report["n"] == N_ITEMS and report["n_missing"] == 0
        assert 0.0 <= report["em"] <= 1.0 and 0.0 <= report["em_mera"] <= 1.0
        assert report["judge"]["n_scored"] == N_ITEMS and report["judge"]["n_missing"] == 0
        assert set(report["judge_scores"].values()) <= {0.0, 1.0}
        scores = [json.loads(line) for line in _artifact(store, first, f"judge_scores/{nick}.jsonl").splitlines()]
        assert {str(s["id"]): s["score"] for s in scores} == report["judge_scores"]
        assert 0.0 < report["judge_mera"] <= 1.0 and set(report["judge_mera_scores"].values()) <= {0.0, 1.0}
        reports[nick] = report
        for f in ("report.md", "Humor.json", "logs_public.zip", "confusion.png"):
            assert f"report/{nick}/{f}" in rec.artifacts
        assert f"submission/{nick}.zip" in rec.artifacts

    # `punchline humor run` with a new run id on the same store (Redis from the environment, as
    # `punchline run` reads it): every answer comes from the cache, every artifact has the same bytes.
    fake.reset()
    capsys.readouterr()
    monkeypatch.setenv("PUNCHLINE_REDIS_URL", redis_url)
    second = f"h2-{uuid.uuid4().hex[:8]}"
    argv = ["humor", "run", str(cfg), "--run-id", second, "--runs-dir", str(tmp_path / "runs")]
    assert main([*argv, "--store", str(store), "--no-progress"]) == 0
    assert fake.stats().total_calls == 0
    out = capsys.readouterr().out
    assert f"run {second}: finished" in out and out.count("EM (MERA's reading)") == len(models)
    assert out.count("judge (MERA's prompt") == len(models) and out.count("judge (ours, binary") == len(models)
    rec2 = msgspec.json.decode((tmp_path / "runs" / second / "run.json").read_bytes(), type=RunRecord)
    assert rec2.state == "finished" and rec2.pipeline == "humor"
    assert rec2.counters["generate"].cache_hits == N_ITEMS * len(models)
    assert sorted(rec2.artifacts) == sorted(rec.artifacts)
    for name in rec.artifacts:
        assert _artifact(store, second, name) == _artifact(store, first, name), name


@pytest.mark.slow
def test_mera_preset_on_the_engine_scores_a_failed_judge_call_0_without_retrying_it(
    tmp_path: Path, fake: FakeProviderServer, redis_url: str, ray_local
) -> None:
    """Every first attempt fails (503): answers and our judge are retried, MERA's judge calls are not."""
    fake.configure(fail_first_attempts=1)
    cfg = humor_config(
        tmp_path / "humor.toml",
        openai_url=fake.openai_base_url,
        anthropic_url=fake.anthropic_base_url,
        models={"a": "sim/humor-small"},
        extra='preset = "mera"',
    )
    store = tmp_path / "store"
    rec = run(
        str(cfg), RunOptions(run_id="once", runs_dir=str(tmp_path / "runs"), redis_url=redis_url, store=str(store))
    )
    answers = _answers(_artifact(store, "once", "answers/a.jsonl"))
    assert len(answers) == N_ITEMS  # retried after the 503
    mera_calls = sum(len(mera_readings(text)) for text in answers.values())
    assert rec.counters["judge"].units_failed == mera_calls and rec.state == "failed"
    report = json.loads(_artifact(store, "once", "report/a/report.json"))
    assert report["judge_mera_failed_calls"] == mera_calls and report["judge_mera"] == 0.0
    assert report["judge"]["n_missing"] == 0  # our judge's calls were retried
    # each MERA judge request reached the provider once; ours twice (the 503, then the answer)
    stats = fake.stats()
    assert stats.calls_by_model[JUDGE_ID] == mera_calls + 2 * N_ITEMS


@pytest.mark.slow
def test_humor_demo_on_the_simulator_ranks_models_by_size(tmp_path: Path, redis_url: str, ray_local) -> None:
    """The shipped demo config: the driver starts the simulated provider with the run's own items as its
    answer key, so the larger model scores higher and the judge mostly agrees with exact match."""
    cfg = ROOT / "configs" / "humor_demo.toml"
    store = tmp_path / "store"
    rec = run(
        str(cfg), RunOptions(run_id="demo", runs_dir=str(tmp_path / "runs"), redis_url=redis_url, store=str(store))
    )
    assert rec.state == "finished", rec.failures
    small, large = (json.loads(_artifact(store, "demo", f"report/{nick}/report.json")) for nick in ("8b", "70b"))
    assert large["em"] > small["em"] > 0.1
    assert large["class_accuracy"] > 0.4  # at random it would be 1/12
    assert large["judge"]["kappa_with_em"] > 0.5
    assert large["judge_mera"] > 0.1 and 0.0 < large["em_mera"] <= large["em"]
    answers = _answers(_artifact(store, "demo", "answers/70b.jsonl"))
    with zipfile.ZipFile(io.BytesIO(_artifact(store, "demo", "submission/70b.zip"))) as zf:
        sub = json.loads(zf.read("Humor.json"))
    assert sub == {"data": {"test": [{"outputs": answers[i].lstrip(), "meta": {"id": i}} for i in sorted(answers)]}}


def test_humor_run_rejects_a_puns_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = ROOT / "configs" / "demo.toml"
    assert main(["humor", "run", str(cfg), "--runs-dir", str(tmp_path)]) == 2
    assert "humor run" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing started


def _response(text: str) -> ProviderResponse:
    return ProviderResponse(texts=[text])


def test_reduces_skip_failed_answers_and_keep_failed_judgements_missing(tmp_path: Path) -> None:
    """A failed answer unit gives no answer line; a failed judge unit is a missing score, never 0."""
    cfg_path = humor_config(
        tmp_path / "h.toml", openai_url="http://127.0.0.1:9", anthropic_url="http://127.0.0.1:9", models={"a": "x/a"}
    )
    cfg = load_config(cfg_path)
    ctx = StageContext(cfg, "unit", open_store(str(tmp_path / "store")))
    gen = GenerateStage()
    units = gen.plan(ctx)
    assert [u.unit_id for u in units][:2] == ["generate/a/000001", "generate/a/000002"]
    assert len(units) == N_ITEMS and all(u.request.temperature == 0.0 for u in units)
    results = {
        u.unit_id: UnitResult(unit_id=u.unit_id, key=u.request.key(), response=_response("ОТВЕТ ирония\nРЕШЕНИЕ А"))
        for u in units
    }
    results["generate/a/000003"] = UnitResult(unit_id="generate/a/000003", key="k", error="FatalProviderError: 404")
    assert gen.reduce(ctx, results) == ["answers/a.jsonl"]  # with a judge, scoring waits for it
    answers = _answers(ctx.read_artifact("answers/a.jsonl"))
    assert 3 not in answers and len(answers) == N_ITEMS - 1

    judge = JudgeStage()
    all_units = judge.plan(ctx)
    ids = [u.unit_id for u in all_units]
    assert ids == sorted(ids)
    junits = [u for u in all_units if u.unit_id.startswith("judge/")]
    assert len(junits) == N_ITEMS - 1 and all(
        u.check == "punchline.pipelines.humor.data.judge:check_score" for u in junits
    )
    assert all(u.request.messages[0].content == JUDGE_SYSTEM for u in junits)
    # MERA's judge: one unit per MERA reading ("ОТВЕТ ирония\nРЕШЕНИЕ А": the whole answer and the pair)
    munits = [u for u in all_units if u.unit_id.startswith("judge_mera/")]
    assert len(munits) == 2 * (N_ITEMS - 1) and all(not u.check for u in munits)
    assert all(u.retries for u in all_units)  # the punchline preset retries MERA's judge calls too
    assert munits[0].unit_id == "judge_mera/a/000001/0" and munits[1].unit_id == "judge_mera/a/000001/1"
    assert [m.role for m in munits[0].request.messages] == ["user"]
    assert "### Ответ для оценки:\nОТВЕТ ирония\nРЕШЕНИЕ А\n\n" in munits[0].request.messages[0].content
    assert "### Ответ для оценки:\nирония,А\n\n" in munits[1].request.messages[0].content
    jresults = {
        u.unit_id: UnitResult(unit_id=u.unit_id, key=u.request.key(), response=_response("SCORE: 1")) for u in junits
    }
    jresults["judge/a/000005"] = UnitResult(unit_id="judge/a/000005", key="k", error="JudgeParseError: no score")
    for u in munits:  # the whole answer scores 1 (of 2), the pair 2; item 6's pair call failed; item 7 unreadable
        reply = "Оценка: 1" if u.unit_id.endswith("/0") else "2"
        jresults[u.unit_id] = UnitResult(unit_id=u.unit_id, key=u.request.key(), response=_response(reply))
    jresults["judge_mera/a/000006/1"] = UnitResult(unit_id="judge_mera/a/000006/1", key="k", error="Fatal: 500")
    for k in (0, 1):
        jresults[f"judge_mera/a/000007/{k}"] = UnitResult(
            unit_id=f"judge_mera/a/000007/{k}", key="k", response=_response("не могу оценить")
        )
    names = judge.reduce(ctx, jresults)
    assert "report/a/report.json" in names and "judge_scores/a.jsonl" in names
    assert "judge_mera_scores/a.jsonl" in names
    report = msgspec.json.decode(ctx.read_artifact("report/a/report.json"))
    assert report["n_missing"] == 1
    assert report["judge_scores"]["3"] is None and report["judge_scores"]["5"] is None
    assert report["judge"]["n_scored"] == N_ITEMS - 2 and report["judge"]["n_missing"] == 2
    assert report["judge"]["pass_rate"] == 1.0
    mera = report["judge_mera_scores"]
    assert mera["1"] == 1.0 and mera["6"] == 0.5 and mera["7"] == 0.0 and mera["3"] == 0.0  # 3: no answer
    assert report["judge_mera"] == pytest.approx((N_ITEMS - 3 + 0.5) / N_ITEMS)
    # item 6's failed call is counted (and scored 0); item 3 had no answer, so no call was made for it
    assert report["judge_mera_failed_calls"] == 1
    lines = [json.loads(line) for line in ctx.read_artifact("judge_mera_scores/a.jsonl").splitlines()]
    assert [ln for ln in lines if "failed_calls" in ln] == [{"id": 6, "score": 0.5, "failed_calls": 1}]
    md = ctx.read_artifact("report/a/report.md").decode()
    assert "failed judge calls (each scored 0; the mera preset does not retry them within the run): 1" in md
    assert "judge calls asked again: none" in md and report["judge_mera_retried"] == []
    # item 3 has no answer: no MERA submission
    assert "submission/a.zip" not in names and "report/a/Humor.json" not in names


def test_without_judge_generate_scores_and_k_shot_prefixes(tmp_path: Path) -> None:
    cfg_path = humor_config(
        tmp_path / "h.toml",
        openai_url="http://127.0.0.1:9",
        anthropic_url="http://127.0.0.1:9",
        models={"a": "x/a"},
        judge=False,
        extra=f'shots = "{SAMPLE}"\nk_shot = 2',
    )
    cfg = load_config(cfg_path)
    assert [s.name for s in stages(cfg)] == ["generate"]
    ctx = StageContext(cfg, "nojudge", open_store(str(tmp_path / "store")))
    units = GenerateStage().plan(ctx)
    # the shots file is the data file here: an item is never its own shot
    items = load_items(SAMPLE)
    assert units[0].request.messages[0].content == render_prompt(items[0], items[1:3])
    assert units[1].request.messages[0].content == render_prompt(items[1], [items[0], items[2]])
    results = {u.unit_id: UnitResult(unit_id=u.unit_id, key="k", response=_response("не знаю")) for u in units}
    names = GenerateStage().reduce(ctx, results)
    assert names == [
        "answers/a.jsonl",
        "report/a/Humor.json",
        "report/a/confusion.png",
        "report/a/confusion.svg",
        "report/a/logs_public.zip",
        "report/a/report.json",
        "report/a/report.md",
        "submission/a.zip",
    ]
    report = msgspec.json.decode(ctx.read_artifact("report/a/report.json"))
    assert report["n"] == N_ITEMS and report["em"] == 0.0 and report["judge"] is None
    with zipfile.ZipFile(io.BytesIO(ctx.read_artifact("submission/a.zip"))) as zf:
        assert sorted(zf.namelist()) == ["Humor.json", "logs_public.zip"]
        sub = json.loads(zf.read("Humor.json"))
    assert sub["data"]["test"][0] == {"outputs": "не знаю", "meta": {"id": 1}}
    assert len(sub["data"]["test"]) == N_ITEMS


def test_mera_preset_is_lm_evals_request_and_cuts_at_the_stop(tmp_path: Path) -> None:
    cfg_path = humor_config(
        tmp_path / "h.toml",
        openai_url="http://127.0.0.1:9",
        anthropic_url="http://127.0.0.1:9",
        models={"a": "x/a"},
        judge=False,
        extra='k_shot = 2\npreset = "mera"\nsampler = "first_n"',
    )
    cfg = load_config(cfg_path)
    ctx = StageContext(cfg, "mera", open_store(str(tmp_path / "store")))
    units = GenerateStage().plan(ctx)
    items = load_items(SAMPLE)
    req = units[0].request
    assert (req.temperature, req.max_tokens, req.stop) == (0.0, 256, ("\n\n",))
    assert [m.role for m in req.messages] == ["user", "assistant", "user", "assistant", "user"]
    assert req.messages[0].content == items[1].instruction.format(**msgspec.structs.asdict(items[1].inputs))
    assert req.messages[1].content == items[1].outputs.strip() and req.messages[3].content == items[2].outputs.strip()
    assert req.messages[4].content == items[0].instruction.format(**msgspec.structs.asdict(items[0].inputs))
    text = "ОТВЕТ ирония\nРЕШЕНИЕ А\n\nПояснение: ирония, но и каламбур.\nОТВЕТ каламбур"
    results = {u.unit_id: UnitResult(unit_id=u.unit_id, key="k", response=_response(text)) for u in units}
    GenerateStage().reduce(ctx, results)
    answers = _answers(ctx.read_artifact("answers/a.jsonl"))
    assert set(answers.values()) == {"ОТВЕТ ирония\nРЕШЕНИЕ А"}  # cut at "\n\n", as lm-eval cuts it


def test_mera_preset_draws_each_items_shots_as_lm_eval_does(tmp_path: Path) -> None:
    """humor.yaml's few-shot choice by default: the seeded draw (1234) from the data itself, item by item."""
    base = dict(openai_url="http://127.0.0.1:9", anthropic_url="http://127.0.0.1:9", models={"a": "x/a"}, judge=False)
    cfg = load_config(humor_config(tmp_path / "h.toml", extra='k_shot = 5\npreset = "mera"', **base))  # type: ignore[arg-type]
    units = GenerateStage().plan(StageContext(cfg, "draw", open_store(str(tmp_path / "store"))))
    items = load_items(SAMPLE)
    drawn = lm_eval_shots(items, items, 5, sampler="default", seed=1234, same_split=True)
    assert [u.request for u in units] == [
        mera_answer_request("sim", "x/a", it, s) for it, s in zip(items, drawn, strict=True)
    ]
    assert drawn[0] != items[1:6]  # not the first five
    seeded = load_config(
        humor_config(tmp_path / "s.toml", extra='k_shot = 5\npreset = "mera"\nfewshot_seed = 7', **base)
    )  # type: ignore[arg-type]
    other = GenerateStage().plan(StageContext(seeded, "seed", open_store(str(tmp_path / "store"))))
    assert [u.request for u in other] != [u.request for u in units]
    unread = humor_config(tmp_path / "u.toml", extra=f'k_shot = 5\npreset = "mera"\nshots = "{SAMPLE}"', **base)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match='is not read under preset = "mera"') as info:
        load_config(unread)
    assert info.value.field == "humor.shots"
    split = f'k_shot = 5\npreset = "mera"\nshots = "{SAMPLE}"\nfewshot_split = "shots"'
    from_file = load_config(humor_config(tmp_path / "f.toml", extra=split, **base))  # type: ignore[arg-type]
    units = GenerateStage().plan(StageContext(from_file, "file", open_store(str(tmp_path / "store"))))
    assert [u.request for u in units] == [
        mera_answer_request("sim", "x/a", it, s)
        for it, s in zip(items, lm_eval_shots(items, items, 5, same_split=False), strict=True)
    ]
    too_many = load_config(humor_config(tmp_path / "t.toml", extra=f'k_shot = {N_ITEMS}\npreset = "mera"', **base))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=f"draws {N_ITEMS + 1} items per question"):
        GenerateStage().plan(StageContext(too_many, "many", open_store(str(tmp_path / "store"))))


def test_under_the_mera_preset_meras_judge_calls_are_not_retried(tmp_path: Path) -> None:
    """MERA's judge posts once and scores a failed call 0: its units ask the engine for no retries; ours keep them."""
    cfg = load_config(
        humor_config(
            tmp_path / "h.toml",
            openai_url="http://127.0.0.1:9",
            anthropic_url="http://127.0.0.1:9",
            models={"a": "x/a"},
            extra='preset = "mera"',
        )
    )
    ctx = StageContext(cfg, "once", open_store(str(tmp_path / "store")))
    units = GenerateStage().plan(ctx)
    results = {u.unit_id: UnitResult(unit_id=u.unit_id, key="k", response=_response("ирония,А")) for u in units}
    GenerateStage().reduce(ctx, results)
    judge_units = JudgeStage().plan(ctx)
    mera = [u for u in judge_units if u.unit_id.startswith("judge_mera/")]
    ours = [u for u in judge_units if u.unit_id.startswith("judge/")]
    assert mera and ours and not any(u.retries for u in mera) and all(u.retries for u in ours)


def test_the_judge_estimate_counts_meras_judge_calls(tmp_path: Path) -> None:
    from punchline.pipelines.humor.pipeline import MAX_MERA_READINGS, PIPELINE

    cfg_path = humor_config(
        tmp_path / "h.toml", openai_url="http://127.0.0.1:9", anthropic_url="http://127.0.0.1:9", models={"a": "x/a"}
    )
    units = list(PIPELINE.estimate(load_config(cfg_path), "judge"))
    assert len(units) == N_ITEMS * (1 + MAX_MERA_READINGS)  # ours once, MERA's once per reading (at most 3)
    assert {u.request.max_tokens for u in units} == {16, 256}
