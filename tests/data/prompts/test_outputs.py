"""Output rows: JSONL and a streamed Parquet file with the same rows, the same bytes for the same rows."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

from punchline.data.prompts.outputs import OutputRow, jsonl_chunks, parquet_chunks, read_jsonl


def _rows(count: int) -> list[OutputRow]:
    return [
        OutputRow(
            row_id=f"r{i}",
            model="m",
            sample=i % 3,
            text=None if i == 4 else f"answer {i}",
            parsed=None if i % 2 else {"answer": str(i), "nested": {"z": 1, "a": [1, 2]}},
            parse_error="no match for the regex" if i % 2 else None,
            finish_reason="stop",
            input_tokens=i,
            output_tokens=2 * i,
            cost_usd=i / 1e6,
            request_key=f"k{i // 3}",
            judge_parsed={"verdict": "correct"} if i == 2 else None,
        )
        for i in range(count)
    ]


def test_parquet_in_several_row_groups_has_every_row_and_the_same_bytes_each_time() -> None:
    rows = _rows(20)
    raw = b"".join(parquet_chunks(rows, row_group=7))
    assert raw == b"".join(parquet_chunks(iter(rows), row_group=7))
    f = pq.ParquetFile(pa.BufferReader(raw))
    assert f.metadata.num_row_groups == 3
    table = f.read().to_pylist()
    assert [r["row_id"] for r in table] == [r.row_id for r in rows]
    assert table[4]["text"] is None and table[1]["parsed"] is None
    assert json.loads(table[0]["parsed"]) == {"answer": "0", "nested": {"z": 1, "a": [1, 2]}}
    assert json.loads(table[2]["judge_parsed"]) == {"verdict": "correct"}


def test_jsonl_round_trips_with_objects_in_place() -> None:
    rows = _rows(6)
    raw = b"".join(jsonl_chunks(rows))
    assert list(read_jsonl(raw)) == rows
    first = json.loads(raw.splitlines()[0])
    assert first["parsed"] == {"answer": "0", "nested": {"a": [1, 2], "z": 1}}  # keys sorted: deterministic bytes
    assert list(first)[:4] == ["row_id", "model", "sample", "text"]
