"""The prompts pipeline's output: one row per input row x model x sample, as JSONL and Parquet.

Rows come in input order, then model order (as configured), then sample index, so the files are a
pure function of the answers: byte-identical across resumes and worker counts (a batch-mode run
differs only in its cost columns, which say what was charged: see ``mode``). ``input_tokens``,
``output_tokens`` and ``cost_usd`` are the request's (its ``n`` samples were one request), so the same
on the ``n`` rows sharing a ``request_key``; sum them over distinct request keys.

Each output row carries its input row's columns first, under their own names (a column named like an
output column, ``model`` or ``text`` say, becomes ``input.<name>``), so a table of results needs no
join. In JSONL, ``parsed`` and ``judge_parsed`` are objects; in Parquet, every field the parser
declares (a regex's named groups, a JSON schema's ``properties``) is its own typed column,
``parsed.<field>`` (string, integer, number and boolean as such; anything else as JSON text), and a
parser that declares no field gives one ``parsed`` column of JSON text. Input columns keep the type
Arrow infers from their values (JSON text when the values have no common type).

Both files are written from a stream of rows (Parquet a row group at a time), so a reduce holds one
row group, not the run.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import islice
from typing import TYPE_CHECKING, Any

import msgspec

from punchline.data.storage.arrow_columns import TypeSummary, column, infer_type

if TYPE_CHECKING:  # pyarrow is imported when a Parquet file is written (a second and 40 MB otherwise)
    import pyarrow as pa


OUTPUTS_JSONL = "outputs.jsonl"
OUTPUTS_PARQUET = "outputs.parquet"
ANSWERS_JSONL = "answers.jsonl"  # generate's rows, for the judge
ROW_ID = "row_id"  # an output row's first column after its input row's own (the viewer finds a unit's row by it)


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
    cost_usd: float = 0.0  # what the request was charged: the batch price when it went through a batch
    mode: str = "online"  # how the request was priced: online or batch (its stage's mode for its provider)
    request_key: str = ""
    error: str | None = None  # the unit failed after its retries: no text
    judge_text: str | None = None
    judge_parsed: dict[str, Any] | None = None
    judge_parse_error: str | None = None
    judge_request_key: str | None = None  # None: the judge did not read this answer ([prompts.judge] where/fraction)
    judge_cost_usd: float | None = None
    judge_mode: str | None = None


OUTPUT_NAMES = frozenset(OutputRow.__struct_fields__)
_JSON = msgspec.json.Encoder(order="deterministic")
_DECODER = msgspec.json.Decoder(OutputRow)

TYPE_CHUNK = 1_000  # input rows a Layout types at a time

# a parsed field's JSON-schema type -> its Parquet column's Arrow type ("json": JSON text)
_ARROW = {"string": "string", "integer": "int64", "number": "float64", "boolean": "bool_", "json": "string"}


def _arrow() -> Any:
    """pyarrow, imported the first time a Parquet file is laid out (the simulated provider imports every
    installed pipeline: a run of another pipeline never pays it)."""
    import pyarrow  # lazy: a second to import; only Parquet output needs it

    return pyarrow


def _arrow_type(name: str) -> pa.DataType:
    return getattr(_arrow(), name)()


def _as_int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    return int(v) if isinstance(v, float) and v.is_integer() else None


def _as_float(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _json_text(v: Any) -> str | None:
    return None if v is None else _JSON.encode(v).decode()


_CONVERT: dict[str, Callable[[Any], Any]] = {
    "string": lambda v: v if isinstance(v, str) else _json_text(v),
    "integer": _as_int,
    "number": _as_float,
    "boolean": lambda v: v if isinstance(v, bool) else None,
    "json": _json_text,
}


def _infer(values: list[Any]) -> pa.DataType | None:
    """The Arrow type of an input column's values, or None when they have none in common (JSON text)."""
    pa = _arrow()
    try:
        return infer_type(pa, values)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return None


Inputs = Iterable[Mapping[str, Any]]  # each input row's fields


