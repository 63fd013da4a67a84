"""Input rows from JSONL, CSV or Parquet, each with an id, or one line naming what is wrong.

Rows are plain dicts (a template sees their fields by name). The format follows the file's
extension. Every problem — an unreadable or empty file, a line that is not a JSON object, a CSV line
with too many or too few cells, a row without the id field, an id seen twice — is an
:class:`InputError` naming the file, the row (its 1-based line; a Parquet row's 1-based index) and
the field, raised by :func:`check_rows` while the run's input is checked, before anything starts.

Why streamed: a run's driver reads the rows several times (the plan, the simulator's answers, the
output's column types, the reduce), and holding them whole cost 0.7 KB per row (issue 42): 700 MB at
10^6 rows. :func:`iter_rows` reads the file a chunk at a time (a line, a CSV record, a Parquet batch
of :data:`PARQUET_BATCH` rows), so a pass holds one chunk. :func:`check_rows` says what the whole file's
load would say, the same error for the same file: a file that is not UTF-8 first (wherever it is), then
the first malformed record, then the first row whose id is missing, bad or seen before. Seen ids are kept
as 8-byte hashes (bucketed arrays: 8 bytes a row while the check runs, not the ids), and a hash seen twice
is confirmed on the ids themselves by a second pass that keeps only the suspects.
"""

from __future__ import annotations

import csv
import io
import json
import os
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from punchline.data.errors import InputError

FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}
PARQUET_BATCH = 1_000  # rows per Parquet batch a pass holds
BOM = b"\xef\xbb\xbf"


class Row(msgspec.Struct, frozen=True, kw_only=True):
    """One input row: its id (as text), where it came from (for error lines) and its fields."""

    id: str
    where: str  # "line 12" / "row 12"
    fields: dict[str, Any]


def load_rows(path: str | os.PathLike[str], id_field: str = "id") -> list[Row]:
    """The file's rows in file order, checked (:func:`check_rows`); ``id_field = ""`` numbers them (1, 2, ...)
    by position. The whole file in memory: a run streams it with :func:`iter_rows` instead."""
    check_rows(path, id_field)
    return list(iter_rows(path, id_field))


def iter_rows(path: str | os.PathLike[str], id_field: str = "id") -> Iterator[Row]:
    """The file's rows in file order, read a chunk at a time. A row without a usable id is an InputError as it
    comes; duplicate ids are :func:`check_rows`'s to find (the run checks its input before it reads it so)."""
    p = Path(path)
    for number, (where, fields) in enumerate(_records(p), start=1):
        yield Row(id=_row_id(fields, id_field, number, str(p), where), where=where, fields=fields)


def check_rows(path: str | os.PathLike[str], id_field: str = "id") -> None:
    """An InputError for what is wrong with the file, as loading it whole would find it first: not UTF-8
    anywhere, else the first malformed record, else no rows, else the first row whose id is missing, not a
    string or an integer, or a duplicate (naming the first row that had it)."""
    p, file = Path(path), str(path)
    fmt = _format(p)
    if fmt != "parquet":
        _check_utf8(p)
    count = 0
    bad: InputError | None = None  # the first row without a usable id: raised after the records all parse
    hashes = _IdHashes()
    for where, fields in _records(p):
        count += 1
        if bad is not None or not id_field:
            continue
        try:
            hashes.add(_row_id(fields, id_field, count, file, where))
        except InputError as exc:
            bad = exc
    if not count:
        raise InputError("has no rows", file=file)
    suspects = hashes.suspects()
    if suspects:
        seen: dict[str, str] = {}
        for number, (where, fields) in enumerate(_records(p), start=1):
            if number > len(hashes):
                break
            row_id = _row_id(fields, id_field, number, file, where)
            if hash(row_id) not in suspects:
                continue
            if row_id in seen:
                raise InputError(
                    f"duplicate id {row_id!r} (first at {seen[row_id]})", file=file, record=where, field=id_field
                )
            seen[row_id] = where
    if bad is not None:
        raise bad


class _IdHashes:
    """The ids seen so far as their 64-bit hashes, in 256 arrays by the hash's low byte (8 bytes an id)."""

    def __init__(self) -> None:
        self._buckets = [array("q") for _ in range(256)]
        self._count = 0

    def add(self, row_id: str) -> None:
        h = hash(row_id)
        self._buckets[h & 0xFF].append(h)
        self._count += 1

    def __len__(self) -> int:
        return self._count

    def suspects(self) -> set[int]:
        """The hashes seen more than once (a bucket at a time: a set of a 256th of the ids at most)."""
        out: set[int] = set()
        for bucket in self._buckets:
            seen: set[int] = set()
            for h in bucket:
                if h in seen:
                    out.add(h)
                seen.add(h)
        return out


