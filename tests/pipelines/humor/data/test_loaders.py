import json
from pathlib import Path

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from punchline.data.errors import InputError
from punchline.pipelines.humor.data.loaders import load_humor, load_items, load_json, load_parquet, load_predictions
from punchline.pipelines.humor.data.schema import HumorShotsFile, HumorTestFile
from tests.pipelines.humor.data.conftest import make_item


def _rows() -> list[dict]:
    return [msgspec.to_builtins(make_item(i, "ирония,Б")) for i in (1, 2)]


def test_json_test_and_shots_layouts(tmp_path: Path) -> None:
    test = tmp_path / "test.json"
    test.write_text(json.dumps({"access": "private", "data": _rows()}, ensure_ascii=False))
    shots = tmp_path / "shots.json"
    shots.write_text(json.dumps({"data": _rows()}, ensure_ascii=False))
    t = load_json(test)
    assert isinstance(t, HumorTestFile) and t.access == "private" and [x.id for x in t.data] == [1, 2]
    s = load_humor(shots)
    assert isinstance(s, HumorShotsFile) and s.data == t.data
    assert s.data[0].inputs.option("В") == "текст В 1"


def test_json_error_names_record_and_field(tmp_path: Path) -> None:
    rows = _rows()
    rows[1]["inputs"]["option_c"] = 5
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"data": rows}))
    with pytest.raises(InputError) as err:
        load_items(bad)
    assert err.value.file == str(bad) and err.value.record == 1 and err.value.field == "inputs.option_c"


def test_meta_extra_fields_allowed(tmp_path: Path) -> None:
    rows = _rows()
    rows[0]["meta"]["prompt_id"] = 3
    f = tmp_path / "x.json"
    f.write_text(json.dumps({"data": rows}))
    assert load_items(f)[0].meta.id == 1


def test_parquet(tmp_path: Path) -> None:
    path = tmp_path / "shots-00000-of-00001.parquet"
    rows = _rows()
    rows[0]["meta"]["extra"] = "x"
    rows[1]["meta"]["extra"] = "y"
    pq.write_table(pa.Table.from_pylist(rows), path)
    assert pa.types.is_struct(pq.read_schema(path).field("inputs").type)
    items = load_humor(path).data
    assert items == [make_item(1, "ирония,Б"), make_item(2, "ирония,Б")]


def test_parquet_errors(tmp_path: Path) -> None:
    rows = _rows()
    del rows[1]["inputs"]["main_text"]
    rows[0]["inputs"].pop("main_text")
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(InputError) as err:
        load_parquet(path)
    assert err.value.record == 0 and err.value.field == "inputs" and "main_text" in str(err.value)
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet")
    with pytest.raises(InputError, match="cannot read parquet"):
        load_parquet(junk)
    with pytest.raises(InputError, match="not found"):
        load_parquet(tmp_path / "missing.parquet")


def test_predictions(tmp_path: Path) -> None:
    p = tmp_path / "p.jsonl"
    p.write_text('{"id": 1, "text": "ОТВЕТ ирония\\nРЕШЕНИЕ Б"}\n\n{"id": 2, "text": ""}\n', encoding="utf-8")
    assert load_predictions(p) == {1: "ОТВЕТ ирония\nРЕШЕНИЕ Б", 2: ""}
    p.write_text('{"id": 1, "text": "a"}\n{"id": "2", "text": "b"}\n')
    with pytest.raises(InputError) as err:
        load_predictions(p)
    assert err.value.record == "line 2" and err.value.field == "id"
    p.write_text('{"id": 1, "text": "a"}\n{"id": 1, "text": "b"}\n')
    with pytest.raises(InputError, match=r"line 2.*repeated"):
        load_predictions(p)
    p.write_text('{"id": 1, "text": "a"}\n{oops\n')
    with pytest.raises(InputError, match=r"line 2.*malformed"):
        load_predictions(p)


def test_json_missing_item_field_and_malformed(tmp_path: Path) -> None:
    rows = _rows()
    del rows[0]["outputs"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"data": rows}))
    with pytest.raises(InputError) as err:
        load_items(bad)
    assert err.value.record == 0 and err.value.field is None and "outputs" in str(err.value)
    bad.write_text("{")
    with pytest.raises(InputError, match="malformed JSON"):
        load_items(bad)
