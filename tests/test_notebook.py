"""The notebook API's plumbing: the config it writes reads back as written (any text survives TOML), a
run id follows the content, and ``parse=`` takes a regex, a JSON schema, a Pydantic model or a table."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pydantic
import pytest

from punchline.data.errors import ConfigError, InputError
from punchline.notebook import ProgressBar, content_id, data_file, judge_table, parse_table, register, toml_text
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
