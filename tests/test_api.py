"""The Python API: ``punchline.run`` / ``punchline.status`` return the run's record and raise the project's
errors, print nothing, and ``import punchline`` alone loads neither the engine nor Ray; ``punchline.prompts``
takes a DataFrame (pandas, polars), a Dataset, a list of dicts or a path and gives the user's frame back (its
index, its columns and dtypes, the answer columns of the steps that ran, the run in ``attrs``), and a second
call pays nothing (the fake provider counts the calls); ``punchline.run`` takes
a pipeline object and its settings without a TOML file."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import datasets
import msgspec
import pandas as pd
import polars
import pytest

import punchline
from punchline.cluster.run.driver import RunRecord
from punchline.cluster.stages.rows import load_rows
from punchline.data.errors import ConfigError, InputError, PunchlineError
from punchline.notebook import data_file, provider_tables

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "sentiment_pipeline"


def test_importing_punchline_stays_cheap() -> None:
    code = (
        "import sys, punchline\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'redis', 'boto3', 'openai')"
        " or m.startswith('punchline.'))\n"
        "print(heavy)\n"
        "punchline.run\n"  # the first use imports the API
        "print('punchline.cluster.run.driver' in sys.modules)\n"
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


# --- without a TOML file: punchline.prompts(data, ...) and punchline.run(pipeline, settings) -------------

QUESTIONS = [
    {"question": f"Which colour goes with the number {i}?", "options": ["red", "green", "blue"], "level": i % 3}
    for i in range(6)
]
ANSWER = {"type": "object", "required": ["answer"], "properties": {"answer": {"type": "string"}}}


def _providers(fake: Any) -> dict[str, Any]:
    model = {"id": "sim-notebook-small", "input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0}
    return {"sim": {"kind": "openai", "base_url": fake.openai_base_url, "timeout_s": 5, "models": {"small": model}}}


def _ask(data: Any, fake: Any, runs: Path, **kwargs: Any) -> Any:
    return punchline.prompts(
        data,
        "{{ question }}\nOptions: {{ options | join(' | ') }}",
        models=["small"],
        n=2,
        providers=_providers(fake),
        runs_dir=str(runs),
        max_tokens=32,
        **({"parse": ANSWER} | kwargs),
    )


ANSWERS = ["row_id", "model", "sample", "text", "parsed.answer", "parse_error", "finish_reason", "input_tokens",
           "output_tokens", "cost_usd", "mode", "request_key", "error"]  # fmt: skip


def test_prompts_gives_back_the_users_frame_and_a_second_call_pays_nothing(
    tmp_path: Path, fake: Any, ray_local: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    index = pd.Index([f"q{i * 3}" for i in range(len(QUESTIONS))], name="key")  # not 0..n: the user's own
    frame = pd.DataFrame(QUESTIONS, index=index).astype({"level": "int8"})
    frame.attrs["source"] = "my questions"
    fake.reset()
    out = _ask(frame, fake, tmp_path / "runs")
    assert isinstance(out, pd.DataFrame) and len(out) == len(QUESTIONS) * 2  # rows x n samples
    assert list(out.columns) == ["question", "options", "level", *ANSWERS]  # no judge_*: no judge was asked for
    assert out.index.name == "key" and out.index.tolist() == [k for k in index for _ in range(2)]
    assert out["level"].dtype == "int8" and out["sample"].tolist() == [0, 1] * len(QUESTIONS)
    pd.testing.assert_frame_equal(out[["question", "level"]], frame.loc[out.index, ["question", "level"]])
    assert out["text"].notna().all() and set(out["parsed.answer"].dropna()) <= {"red", "green", "blue"}
    assert out["row_id"].tolist()[:4] == ["1", "1", "2", "2"]  # no id column: rows are numbered
    meta = out.attrs["punchline"]
    assert out.attrs["source"] == "my questions" and meta["runs_dir"] == str((tmp_path / "runs").absolute())
    assert meta["state"] == "finished" and punchline.status(meta["run_id"], runs_dir=meta["runs_dir"]).run_id
    paid = fake.stats().total_calls
    assert paid == len(QUESTIONS)  # one request per row (n in the request)

    again = _ask(frame.copy(), fake, tmp_path / "runs")  # the same cell run again
    assert fake.stats().total_calls == paid and again.attrs == out.attrs
    pd.testing.assert_frame_equal(again, out)
    # the same rows as a list of dicts: another run (another file), every answer from the response cache
    listed = _ask(QUESTIONS, fake, tmp_path / "runs")
    assert fake.stats().total_calls == paid and listed.attrs["punchline"]["run_id"] != meta["run_id"]
    assert listed.index.tolist() == [i for i in range(len(QUESTIONS)) for _ in range(2)]  # positions in the list
    assert list(listed.columns) == list(out.columns) and listed["text"].tolist() == out["text"].tolist()
    assert capfd.readouterr().out == ""


def test_prompts_over_polars_keeps_its_order_and_a_judge_adds_its_columns(
    tmp_path: Path, fake: Any, ray_local: Any
) -> None:
    rows = [{**q, "parsed": f"mine {i}"} for i, q in enumerate(QUESTIONS)]  # "parsed": no parse step, no clash
    judge = {"model": "small", "prompt": "Q: {{ row.question }}\nA: {{ response }}", "parse": r"(?P<verdict>\w+)"}
    out = _ask(polars.DataFrame(rows), fake, tmp_path / "runs", parse=None, judge=judge)
    assert isinstance(out, polars.DataFrame) and out.height == len(rows) * 2
    judged = ["judge_text", "judge_parsed.verdict", "judge_parse_error", "judge_request_key", "judge_cost_usd",
              "judge_mode"]  # fmt: skip
    generated = [a for a in ANSWERS if a not in ("parsed.answer", "parse_error")]
    assert out.columns == ["question", "options", "level", "parsed", *generated, *judged]
    assert out["parsed"].to_list() == [r["parsed"] for r in rows for _ in range(2)]  # the input's, in its order
    assert out["judge_text"].null_count() == 0 and out.attrs["punchline"]["state"] == "finished"
    with pytest.raises(InputError, match="field 'judge_text'"):  # with a judge, its columns are the answer's
        _ask([{**q, "judge_text": "x"} for q in QUESTIONS], fake, tmp_path / "runs", judge=judge)


def test_polars_and_datasets_tables_become_the_same_rows(tmp_path: Path) -> None:
    want = [r.fields for r in load_rows(data_file(QUESTIONS, tmp_path)[0], "")]
    for data in (polars.DataFrame(QUESTIONS), datasets.Dataset.from_list(QUESTIONS)):
        path, _, columns = data_file(data, tmp_path)
        assert columns == ["question", "options", "level"]
        assert [r.fields for r in load_rows(path, "")] == want
    shuffled = datasets.Dataset.from_list(QUESTIONS).select([2, 0])  # a view: its indices are honoured
    assert [r.fields["level"] for r in load_rows(data_file(shuffled, tmp_path)[0], "")] == [2, 0]


def test_providers_come_from_the_settings_file_the_rule_finds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PUNCHLINE_CONFIG", raising=False)
    with pytest.raises(ConfigError, match=r"punchline\.toml"):
        provider_tables(None)
    (tmp_path / "punchline.toml").write_text('[providers.here]\nkind = "openai"\nbase_url = "simulated"\n')
    named = tmp_path / "elsewhere.toml"
    named.write_text('[providers.there]\nkind = "anthropic"\nbase_url = "simulated"\n[simulator]\nseed = 3\n')
    assert list(provider_tables(None)[0]) == ["here"]
    monkeypatch.setenv("PUNCHLINE_CONFIG", str(named))
    tables, engine = provider_tables(None)
    assert list(tables) == ["there"] and engine == {"simulator": {"seed": 3}}
    assert list(provider_tables({"arg": {"kind": "openai"}})[0]) == ["arg"]  # an argument wins


def test_run_takes_a_pipeline_object_and_its_settings(example: Path, tmp_path: Path, fake: Any, ray_local: Any) -> None:
    sys.path.insert(0, str(example))
    from sentiment_pipeline.pipeline import Sentiment  # type: ignore[import-not-found]

    pipeline = Sentiment()
    settings = msgspec.convert(
        {
            "reviews": str(example / "data" / "reviews.jsonl"),
            "label": {"provider": "sim", "model": "small"},
            "judge": {"provider": "sim", "model": "small"},
        },
        pipeline.settings_type,
    )
    runs = str(tmp_path / "runs")
    fake.reset()
    first = punchline.run(pipeline, settings, providers=_providers(fake), runs_dir=runs)
    assert first.state == "finished" and first.counters["label"].units_done == 12
    paid = fake.stats().total_calls
    assert paid > 0
    again = punchline.run(pipeline, settings, providers=_providers(fake), runs_dir=runs)
    assert again.run_id == first.run_id and fake.stats().total_calls == paid
    with pytest.raises(PunchlineError, match="needs its settings"):
        punchline.run(pipeline)
