"""The notebook API's plumbing: the config it writes reads back as written (any text survives TOML), a
run id follows the content, and ``parse=`` takes a regex, a JSON schema, a Pydantic model or a table; the
frame it returns has the answer columns of the steps asked for, an input column named like one of them is
one line before anything runs, and the user's rows come back (pandas: its index; the others: positions)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pandas as pd
import polars
import pyarrow as pa
import pydantic
import pytest

import punchline
from punchline.cluster.stages.outputs import Layout, OutputRow
from punchline.data.errors import ConfigError, InputError, PunchlineError
from punchline.notebook import ProgressBar, content_id, data_file, judge_table, parse_table, register, toml_text
from punchline.notebook_frame import answer_fields, check_names, result_frame
from punchline.schedulers.ledger import StageCounters


def test_the_config_text_reads_back_as_written() -> None:
    tables = {
        "run": {"pipeline": "punchline.notebook:pipeline_x", "shard_size": 8},
        "providers": {"my provider": {"kind": "openai", "models": {"8b": {"id": "m", "input_usd_per_mtok": 0.18}}}},
        "prompts": {
            "prompt": 'Q: {{ question }}\n"quoted" \\ back\tslash \x7f ünïcode 😀',
            "stop": ["\n", "###"],
            "temperature": 0.7,
            "seed": None,  # left out: TOML has no null
            "parse": {"json_schema": {"type": "object", "properties": {"a b": {"enum": ["x", "y"]}}}},
            "messages": [{"role": "user", "content": "hi"}],
        },
    }
    text = toml_text(tables, "a header\nof two lines")
    back = tomllib.loads(text)
    tables["prompts"].pop("seed")
    assert back == tables
    assert toml_text(tables, "a header") == toml_text(tables, "a header")  # deterministic: the run id's input
    with pytest.raises(ConfigError, match=r"prompts\.stop"):
        toml_text({"prompts": {"stop": ["x", None]}}, "")


def test_run_ids_follow_the_content() -> None:
    a = content_id("prompts", "config", "data")
    assert a == content_id("prompts", "config", "data") and a.startswith("prompts-")
    assert a != content_id("prompts", "config", "other data")
    assert content_id("my pipe/line", "x").startswith("my-pipe-line-")


def test_parse_takes_a_regex_a_schema_a_pydantic_model_or_a_table() -> None:
    class Answer(pydantic.BaseModel):
        answer: str
        confidence: float

    assert parse_table(r"A:\s*(?P<a>\w+)") == {"regex": r"A:\s*(?P<a>\w+)"}
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    assert parse_table(schema) == {"json_schema": schema, "structured": True}
    assert parse_table({"json_schema": schema}) == {"json_schema": schema}  # a table: as given
    model = parse_table(Answer)
    assert model is not None and model["structured"] is True
    assert model["json_schema"]["properties"]["confidence"]["type"] == "number"
    assert judge_table({"model": "m", "prompt": "p", "parse": "V: (?P<v>.)"})["parse"] == {"regex": "V: (?P<v>.)"}  # type: ignore[index]
    with pytest.raises(ConfigError, match="is a int"):
        parse_table(3)


def test_bad_data_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"row 2.*not a dict"):
        data_file([{"a": 1}, ["b"]], tmp_path)
    with pytest.raises(InputError, match="has no rows"):
        data_file([], tmp_path)
    with pytest.raises(InputError, match="data is a int"):
        data_file(3, tmp_path)
    with pytest.raises(InputError, match="cannot read"):
        data_file(tmp_path / "missing.jsonl", tmp_path)
    with pytest.raises(ConfigError, match="no str `name`"):
        register(object())


def test_a_path_is_read_where_it_is_and_named_by_its_content(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"id": 1, "q": "a"}\n')
    path, digest, _ = data_file(rows, tmp_path / "nb")
    assert path == rows and not (tmp_path / "nb").exists()
    rows.write_text('{"id": 1, "q": "b"}\n')
    assert data_file(rows, tmp_path / "nb")[1] != digest  # edited in place: another run


def test_the_progress_bar_follows_each_stage() -> None:
    bar = ProgressBar()
    with bar as update:
        update("generate", StageCounters(units_total=10, units_done=3, units_failed=1, cost_usd=0.5))
        update("generate", StageCounters(units_total=10, units_done=9, units_failed=1, cost_usd=0.75))
        update("judge", StageCounters(units_total=0))
    tasks = {t.description: t for t in bar._progress.tasks}
    assert (tasks["generate"].completed, tasks["generate"].total) == (10, 10)
    assert tasks["generate"].fields["cost"] == 0.75 and tasks["judge"].total is None


GENERATE = ["row_id", "model", "sample", "text", "finish_reason", "input_tokens", "output_tokens", "cost_usd", "mode",
            "request_key", "error"]  # fmt: skip
JUDGE = ["judge_text", "judge_request_key", "judge_cost_usd", "judge_mode"]


def test_a_step_not_asked_for_has_no_columns() -> None:
    assert answer_fields(parse=False, judge=False, judge_parse=False) == GENERATE
    with_parse = answer_fields(parse=True, judge=False, judge_parse=False)
    assert with_parse == [*GENERATE[:4], "parsed", "parse_error", *GENERATE[4:]]
    judged = answer_fields(parse=False, judge=True, judge_parse=True)
    assert judged == [*GENERATE, "judge_text", "judge_parsed", "judge_parse_error", *JUDGE[1:]]
    assert answer_fields(parse=False, judge=True, judge_parse=False) == GENERATE + JUDGE


def test_an_input_column_named_like_an_answer_column_is_one_line() -> None:
    plain = answer_fields(parse=False, judge=False, judge_parse=False)
    check_names(["question", "parsed", "parsed.answer", "judge_text", "input.text", "texts"], plain)  # no clash
    with pytest.raises(InputError, match=r"field 'model'.*\('model', 'text'\).*rename") as err:
        check_names(["question", "model", "text"], plain)
    assert err.value.field == "model" and "\n" not in str(err.value)
    parsed = answer_fields(parse=True, judge=True, judge_parse=True)
    for name in ("parsed", "parsed.answer", "judge_parsed.verdict", "judge_mode"):
        with pytest.raises(InputError, match=name):
            check_names([name], parsed)


def test_a_clash_stops_prompts_before_anything_runs(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    providers = {"sim": {"kind": "openai", "base_url": "simulated", "models": {"8b": {"id": "sim-8b"}}}}
    frame = pd.DataFrame({"text": ["a", "b"], "sample": [1, 2]})
    with pytest.raises(InputError, match="field 'text'"):
        punchline.prompts(frame, "{{ text }}", models="8b", providers=providers, runs_dir=str(runs))
    assert sorted(p.name for p in runs.iterdir()) == ["_notebook"]  # the rows' file, no run, no services
    assert not list((runs / "_notebook").glob("*.toml"))


def _outputs(rows: list[dict[str, object]], ids: list[str], n: int) -> pa.Table:
    """An outputs.parquet as the pipeline lays it out: each row (id ``ids[i]``) x one model x ``n`` samples."""
    answered = [
        (OutputRow(row_id=row_id, model="m", sample=s, text=f"{row_id}/{s}"), fields)
        for row_id, fields in zip(ids, rows, strict=True)
        for s in range(n)
    ]
    return Layout([f for _, f in answered]).table(answered)


INFO = {"run_id": "r", "runs_dir": "/runs", "store": "/runs", "state": "finished"}


def test_the_users_rows_come_back_beside_the_answers() -> None:
    rows = [{"question": "q1", "judge_text": "mine"}, {"question": "q2", "judge_text": "also mine"}]
    outputs = _outputs(rows, ["zeta", "alpha"], n=2)  # ids out of order: the rows' order is the file's
    assert "input.judge_text" in outputs.column_names  # the file renames a column named like any output column
    fields = answer_fields(parse=False, judge=False, judge_parse=False)
    columns = ["question", "judge_text"]
    answers = ["row_id", "model", "sample", "text"]

    index = pd.MultiIndex.from_tuples([("x", 1), ("x", 2)], names=["group", "n"])
    frame = pd.DataFrame(rows, index=index).astype({"question": "category"})
    frame.attrs["mine"] = 1
    out = result_frame(frame, outputs, columns, fields, INFO)
    assert out.index.tolist() == [("x", 1), ("x", 1), ("x", 2), ("x", 2)] and out.index.names == ["group", "n"]
    assert list(out.columns) == columns + GENERATE and out["question"].dtype == "category"
    assert out[answers].values.tolist() == [["zeta", "m", 0, "zeta/0"], ["zeta", "m", 1, "zeta/1"],
                                            ["alpha", "m", 0, "alpha/0"], ["alpha", "m", 1, "alpha/1"]]  # fmt: skip
    assert out.attrs == {"mine": 1, "punchline": INFO}

    pl_out = result_frame(polars.DataFrame(rows), outputs, columns, fields, INFO)
    assert isinstance(pl_out, polars.DataFrame) and pl_out.columns == columns + GENERATE
    assert pl_out["judge_text"].to_list() == ["mine", "mine", "also mine", "also mine"]
    assert pl_out.attrs == {"punchline": INFO}

    listed = result_frame(rows, outputs, columns, fields, INFO)  # the rows as the run read them, by position
    assert list(listed.columns) == columns + GENERATE and listed.index.tolist() == [0, 0, 1, 1]
    assert listed["judge_text"].tolist() == pl_out["judge_text"].to_list()
    assert listed.attrs == {"punchline": INFO}

    with pytest.raises(PunchlineError, match="answer 2 rows, the data has 3"):
        result_frame(pd.DataFrame(rows * 2).head(3), outputs, columns, fields, INFO)
    with pytest.raises(PunchlineError, match="another run"):
        result_frame(rows, outputs, ["question"], fields, INFO)