class Layout:
    """The columns of a run's output files: its input columns (names and Parquet types), and the parsed
    columns its parsers declare (``parsed``/``judge_parsed``: field name -> JSON-schema type).

    ``inputs`` is read once, a chunk of :data:`TYPE_CHUNK` rows at a time, keeping each column's
    :class:`~punchline.data.storage.arrow_columns.TypeSummary`, not its values (issue 42: a run's rows are
    streamed). A column whose values are not flat (nested, or no common type) is typed from its values, read
    again: ``inputs`` is then iterated a second time, so a one-shot iterator must come as a function that
    returns a fresh one."""

    def __init__(
        self,
        inputs: Inputs | Callable[[], Inputs] = (),
        parsed: Mapping[str, str] | None = None,
        judge_parsed: Mapping[str, str] | None = None,
    ) -> None:
        self._read: Callable[[], Inputs] = inputs if callable(inputs) else (lambda: inputs)
        order: dict[str, None] = {}
        self._summaries: dict[str, TypeSummary] = {}
        chunk: list[Mapping[str, Any]] = []
        for fields in self._read():
            order.update(dict.fromkeys(fields))
            chunk.append(fields)
            if len(chunk) == TYPE_CHUNK:
                self._summarize(chunk)
                chunk = []
        self._summarize(chunk)
        self.inputs = [(k, f"input.{k}" if k in OUTPUT_NAMES else k) for k in order]
        self.parsed = dict(parsed or {})
        self.judge_parsed = dict(judge_parsed or {})

    def _summarize(self, chunk: list[Mapping[str, Any]]) -> None:
        columns: dict[str, list[Any]] = {}
        for fields in chunk:
            for k, v in fields.items():
                columns.setdefault(k, []).append(v)
        for k, values in columns.items():
            self._summaries.setdefault(k, TypeSummary()).add(values)

    @functools.cached_property
    def _input_types(self) -> dict[str, pa.DataType | None]:
        """Typed when a Parquet file is laid out: from the summaries, else (a column not flat) its values."""
        pa = _arrow()
        types = {k: self._summaries[k].flat_type(pa) for k, _ in self.inputs}
        rest = [k for k, t in types.items() if t is None]
        if rest:
            values: dict[str, list[Any]] = {k: [] for k in rest}
            for fields in self._read():
                for k in rest:
                    values[k].append(fields.get(k))
            types.update({k: _infer(v) for k, v in values.items()})
        return types

    @functools.cached_property
    def schema(self) -> pa.Schema:
        """The Parquet file's columns: the inputs', then the answer's (a parsed field's own columns)."""
        columns: list[tuple[str, pa.DataType]] = [
            (name, self._input_types[k] or _arrow_type("string")) for k, name in self.inputs
        ]
        for field, arrow in SCHEMA_TAIL:
            if field in ("parsed", "judge_parsed"):
                columns += self._parsed_columns(field)
            else:
                columns.append((field, _arrow_type(arrow)))
        return _arrow().schema(columns)

    def _parsed_columns(self, field: str) -> list[tuple[str, pa.DataType]]:
        types = self.parsed if field == "parsed" else self.judge_parsed
        if not types:
            return [(field, _arrow_type("string"))]
        return [(f"{field}.{name}", _arrow_type(_ARROW[kind])) for name, kind in types.items()]

    def input_values(self, fields: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
        """The input row's columns as output columns (renamed on a clash), in the layout's order."""
        for k, name in self.inputs:
            yield name, fields.get(k)

    def table(self, rows: list[tuple[OutputRow, Mapping[str, Any]]]) -> pa.Table:
        columns: dict[str, list[Any]] = {name: [] for name in self.schema.names}
        for row, fields in rows:
            for k, name in self.inputs:
                value = fields.get(k)
                columns[name].append(value if self._input_types[k] is not None else _json_text(value))
            for field, _ in SCHEMA_TAIL:
                value = getattr(row, field)
                if field not in ("parsed", "judge_parsed"):
                    columns[field].append(value)
                    continue
                types = self.parsed if field == "parsed" else self.judge_parsed
                if not types:
                    columns[field].append(_json_text(value))
                    continue
                for name, kind in types.items():
                    got = value.get(name) if value is not None else None
                    columns[f"{field}.{name}"].append(None if got is None else _CONVERT[kind](got))
        pa = _arrow()
        arrays = [column(pa, columns[f.name], f.type) for f in self.schema]
        return pa.Table.from_arrays(arrays, schema=self.schema)


# each answer column and its Arrow type's name (``pyarrow.<name>()``)
SCHEMA_TAIL: list[tuple[str, str]] = [
    ("row_id", "string"),
    ("model", "string"),
    ("sample", "int32"),
    ("text", "string"),
    ("parsed", "string"),
    ("parse_error", "string"),
    ("finish_reason", "string"),
    ("input_tokens", "int64"),
    ("output_tokens", "int64"),
    ("cost_usd", "float64"),
    ("mode", "string"),
    ("request_key", "string"),
    ("error", "string"),
    ("judge_text", "string"),
    ("judge_parsed", "string"),
    ("judge_parse_error", "string"),
    ("judge_request_key", "string"),
    ("judge_cost_usd", "float64"),
    ("judge_mode", "string"),
]
assert [f for f, _ in SCHEMA_TAIL] == list(OutputRow.__struct_fields__)

Rows = Iterable[tuple[OutputRow, Mapping[str, Any]]]  # each output row with its input row's fields


def jsonl_chunks(rows: Rows, layout: Layout | None = None) -> Iterable[bytes]:
    """One JSON object per row: the input columns (per ``layout``; none without one), then the row's."""
    layout = layout or Layout()
    for row, fields in rows:
        own = _JSON.encode(row)
        pairs = [_JSON.encode(name) + b":" + _JSON.encode(value) for name, value in layout.input_values(fields)]
        if pairs:
            own = b"{" + b",".join(pairs) + b"," + own[1:]
        yield own + b"\n"


def read_jsonl(raw: bytes) -> Iterator[OutputRow]:
    """The rows of an output file (input columns, which are not the pipeline's, are skipped)."""
    for line in raw.splitlines():
        if line.strip():
            yield _DECODER.decode(line)


def read_jsonl_chunks(chunks: Iterable[bytes]) -> Iterator[OutputRow]:
    """The rows of an output file read a piece at a time (:meth:`~punchline.data.store.Store.get_chunks`): the same
    rows as :func:`read_jsonl` of the whole, holding one piece and its lines, not the file."""
    rest = b""
    for chunk in chunks:
        lines, newline, rest = (rest + chunk).rpartition(b"\n")
        if newline:
            yield from read_jsonl(lines)
    yield from read_jsonl(rest)


ROW_GROUP = 20_000  # rows per Parquet row group: what the writer holds in memory at once, as Arrow columns
# rows turned into Arrow columns at a time: the Python objects of a row group (its rows, their columns as lists) are
# several times its Arrow columns' size, so a row group is built from slices of this many (the writer writes the same
# bytes whatever the chunks of a row group's columns: tests/cluster/stages/test_streaming_reduce.py); a multiple of
# pyarrow's write batch (1,024 rows) all the same
TABLE_SLICE = 2_048


def parquet_chunks(rows: Rows, layout: Layout | None = None, row_group: int = ROW_GROUP) -> Iterator[bytes]:
    """The rows as one Parquet file, streamed a row group at a time (deterministic: same rows, same bytes)."""
    layout = layout or Layout()
    sink = io.BytesIO()
    it = iter(rows)
    import pyarrow.parquet as pq  # lazy: a second to import; only Parquet output needs it

    with pq.ParquetWriter(sink, layout.schema, compression="zstd") as writer:
        while group := _row_group(layout, it, row_group):
            writer.write_table(group, row_group_size=row_group)
            del group  # its columns are freed before the next row group's are built
            yield _drain(sink)
    yield _drain(sink)


def _row_group(layout: Layout, rows: Iterator[tuple[OutputRow, Mapping[str, Any]]], size: int) -> pa.Table | None:
    """The next ``size`` rows as one table, built :data:`TABLE_SLICE` rows at a time (None: no rows left)."""
    slices: list[pa.Table] = []
    left = size
    while left > 0 and (batch := list(islice(rows, min(TABLE_SLICE, left)))):
        slices.append(layout.table(batch))
        left -= len(batch)
    if not slices:
        return None
    return slices[0] if len(slices) == 1 else _arrow().concat_tables(slices)


def _drain(sink: io.BytesIO) -> bytes:
    data = sink.getvalue()
    sink.seek(0)
    sink.truncate()
    return data
