"""The generic prompts pipeline: config checks, stages, `plan`, and engine runs (online, batch, kill -9).

The engine tests run a few hundred generated rows x 2 models x n = 5 against the fake provider (which
answers an ``Options:`` prompt with one option, as JSON or prose, so the parse column has values and
failures) and check one output row per row x model x sample, each request paid once, the same bytes
in batch mode, and 0 duplicate calls after a kill -9 of the driver and a resume (the killed driver's
workers drain: they finish and commit the calls in flight, then end).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray

from punchline.cluster.cli.main import main
from punchline.cluster.config import load_config
from punchline.cluster.pipeline import StageContext
from punchline.cluster.run.driver import run
from punchline.cluster.run.planner import plan_run
from punchline.cluster.stages import generate as prompts
from punchline.cluster.stages.outputs import read_jsonl
from punchline.data.errors import ConfigError, InputError
from punchline.data.requests import ProviderResponse
from punchline.data.stores.local import LocalStore
from punchline.data.units import UnitResult
from punchline.pipelines.prompts.pipeline import PIPELINE
from punchline.workers.fake.server import FakeProviderServer
from tests.cluster.run.test_faults import ROOT, opts, wait_for
from tests.fixtures.engine import driver_argv

DEMO = ROOT / "configs" / "prompts_demo.toml"
OPTIONS = ("red", "green", "blue", "yellow")


def alive_workers(run_id: str) -> list[str]:
    """The run's worker actors still alive on this test's Ray (the detached ones of a killed driver too)."""
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
    return [n for n in names if n.startswith(f"punchline:{run_id}:")]


def write_rows(path: Path, count: int) -> Path:
    rows = [
        {"id": f"r{i:04d}", "question": f"Which colour comes to mind for the number {i}?", "options": list(OPTIONS)}
        for i in range(count)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def prompts_config(
    tmp: Path,
    fake: FakeProviderServer,
    *,
    rows: int,
    n: int = 5,
    judge: bool = False,
    mode: str = "online",
    shard_size: int = 8,
    name: str = "prompts.toml",
) -> Path:
    data = write_rows(tmp / "rows.jsonl", rows)
    judge_table = (
        """
[prompts.judge]
model = "claude:sonnet"
max_tokens = 16
prompt = \"\"\"Grade it. VERDICT: correct or VERDICT: incorrect.
Reference: green
Response: {{ parsed.answer if parsed.answer is not none else response }}\"\"\"
parse = { regex = 'VERDICT:\\s*(?P<verdict>correct|incorrect)' }
"""
        if judge
        else ""
    )
    text = f"""
[run]
pipeline = "prompts"
name = "p"
shard_size = {shard_size}
lease_ms = 10000  # generous: a heartbeat stalled by a loaded machine must not lose its lease
workers_per_node = 2
units_in_flight = 4

[providers.sim]
kind = "openai"
base_url = "{fake.openai_base_url}"
max_concurrency = 4
timeout_s = 5
max_retries = 8
mode = "{mode}"
batch_max_requests = 500

[providers.sim.models]
"3b" = {{ id = "sim/llama-3b", input_usd_per_mtok = 1.0, output_usd_per_mtok = 2.0 }}
"70b" = {{ id = "sim/llama-70b", input_usd_per_mtok = 1.0, output_usd_per_mtok = 2.0 }}

[providers.claude]
kind = "anthropic"
base_url = "{fake.anthropic_base_url}"
timeout_s = 5
mode = "{mode}"

[providers.claude.models]
sonnet = {{ id = "claude-sim-sonnet", input_usd_per_mtok = 3.0, output_usd_per_mtok = 15.0 }}

[prompts]
data = "{data}"
provider = "sim"
models = ["3b", "70b"]
n = {n}
temperature = 0.8
top_p = 0.9
max_tokens = 32
seed = 5
system = "Answer with JSON."
prompt = \"\"\"{{{{ question }}}}
Options: {{{{ options | join(" | ") }}}}
Reply as JSON: {{"answer": "<option>", "confidence": <0 to 1>}}\"\"\"

