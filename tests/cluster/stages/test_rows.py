"""Row loaders: the three formats give the same rows; every bad input is one line naming file, row and field."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from punchline.cluster.stages.rows import check_rows, iter_rows, load_rows
from punchline.data.errors import InputError

ROWS = [
    {"id": "a1", "question": "What is 2 + 2?", "topic": "math"},
    {"id": "b2", "question": 'Name a colour, then a comma, then "quotes"', "topic": "art"},
    {"id": "c3", "question": "Line one\nline two", "topic": "misc"},
]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _csv(path: Path, rows: list[dict]) -> Path:
    import csv

    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def _parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.mark.parametrize(
    "write,name",
    [(_jsonl, "rows.jsonl"), (_csv, "rows.csv"), (_parquet, "rows.parquet")],
    ids=["jsonl", "csv", "parquet"],
)
def test_every_format_gives_the_same_rows_in_file_order(tmp_path: Path, write, name: str) -> None:
    rows = load_rows(write(tmp_path / name, ROWS))
    assert [r.id for r in rows] == ["a1", "b2", "c3"]
    assert [r.fields for r in rows] == ROWS


def test_integer_ids_and_numbered_rows(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "r.jsonl", [{"id": 7, "q": "x"}, {"id": 8, "q": "y"}])
    assert [r.id for r in load_rows(path)] == ["7", "8"]
    numbered = _jsonl(tmp_path / "n.jsonl", [{"q": "x"}, {"q": "y"}, {"q": "z"}])
    assert [r.id for r in load_rows(numbered, id_field="")] == ["1", "2", "3"]


def test_blank_lines_of_jsonl_are_skipped_but_counted(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('{"id": 1}\n\n{"id": 2}\n')
    rows = load_rows(path)
    assert [(r.id, r.where) for r in rows] == [("1", "line 1"), ("2", "line 3")]


def _error(path: Path, **kw: str) -> InputError:
    with pytest.raises(InputError) as err:
        load_rows(path, **kw)
    assert "\n" not in str(err.value)
    return err.value


def test_bad_json_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('{"id": 1}\n{"id": 2,\n')
    err = _error(path)
    assert err.file == str(path) and err.record == "line 2" and "not valid JSON" in str(err)


def test_a_line_that_is_not_an_object(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('{"id": 1}\n[1, 2]\n')
    assert _error(path).record == "line 2"


def test_missing_id_names_the_row_and_field(tmp_path: Path) -> None:
    err = _error(_jsonl(tmp_path / "r.jsonl", [{"id": "x"}, {"question": "no id"}]))
    assert (err.record, err.field) == ("line 2", "id")
    err = _error(_csv(tmp_path / "r.csv", [{"key": "1"}]), id_field="id")
    assert (err.record, err.field) == ("line 2", "id")


def test_duplicate_id_names_both_rows(tmp_path: Path) -> None:
    err = _error(_jsonl(tmp_path / "r.jsonl", [{"id": "x"}, {"id": "y"}, {"id": "x"}]))
    assert err.record == "line 3" and "first at line 1" in str(err)
    err = _error(_parquet(tmp_path / "r.parquet", [{"id": 1}, {"id": 1}]))
    assert err.record == "row 2"


def test_an_id_that_is_no_string_or_integer(tmp_path: Path) -> None:
    err = _error(_jsonl(tmp_path / "r.jsonl", [{"id": [1]}]))
    assert err.field == "id" and "string or an integer" in str(err)


@pytest.mark.parametrize("content", [b"", b"\n\n", b"id,question\n"], ids=["empty", "blank", "header-only"])
def test_empty_files(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / ("r.csv" if b"," in content else "r.jsonl")
    path.write_bytes(content)
    assert "has no rows" in str(_error(path))


def test_csv_line_with_the_wrong_number_of_cells(tmp_path: Path) -> None:
    path = tmp_path / "r.csv"
    path.write_text("id,question\n1,a\n2,b,extra\n")
    err = _error(path)
    assert err.record == "line 3" and "3 cells" in str(err)


def test_unknown_format_unreadable_file_and_broken_parquet(tmp_path: Path) -> None:
    assert "unknown format" in str(_error(tmp_path / "rows.txt"))
    assert "cannot read" in str(_error(tmp_path / "missing.jsonl"))
    broken = tmp_path / "r.parquet"
    broken.write_bytes(b"PAR1 not really")
    assert "Parquet" in str(_error(broken))


def test_streamed_rows_equal_the_loaded_ones_across_parquet_batches(tmp_path: Path) -> None:
    """A pass reads a chunk at a time (issue 42): the rows, their order and their places are the whole file's."""
    rows = [{"id": f"r{i}", "n": i, "tags": [i, i + 1]} for i in range(2_345)]
    path = tmp_path / "many.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=700)
    streamed = list(iter_rows(path))
    assert streamed == load_rows(path)
    assert [r.fields for r in streamed] == rows and streamed[-1].where == "row 2345"


@pytest.mark.parametrize(
    "content,said",
    [
        (
            b'{"id":1}\n{"q":2}\n{"id":1}\n',
            "record line 2, field 'id': is missing",
        ),  # the first bad row, before the duplicate
        (b'{"id":1}\n{"id":1}\n{"q":2}\n', "record line 2, field 'id': duplicate id '1' (first at line 1)"),
        (b'{"q":1}\n{bad\n', "record line 2: not valid JSON"),  # every record parses before any id is checked
        (b'{bad\n{"id":1}\n\xff\n', "is not UTF-8 (byte 14)"),  # the file decodes before any record parses
    ],
)
def test_the_check_says_what_loading_the_whole_file_said_first(tmp_path: Path, content: bytes, said: str) -> None:
    path = tmp_path / "r.jsonl"
    path.write_bytes(content)
    with pytest.raises(InputError, match=re.escape(said)):
        check_rows(path)


def test_a_duplicate_among_many_ids_names_its_first_row(tmp_path: Path) -> None:
    rows = [{"id": f"q{i}"} for i in range(5_000)] + [{"id": "q4321"}]
    with pytest.raises(
        InputError, match=re.escape("record line 5001, field 'id': duplicate id 'q4321' (first at line 4322)")
    ):
        check_rows(_jsonl(tmp_path / "r.jsonl", rows))
    check_rows(_jsonl(tmp_path / "ok.jsonl", rows[:-1]))
