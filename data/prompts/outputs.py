"""The prompts pipeline's output: one row per input row x model x sample, as JSONL and Parquet.

Rows come in input order, then model order (as configured), then sample index, so the files are a
pure function of the answers: byte-identical across resumes, worker counts and modes (online or
batch). ``input_tokens``, ``output_tokens`` and ``cost_usd`` are the request's (its ``n`` samples
were one request), so the same on the ``n`` rows sharing a ``request_key``; sum them over distinct
request keys. Both files are written from a stream of rows (Parquet a row group at a time), so a
reduce holds one row group, not the run. In Parquet, ``parsed`` and ``judge_parsed`` are JSON text
(their fields depend on the answers, a column's type must not); in JSONL they are objects.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq


class OutputRow(msgspec.Struct, kw_only=True, omit_defaults=False):
    row_id: str
    model: str
    sample: int
    text: str | None
    parsed: dict[str, Any] | None = None
    parse_error: str | None = None
    finish_reason: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    request_key: str = ""
    error: str | None = None  # the unit failed after its retries: no text
    judge_text: str | None = None
    judge_parsed: dict[str, Any] | None = None
    judge_parse_error: str | None = None
    judge_request_key: str | None = None
    judge_cost_usd: float | None = None


_JSON = msgspec.json.Encoder(order="deterministic")
_DECODER = msgspec.json.Decoder(OutputRow)

SCHEMA = pa.schema(
    [
        ("row_id", pa.string()),
        ("model", pa.string()),
        ("sample", pa.int32()),
        ("text", pa.string()),
        ("parsed", pa.string()),
        ("parse_error", pa.string()),
        ("finish_reason", pa.string()),
        ("input_tokens", pa.int64()),
        ("output_tokens", pa.int64()),
        ("cost_usd", pa.float64()),
        ("request_key", pa.string()),
        ("error", pa.string()),
        ("judge_text", pa.string()),
        ("judge_parsed", pa.string()),
        ("judge_parse_error", pa.string()),
        ("judge_request_key", pa.string()),
        ("judge_cost_usd", pa.float64()),
    ]
)


def jsonl_chunks(rows: Iterable[OutputRow]) -> Iterable[bytes]:
    for row in rows:
        yield _JSON.encode(row) + b"\n"


def read_jsonl(raw: bytes) -> Iterator[OutputRow]:
    for line in raw.splitlines():
        if line.strip():
            yield _DECODER.decode(line)


def _json_text(value: dict[str, Any] | None) -> str | None:
    return None if value is None else _JSON.encode(value).decode()


ROW_GROUP = 20_000  # rows per Parquet row group: what the writer holds in memory at once


def _table(rows: list[OutputRow]) -> pa.Table:
    columns: dict[str, list[Any]] = {name: [] for name in SCHEMA.names}
    for row in rows:
        for name in SCHEMA.names:
            value = getattr(row, name)
            columns[name].append(_json_text(value) if name in ("parsed", "judge_parsed") else value)
    return pa.table(columns, schema=SCHEMA)


def parquet_chunks(rows: Iterable[OutputRow], row_group: int = ROW_GROUP) -> Iterator[bytes]:
    """The rows as one Parquet file, streamed a row group at a time (deterministic: same rows, same bytes)."""
    sink = io.BytesIO()
    it = iter(rows)
    with pq.ParquetWriter(sink, SCHEMA, compression="zstd") as writer:
        while batch := list(islice(it, row_group)):
            writer.write_table(_table(batch))
            yield _drain(sink)
    yield _drain(sink)


def _drain(sink: io.BytesIO) -> bytes:
    data = sink.getvalue()
    sink.seek(0)
    sink.truncate()
    return data