[prompts.sampling."70b"]
temperature = 0.4

[prompts.parse]
json_schema = {{ type = "object", required = ["answer"], properties = {{ answer = {{ type = "string" }} }} }}
{judge_table}
"""
    path = tmp / name
    path.write_text(text)
    return path


# --- config, stages and plan, without the engine ------------------------------------------------------------


def test_the_demo_config_loads_and_its_rows_render() -> None:
    cfg = load_config(DEMO)
    prompts.check_inputs(cfg)
    assert [s.name for s in prompts.stages(cfg)] == ["generate", "judge"]


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ("temperature = 3.5", "prompts.temperature"),
        ("n = 0", "prompts.n"),
        ("top_p = 0", "prompts.top_p"),
        ("max_tokens = -1", "prompts.max_tokens"),
        ("colour = 1", "unknown field `colour`"),
        ('system = "{{ broken"', "prompts.system"),
        ('models = ["8b", "nowhere:big"]', "prompts.models"),
    ],
)
def test_bad_prompts_settings_are_one_line_naming_the_key(tmp_path: Path, line: str, field: str) -> None:
    key = line.split(" = ")[0]
    kept = [ln for ln in DEMO.read_text().splitlines() if not ln.startswith(f"{key} =")]  # replace, not repeat
    text = "\n".join(kept).replace('id_field = "id"', f'id_field = "id"\n{line}')
    path = tmp_path / "c.toml"
    path.write_text(text.replace("../data/samples", str(ROOT / "data" / "samples")))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert field in str(err.value) and "\n" not in str(err.value)


def test_a_missing_template_field_stops_run_and_plan_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"id": "a", "question": "q?", "options": ["x"], "answer": "x"}\n{"id": "b", "options": ["x"]}\n')
    cfg = tmp_path / "c.toml"
    cfg.write_text(DEMO.read_text().replace("../data/samples/prompts_sample.jsonl", str(rows)))
    for argv in (["run", str(cfg), "--runs-dir", str(tmp_path / "runs"), "--no-progress"], ["plan", str(cfg)]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err
        assert str(rows) in err and "line 2" in err and "'question' is undefined" in err
    assert not (tmp_path / "runs").exists()


def test_submit_ships_the_config_and_its_rows(tmp_path: Path) -> None:
    from punchline.cluster.ray_cluster.ray_jobs import stage

    rel = stage(str(DEMO), tmp_path / "job")
    files = sorted(p.relative_to(tmp_path / "job").as_posix() for p in (tmp_path / "job").rglob("*") if p.is_file())
    assert rel == "configs/prompts_demo.toml"
    assert files == ["configs/prompts_demo.toml", "data/samples/prompts_sample.jsonl"]


def test_plan_estimates_generate_exactly_and_the_judge_as_an_upper_bound() -> None:
    cfg = load_config(DEMO)
    generate, judge = plan_run(cfg)
    assert generate.exact and generate.requests == 36 * 2  # one request per row x model (n in the request)
    assert generate.output_tokens == 36 * 2 * 3 * 64  # max_tokens x n per request
    assert not judge.exact and judge.requests == 36 * 2 * 3 and judge.cost_usd > 0


def _fake_results(units: list[Any], n: int) -> dict[str, UnitResult]:
    out = {}
    for i, u in enumerate(units):
        if i == 1:  # a failed unit: n rows without text, with the error
            out[u.unit_id] = UnitResult(unit_id=u.unit_id, key=u.request.key(), error="provider said no")
            continue
        texts = ['{"answer": "Saturn", "confidence": 0.5}', "no idea", '```json\n{"answer": "Mars"}\n```'][:n]
        out[u.unit_id] = UnitResult(
            unit_id=u.unit_id,
            key=u.request.key(),
            response=ProviderResponse(
                texts=texts, input_tokens=100, output_tokens=30, finish_reasons=["stop", "length", "stop"][:n]
            ),
        )
    return out


def test_generate_reduce_writes_one_row_per_row_model_sample_with_parse_columns() -> None:
    cfg = load_config(DEMO)
    cfg.settings = msgspec.structs.replace(cfg.settings, judge=None)  # type: ignore[arg-type]
    with tempfile.TemporaryDirectory() as tmp:
        ctx = StageContext(cfg, "r", LocalStore(tmp))
        stage = prompts.stages(cfg)[0]
        units = list(stage.plan(ctx))
        assert [u.unit_id for u in units] == sorted(u.unit_id for u in units)
        names = stage.reduce(ctx, _fake_results(units, 3))
        assert names == ["outputs.jsonl", "outputs.parquet"]
        rows = list(read_jsonl(ctx.read_artifact("outputs.jsonl")))
        assert len(rows) == 36 * 2 * 3
        assert [(r.row_id, r.model, r.sample) for r in rows[:4]] == [
            ("q001", "8b", 0),
            ("q001", "8b", 1),
            ("q001", "8b", 2),
            ("q001", "70b", 0),
        ]
        first = rows[0]
        assert first.parsed == {"answer": "Saturn", "confidence": 0.5} and first.parse_error is None
        assert rows[1].parsed is None and rows[1].parse_error == "no JSON value in the answer"
        assert rows[1].finish_reason == "length"
        assert rows[2].parsed is None and "'confidence' is a required property" in str(rows[2].parse_error)
        failed = rows[3:6]  # unit 1 is row q001's 70b request
        assert all(r.text is None and r.error == "provider said no" for r in failed)
        # tokens and cost are the request's: 100 in x $0.18/M + 30 out x $0.18/M for the 8b model
        assert first.cost_usd == pytest.approx((100 * 0.18 + 30 * 0.18) / 1e6)
        assert first.request_key == units[0].request.key()
        table = pq.read_table(pa.BufferReader(ctx.read_artifact("outputs.parquet")))
        assert table.num_rows == len(rows) and table.column("parsed.answer")[0].as_py() == "Saturn"
        assert table.schema.field("parsed.confidence").type == pa.float64()  # the schema's "number"
        first_out = table.slice(0, 1).to_pylist()[0]  # the input row's columns come first, as they were
        assert list(first_out)[:6] == ["id", "topic", "question", "options", "answer", "row_id"]
        assert first_out["options"] == ["Mars", "Saturn", "Venus", "Mercury"] and first_out["mode"] == "online"
        assert json.loads(ctx.read_artifact("outputs.jsonl").splitlines()[0])["question"].startswith("Which planet")
        jsonl, parquet = ctx.read_artifact("outputs.jsonl"), ctx.read_artifact("outputs.parquet")
        stage.reduce(ctx, _fake_results(units, 3))
        assert (ctx.read_artifact("outputs.jsonl"), ctx.read_artifact("outputs.parquet")) == (jsonl, parquet)


# --- the engine: real Redis, Ray and the fake provider over HTTP --------------------------------------------

ROWS = 200
N = 5


def _outputs(tmp: Path, store: str, run_id: str) -> tuple[bytes, bytes]:
    root = tmp / store / run_id / "artifacts"
    return (root / "outputs.jsonl").read_bytes(), (root / "outputs.parquet").read_bytes()


def _check_outputs(jsonl: bytes, *, judged: bool = False, rows: int = ROWS) -> None:
    out = list(read_jsonl(jsonl))
    assert len(out) == rows * 2 * N
    assert len({(r.row_id, r.model, r.sample) for r in out}) == len(out)
    assert all(r.text is not None and r.error is None for r in out)
    parsed = [r for r in out if r.parsed is not None]
    assert all(r.parsed["answer"] in OPTIONS for r in parsed)  # type: ignore[index]
    assert all((r.parsed is None) != (r.parse_error is None) for r in out)  # the parse column is filled
    assert 0 < len(parsed) < len(out)  # the fake sometimes answers in prose: both kinds show up
    assert len({r.request_key for r in out}) == rows * 2
    if judged:
        assert all(r.judge_parsed is not None and r.judge_parsed["verdict"] in ("correct", "incorrect") for r in out)


def _unpriced(rows: list[Any]) -> list[Any]:
    return [msgspec.structs.replace(r, cost_usd=0.0, mode="") for r in rows]


@pytest.mark.slow
def test_online_batch_and_kill_9_resume_give_the_same_rows_each_request_paid_once(
    tmp_path: Path, fake: FakeProviderServer, redis_url: str, ray_local: Any
) -> None:
    """One config, three runs (sharing the uninterrupted run as the baseline keeps the suite lean)."""
    units = ROWS * 2
    # 1. online: one output row per row x model x sample, the parse column filled, each request paid once
    online = prompts_config(tmp_path, fake, rows=ROWS, shard_size=4)
    rec = run(str(online), opts(tmp_path, redis_url, "online", store="online-store"))
    assert rec.state == "finished"
    calls = fake.stats().calls
    assert len(calls) == units and set(calls.values()) == {1}
    expected = _outputs(tmp_path, "online-store", "online")
    _check_outputs(expected[0])

    # 2. batch mode: the same bytes, each request billed once, the online endpoint never called
    fake.reset()
    batch = prompts_config(tmp_path, fake, rows=ROWS, shard_size=4, mode="batch", name="batch.toml")
    assert run(str(batch), opts(tmp_path, redis_url, "batched", store="batch-store")).state == "finished"
    batched = list(read_jsonl(_outputs(tmp_path, "batch-store", "batched")[0]))
    online_rows = list(read_jsonl(expected[0]))
    assert _unpriced(batched) == _unpriced(online_rows)  # the same answers; the cost columns say batch
    assert {r.mode for r in batched} == {"batch"}
    assert [r.cost_usd for r in batched] == pytest.approx([r.cost_usd / 2 for r in online_rows])
    stats = fake.batch_stats()
    assert len(stats.billed) == units and set(stats.billed.values()) == {1}
    assert fake.stats().total_calls == 0, "a batch-mode run called the online endpoint"

    # 3. kill -9 of the driver mid-run, then resume at once: the killed driver's detached workers finish the
    # calls they have in flight and commit them while the resumed driver starts (its workers wait on their
    # leases), then end themselves: each request paid exactly once, the same bytes, no worker left behind
    fake.reset()
    fake.configure(latency_ms_min=40, latency_ms_max=80)  # so that the kill lands mid-run
    argv = driver_argv(online, "killed", tmp_path, "--ray-address", ray.get_runtime_context().gcs_address)
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_for(lambda: fake.stats().total_calls >= units // 3 or proc.poll() is not None, timeout_s=240)
    assert proc.poll() is None, f"driver ended before the kill: {proc.stderr.read().decode()[-2000:]}"  # type: ignore[union-attr]
    at_kill = fake.stats()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert fake.stats().total_calls < units
    resumed = subprocess.run(argv, cwd=ROOT, capture_output=True, timeout=400)
    assert resumed.returncode == 0, resumed.stderr.decode()[-3000:]
    stats = fake.stats()
    calls = stats.calls
    print(
        f"kill -9 + resume: {len(calls)} requests, {at_kill.total_calls - at_kill.ok} in flight at the kill, "
        f"{sum(n - 1 for n in calls.values())} asked twice, {stats.ok - units} paid twice"
    )
    assert len(calls) == units and set(calls.values()) == {1} and stats.ok == units
    assert _outputs(tmp_path, "store", "killed") == expected
    wait_for(lambda: not alive_workers("killed"), timeout_s=120)


@pytest.mark.slow
def test_judge_stage_grades_every_sample(
    tmp_path: Path, fake: FakeProviderServer, redis_url: str, ray_local: Any
) -> None:
    cfg = prompts_config(tmp_path, fake, rows=12, judge=True)
    rec = run(str(cfg), opts(tmp_path, redis_url, "judged"))
    assert rec.state == "finished"
    jsonl, _ = _outputs(tmp_path, "store", "judged")
    _check_outputs(jsonl, judged=True, rows=12)
    out = list(read_jsonl(jsonl))
    # equal answers to one row make one judge request: the judge paid for fewer than one per sample
    judge_keys = {r.judge_request_key for r in out}
    assert len(judge_keys) < len(out)
    assert rec.counters["judge"].provider_requests == len(judge_keys)
    verdicts = {r.judge_parsed["verdict"] for r in out if r.judge_parsed}  # type: ignore[index]
    assert verdicts == {"correct", "incorrect"}


def test_the_docs_example_config_loads(tmp_path: Path) -> None:
    section = (ROOT / "docs" / "pipelines" / "prompts.md").read_text()
    example = section[section.index("```toml\n") + len("```toml\n") : section.index("```\n", section.index("```toml"))]
    path = tmp_path / "example.toml"
    path.write_text(example)
    cfg = load_config(path)
    assert cfg.settings.n == 5 and cfg.settings.judge is not None
    assert [s.name for s in prompts.stages(cfg)] == ["generate", "judge"]


def test_headlines_per_model_from_the_outputs() -> None:
    cfg = load_config(DEMO)
    with tempfile.TemporaryDirectory() as tmp:
        store = LocalStore(tmp)
        ctx = StageContext(cfg, "h", store)
        generate, judge = prompts.stages(cfg)
        generate.reduce(ctx, _fake_results(list(generate.plan(ctx)), 3))
        units = list(judge.plan(ctx))
        assert len(units) == 36 * 2 * 3 - 3  # the failed request's 3 samples have nothing to judge
        verdict = ProviderResponse(texts=["VERDICT: correct"], input_tokens=10, output_tokens=3)
        judge.reduce(ctx, {u.unit_id: UnitResult(unit_id=u.unit_id, key="k", response=verdict) for u in units})
        lines = PIPELINE.headlines(StageContext(cfg, "h", store))
    assert lines == [
        f"**8b**: {36 * 3}/{36 * 3} samples answered, 33% parsed, judge: correct {36 * 3}",
        f"**70b**: {36 * 3 - 3}/{36 * 3} samples answered, 33% parsed, judge: correct {36 * 3 - 3}",  # unit 1 failed
    ]


def test_each_stage_may_set_its_own_mode(tmp_path: Path) -> None:
    text = DEMO.read_text().replace("../data/samples", str(ROOT / "data" / "samples"))
    text = text.replace('id_field = "id"', 'id_field = "id"\nmode = "batch"')
    text = text.replace('model = "anthropic:sonnet"', 'model = "anthropic:sonnet"\nmode = "online"')
    path = tmp_path / "c.toml"
    path.write_text(text)
    cfg = load_config(path)
    assert (cfg.stage_mode("generate"), cfg.stage_mode("judge")) == ("batch", "online")
    assert load_config(DEMO).stage_mode("generate") is None  # the providers' mode


# --- bad input refused before anything is created or paid (issue 34) ---------------------------------------


def _demo_with(tmp_path: Path, rows: str, extra: str = "") -> Path:
    data = tmp_path / "rows.jsonl"
    data.write_text(rows)
    cfg = tmp_path / "c.toml"
    text = DEMO.read_text().replace("../data/samples/prompts_sample.jsonl", str(data))
    cfg.write_text(text.replace('id_field = "id"', f'id_field = "id"\n{extra}'))
    return cfg


ROW = '{"id": "a", "question": "q?", "options": ["x", "y"], "answer": "x"}\n'


@pytest.mark.parametrize(
    ("rows", "extra", "where", "says"),
    [
        (ROW + '{"id": "b", "question": null, "options": ["x"], "answer": "x"}\n', "", "line 2", "'question'"),
        (ROW + '{"id": "b", "question": "q", "options": ["x"], "answer": null}\n', "", "line 2", "'answer'"),
        (
            ROW + '{"id": "b", "question": "' + "x" * 5000 + '", "options": ["x"], "answer": "x"}\n',
            "max_request_chars = 4000",
            "line 2",
            "over max_request_chars = 4,000",
        ),
    ],
)
def test_a_null_in_a_used_column_and_an_oversized_row_stop_run_and_plan_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], rows: str, extra: str, where: str, says: str
) -> None:
    cfg = _demo_with(tmp_path, rows, extra)
    for argv in (["run", str(cfg), "--runs-dir", str(tmp_path / "runs"), "--no-progress"], ["plan", str(cfg)]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert str(tmp_path / "rows.jsonl") in err and where in err and says in err, err
    assert not (tmp_path / "runs").exists()


def test_a_null_renders_as_the_null_setting_says(tmp_path: Path) -> None:
    rows = ROW + '{"id": "b", "question": null, "options": ["x"], "answer": "x"}\n'
    for setting, shown in (('null = "empty"', "Question: \n"), ('null = "N/A"', "Question: N/A\n")):
        cfg = load_config(_demo_with(tmp_path, rows, setting))
        prompts.check_inputs(cfg)
        job = prompts.Job(cfg)
        assert shown in job.compiled.messages(job.rows[1], job.data_file)[-1].content
    # an unused null column is no problem, and a template may test a null: {% if x %} / x is none
    cfg = load_config(
        _demo_with(tmp_path, ROW + '{"id": "b", "question": "q", "options": ["x"], "answer": "x", "topic": null}\n')
    )
    prompts.check_inputs(cfg)


def test_an_unwritable_store_is_refused_before_the_ledger_folder_exists(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    cfg = tmp_path / "c.toml"
    cfg.write_text(DEMO.read_text().replace("../data/samples", str(ROOT / "data" / "samples")))
    runs = tmp_path / "runs"
    argv = ["run", str(cfg), "--runs-dir", str(runs), "--store", str(blocker / "store"), "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is a file, not a folder" in err and "--store" in err, err
    assert not runs.exists()
    assert main(["run", str(cfg), "--runs-dir", str(blocker / "runs"), "--no-progress"]) == 2
    assert "--runs-dir" in capsys.readouterr().err


# --- what the outputs say: the judge's subset, structured outputs, batch prices ----------------------------


def _demo(tmp_path: Path, generate: str = "", judge: str = "", parse: str = "") -> Any:
    text = DEMO.read_text().replace("../data/samples", str(ROOT / "data" / "samples"))
    text = text.replace('id_field = "id"', f'id_field = "id"\n{generate}')
    text = text.replace('model = "anthropic:sonnet"', f'model = "anthropic:sonnet"\n{judge}')
    text = text.replace("[prompts.parse]", f"[prompts.parse]\n{parse}")
    path = tmp_path / "c.toml"
    path.write_text(text)
    return load_config(path)


def _judge_units(cfg: Any, store: LocalStore) -> tuple[StageContext, list[Any]]:
    ctx = StageContext(cfg, "s", store)
    generate, judge = prompts.stages(cfg)
    generate.reduce(ctx, _fake_results(list(generate.plan(ctx)), 3))
    return ctx, list(judge.plan(ctx))


def test_the_judge_reads_only_the_answers_where_and_fraction_choose(tmp_path: Path) -> None:
    rows = [json.loads(line) for line in (ROOT / "data/samples/prompts_sample.jsonl").read_text().splitlines()]
    answered = 36 * 2 * 3 - 3  # the failed request's 3 samples have no answer
    cfg = _demo(tmp_path, judge='where = "parsed.answer != row.answer"')
    ctx, units = _judge_units(cfg, LocalStore(str(tmp_path / "a")))
    right_first = sum(r["answer"] == "Saturn" for r in rows) * 2 - 1  # sample 0 says Saturn (q001's 70b failed)
    assert len(units) == answered - right_first
    prompts.stages(cfg)[1].reduce(ctx, {})
    out = list(read_jsonl(ctx.read_artifact("outputs.jsonl")))
    skipped = [r for r in out if r.text is not None and r.judge_request_key is None]
    assert len(skipped) == right_first and all(r.judge_parse_error is None for r in skipped)

    drawn = []
    for seed in (3, 3, 4):
        cfg = _demo(tmp_path, judge=f"fraction = 0.5\nfraction_seed = {seed}")
        drawn.append({u.unit_id for u in _judge_units(cfg, LocalStore(str(tmp_path / f"f{seed}")))[1]})
    assert drawn[0] == drawn[1] != drawn[2]  # the same seed draws the same answers
    assert 0.3 * answered < len(drawn[0]) < 0.7 * answered
    _, estimate = plan_run(cfg)
    assert estimate.requests < 36 * 2 * 3 * 0.7  # plan prices the draw, not every answer


def test_an_answer_where_cannot_be_evaluated_for_is_not_judged_and_says_why(tmp_path: Path) -> None:
    cfg = _demo(tmp_path, judge='where = "parsed.confidence < 0.9"')
    prompts.check_inputs(cfg)  # a stand-in answer's null confidence does not stop the run
    ctx, units = _judge_units(cfg, LocalStore(str(tmp_path / "w")))
    prompts.stages(cfg)[1].reduce(ctx, {})
    out = [r for r in read_jsonl(ctx.read_artifact("outputs.jsonl")) if r.text is not None]
    unparsed = [r for r in out if r.parsed is None]
    assert unparsed and all("where: TypeError" in str(r.judge_parse_error) for r in unparsed)
    assert len(units) == sum(r.parsed is not None and r.parsed["confidence"] < 0.9 for r in out) > 0


def test_a_where_naming_nothing_the_judge_sees_is_one_line(tmp_path: Path) -> None:
    cfg = _demo(tmp_path, judge='where = "nowhere > 1"')
    with pytest.raises(InputError, match="where: 'nowhere' is undefined"):
        prompts.check_inputs(cfg)
    with pytest.raises(ConfigError, match=r"prompts\.judge\.where"):
        _demo(tmp_path, judge='where = "parsed.answer !="')


def test_a_structured_parse_sends_its_schema_with_every_request(tmp_path: Path) -> None:
    cfg = _demo(tmp_path, parse="structured = true")
    ctx = StageContext(cfg, "s", LocalStore(str(tmp_path / "s")))
    units = list(prompts.stages(cfg)[0].plan(ctx))
    schemas = {u.request.response_schema for u in units}
    assert len(schemas) == 1 and json.loads(schemas.pop())["required"] == ["answer", "confidence"]
    demo = load_config(DEMO)
    plain = list(prompts.stages(demo)[0].plan(StageContext(demo, "s", ctx.store)))
    assert all(u.request.response_schema is None for u in plain)
    assert units[0].request.key() != plain[0].request.key()
    with pytest.raises(ConfigError, match=r"prompts\.judge\.parse\.structured"):
        load_config(_write_judge_parse(tmp_path))


def _write_judge_parse(tmp_path: Path) -> Path:
    text = DEMO.read_text().replace("../data/samples", str(ROOT / "data" / "samples"))
    text = text.replace("[prompts.judge.parse]\n", "[prompts.judge.parse]\nstructured = true\n")
    path = tmp_path / "j.toml"
    path.write_text(text)
    return path


def test_batch_rows_say_the_batch_price_they_were_charged(tmp_path: Path) -> None:
    online, batch = _demo(tmp_path), _demo(tmp_path, generate='mode = "batch"')
    for cfg in (online, batch):
        cfg.settings = msgspec.structs.replace(cfg.settings, judge=None)
    got = []
    for name, cfg in (("online", online), ("batch", batch)):
        ctx = StageContext(cfg, "b", LocalStore(str(tmp_path / name)))
        stage = prompts.stages(cfg)[0]
        stage.reduce(ctx, _fake_results(list(stage.plan(ctx)), 3))
        got.append(list(read_jsonl(ctx.read_artifact("outputs.jsonl"))))
    assert {r.mode for r in got[0]} == {"online"} and {r.mode for r in got[1]} == {"batch"}
    assert got[0][0].cost_usd > 0 and got[1][0].cost_usd == pytest.approx(got[0][0].cost_usd / 2)
    assert [r.text for r in got[0]] == [r.text for r in got[1]]
