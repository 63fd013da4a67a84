"""Input rows from JSONL, CSV or Parquet, each with an id, or one line naming what is wrong.

Rows are plain dicts (a template sees their fields by name). The format follows the file's
extension. Every problem — an unreadable or empty file, a line that is not a JSON object, a CSV line
with too many or too few cells, a row without the id field, an id seen twice — is an
:class:`InputError` naming the file, the row (its 1-based line; a Parquet row's 1-based index) and
the field, raised while the run's input is checked, before anything starts.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any

import msgspec

from punchline.data.errors import InputError

FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}


class Row(msgspec.Struct, frozen=True, kw_only=True):
    """One input row: its id (as text), where it came from (for error lines) and its fields."""

    id: str
    where: str  # "line 12" / "row 12"
    fields: dict[str, Any]


def load_rows(path: str | os.PathLike[str], id_field: str = "id") -> list[Row]:
    """The file's rows in file order; ``id_field = ""`` numbers them (1, 2, ...) by position."""
    p = Path(path)
    fmt = FORMATS.get(p.suffix.lower())
    if fmt is None:
        raise InputError(f"unknown format {p.suffix!r}: use .jsonl, .csv or .parquet", file=str(p))
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", file=str(p)) from None
    records = {"jsonl": _jsonl, "csv": _csv, "parquet": _parquet}[fmt](raw, str(p))
    if not records:
        raise InputError("has no rows", file=str(p))
    rows: list[Row] = []
    seen: dict[str, str] = {}
    for number, (where, fields) in enumerate(records, start=1):
        if id_field:
            if id_field not in fields or fields[id_field] is None or fields[id_field] == "":
                raise InputError("is missing (every row needs an id)", file=str(p), record=where, field=id_field)
            value = fields[id_field]
            if not isinstance(value, (str, int)) or isinstance(value, bool):
                raise InputError(
                    f"must be a string or an integer, got {type(value).__name__}",
                    file=str(p),
                    record=where,
                    field=id_field,
                )
            row_id = str(value)
        else:
            row_id = str(number)
        if row_id in seen:
            raise InputError(
                f"duplicate id {row_id!r} (first at {seen[row_id]})", file=str(p), record=where, field=id_field or None
            )
        seen[row_id] = where
        rows.append(Row(id=row_id, where=where, fields=fields))
    return rows


def _jsonl(raw: bytes, file: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"is not UTF-8 (byte {exc.start})", file=file) from None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError as exc:
            raise InputError(f"not valid JSON: {exc}", file=file, record=f"line {number}") from None
        if not isinstance(value, dict):
            raise InputError(f"is a JSON {type(value).__name__}, not an object", file=file, record=f"line {number}")
        out.append((f"line {number}", value))
    return out


def _csv(raw: bytes, file: str) -> list[tuple[str, dict[str, Any]]]:
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"is not UTF-8 (byte {exc.start})", file=file) from None
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, None)
        if header is None:
            return []
        if len(set(header)) != len(header) or any(not h for h in header):
            raise InputError("the header has an empty or repeated column name", file=file, record="line 1")
        out = []
        for cells in reader:
            where = f"line {reader.line_num}"
            if not cells:
                continue
            if len(cells) != len(header):
                raise InputError(f"has {len(cells)} cells, the header has {len(header)}", file=file, record=where)
            out.append((where, dict(zip(header, cells, strict=True))))
        return out
    except csv.Error as exc:
        raise InputError(f"malformed CSV: {exc}", file=file, record=f"line {reader.line_num}") from None


def _parquet(raw: bytes, file: str) -> list[tuple[str, dict[str, Any]]]:
    import pyarrow as pa  # lazy: only Parquet input needs it (a second and 40 MB, in every simulated run else)
    import pyarrow.parquet as pq  # lazy: as above

    try:
        table = pq.read_table(pa.BufferReader(raw))
    except (pa.ArrowException, OSError) as exc:
        raise InputError(f"not a readable Parquet file: {exc}", file=file) from None
    return [(f"row {i}", r) for i, r in enumerate(table.to_pylist(), start=1)]