def _row_id(fields: dict[str, Any], id_field: str, number: int, file: str, where: str) -> str:
    if not id_field:
        return str(number)
    value = fields.get(id_field)
    if id_field not in fields or value is None or value == "":
        raise InputError("is missing (every row needs an id)", file=file, record=where, field=id_field)
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise InputError(
            f"must be a string or an integer, got {type(value).__name__}", file=file, record=where, field=id_field
        )
    return str(value)


def _format(p: Path) -> str:
    fmt = FORMATS.get(p.suffix.lower())
    if fmt is None:
        raise InputError(f"unknown format {p.suffix!r}: use .jsonl, .csv or .parquet", file=str(p))
    return fmt


def _open(p: Path) -> Any:
    try:
        return p.open("rb")
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", file=str(p)) from None


def _records(p: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, fields) of each record in file order, a chunk at a time."""
    reader = {"jsonl": _jsonl, "csv": _csv, "parquet": _parquet}[_format(p)]
    yield from reader(p, str(p))


def _lines(p: Path) -> Iterator[str]:
    """The file's text, a line (ending with ``\\n``) at a time; the byte a decoding fails at is counted from the
    start of the text (after a byte-order mark), as decoding the whole file says."""
    with _open(p) as fh:
        offset = 0  # of the line's first byte in the text (the mark left out)
        for number, raw in enumerate(fh):
            chunk = raw
            if number == 0 and raw.startswith(BOM):
                chunk = raw[len(BOM) :]
            try:
                text = chunk.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(f"is not UTF-8 (byte {offset + exc.start})", file=str(p)) from None
            offset += len(chunk)
            yield text


def _check_utf8(p: Path) -> None:
    for _ in _lines(p):
        pass


def _jsonl(p: Path, file: str) -> Iterator[tuple[str, dict[str, Any]]]:
    number = 0
    for text in _lines(p):
        for line in text.splitlines():  # as the whole text's splitlines: \r, U+2028 and the like end a line too
            number += 1
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except ValueError as exc:
                raise InputError(f"not valid JSON: {exc}", file=file, record=f"line {number}") from None
            if not isinstance(value, dict):
                raise InputError(f"is a JSON {type(value).__name__}, not an object", file=file, record=f"line {number}")
            yield f"line {number}", value


def _csv(p: Path, file: str) -> Iterator[tuple[str, dict[str, Any]]]:
    with _open(p) as raw, io.TextIOWrapper(raw, encoding="utf-8-sig", newline="") as text:
        reader = csv.reader(text)  # lines end at \r, \n or \r\n, as io.StringIO(text, newline="") gives them
        try:
            header = next(reader, None)
            if header is None:
                return
            if len(set(header)) != len(header) or any(not h for h in header):
                raise InputError("the header has an empty or repeated column name", file=file, record="line 1")
            for cells in reader:
                where = f"line {reader.line_num}"
                if not cells:
                    continue
                if len(cells) != len(header):
                    raise InputError(f"has {len(cells)} cells, the header has {len(header)}", file=file, record=where)
                yield where, dict(zip(header, cells, strict=True))
        except csv.Error as exc:
            raise InputError(f"malformed CSV: {exc}", file=file, record=f"line {reader.line_num}") from None
        except UnicodeDecodeError:  # checked before a run reads it (check_rows): the file changed since
            raise InputError("is not UTF-8", file=file) from None


def _parquet(p: Path, file: str) -> Iterator[tuple[str, dict[str, Any]]]:
    import pyarrow as pa  # lazy: only Parquet input needs it (a second and 40 MB, in every simulated run else)
    import pyarrow.parquet as pq  # lazy: as above

    number = 0
    try:
        with _open(p) as fh, pq.ParquetFile(fh) as reader:
            # one thread, and the batches' generator closed with this one: a reader left suspended (a caller that
            # stops early) holds no Arrow thread into the interpreter's exit, where tearing one down aborts the
            # process ("terminate called without an active exception", apache/arrow#34314)
            batches = reader.iter_batches(batch_size=PARQUET_BATCH, use_threads=False)
            try:
                for batch in batches:
                    for r in batch.to_pylist():
                        number += 1
                        yield f"row {number}", r
            finally:
                batches.close()
    except (pa.ArrowException, OSError) as exc:
        raise InputError(f"not a readable Parquet file: {exc}", file=file) from None
