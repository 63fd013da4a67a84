"""Output rows: JSONL and a streamed Parquet file with the same rows, the same bytes for the same rows; the
input row's columns first (renamed on a clash), parsed fields as typed Parquet columns."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from punchline.cluster.stages.outputs import Layout, OutputRow, jsonl_chunks, parquet_chunks, read_jsonl


def _rows(count: int) -> list[tuple[OutputRow, dict[str, Any]]]:
    return [
        (
            OutputRow(
                row_id=f"r{i}",
                model="m",
                sample=i % 3,
                text=None if i == 4 else f"answer {i}",
                parsed=None if i % 2 else {"answer": str(i), "score": i, "nested": {"z": 1, "a": [1, 2]}},
                parse_error="no match for the regex" if i % 2 else None,
                finish_reason="stop",
                input_tokens=i,
                output_tokens=2 * i,
                cost_usd=i / 1e6,
                request_key=f"k{i // 3}",
                judge_parsed={"verdict": "correct"} if i == 2 else None,
            ),
            # an int column with a null, a column only some rows have, one named like an output column,
            # one whose values have no common type
            {"id": i, "question": f"q{i}", "score": None if i == 3 else i * 1.5, "text": f"in {i}", "mixed": [1, "a"]}
            | ({"extra": True} if i == 1 else {}),
        )
        for i in range(count)
    ]


def test_parquet_in_several_row_groups_has_every_row_and_the_same_bytes_each_time() -> None:
    rows = _rows(20)
    layout = Layout([f for _, f in rows], parsed={"answer": "string", "score": "integer", "nested": "json"})
    raw = b"".join(parquet_chunks(rows, layout, row_group=7))
    assert raw == b"".join(parquet_chunks(iter(rows), layout, row_group=7))
    f = pq.ParquetFile(pa.BufferReader(raw))
    assert f.metadata.num_row_groups == 3
    schema = f.schema_arrow
    assert schema.names[:7] == ["id", "question", "score", "input.text", "mixed", "extra", "row_id"]
    assert (schema.field("id").type, schema.field("score").type, schema.field("extra").type) == (
        pa.int64(),
        pa.float64(),
        pa.bool_(),
    )
    assert schema.field("parsed.score").type == pa.int64() and schema.field("parsed.answer").type == pa.string()
    assert "parsed" not in schema.names and schema.field("judge_parsed").type == pa.string()  # judge: no fields
    table = f.read().to_pylist()
    assert [r["row_id"] for r in table] == [r.row_id for r, _ in rows]
    assert table[4]["text"] is None and table[1]["parsed.answer"] is None and table[3]["score"] is None
    assert (table[0]["parsed.answer"], table[0]["parsed.score"], table[0]["input.text"]) == ("0", 0, "in 0")
    assert json.loads(table[0]["parsed.nested"]) == {"z": 1, "a": [1, 2]}
    assert json.loads(table[0]["mixed"]) == [1, "a"] and table[1]["extra"] is True and table[0]["extra"] is None
    assert json.loads(table[2]["judge_parsed"]) == {"verdict": "correct"}


def test_jsonl_round_trips_with_objects_in_place() -> None:
    rows = _rows(6)
    layout = Layout([f for _, f in rows])
    raw = b"".join(jsonl_chunks(rows, layout))
    assert list(read_jsonl(raw)) == [r for r, _ in rows]
    first = json.loads(raw.splitlines()[0])
    assert first["parsed"] == {"answer": "0", "nested": {"a": [1, 2], "z": 1}, "score": 0}  # sorted: same bytes
    assert list(first)[:9] == ["id", "question", "score", "input.text", "mixed", "extra", "row_id", "model", "sample"]
    assert first["input.text"] == "in 0" and first["text"] == "answer 0" and first["extra"] is None
    assert list(json.loads(b"".join(jsonl_chunks(rows)).splitlines()[0]))[:2] == ["row_id", "model"]  # no layout


def test_a_streamed_layout_types_columns_as_the_values_held_whole() -> None:
    """A Layout reads its input rows once, a chunk at a time, keeping each column's type summary (issue 42); a
    column that is not flat is read again from the function that streams the rows: the same types as the list."""
    inputs = [
        {"s": f"x{i}", "i": i, "f": i if i % 3 else i + 0.5, "b": i % 2 == 0, "big": 2**62 if i == 2_500 else i}
        | ({"nested": [i]} if i % 1_000 == 7 else {})
        | ({"late": None} if i < 2_000 else {"late": "y"})
        | ({"mixed": "a" if i == 10 else 1} if i in (10, 2_999) else {})
        for i in range(3_000)
    ]
    passes = []

    def stream():
        passes.append(1)
        return iter(inputs)

    streamed = Layout(stream)
    whole = Layout(inputs)
    assert streamed.inputs == whole.inputs
    assert len(passes) == 1  # the types are not asked for until a Parquet file is laid out
    assert streamed.schema == whole.schema
    assert len(passes) == 2  # once more for the columns that are not flat (nested, mixed)
    assert str(whole.schema.field("nested").type) == "list<item: int64>"
    assert str(whole.schema.field("mixed").type) == "string"  # no common type: JSON text
    assert str(whole.schema.field("f").type) == "double" and str(whole.schema.field("late").type) == "string"
