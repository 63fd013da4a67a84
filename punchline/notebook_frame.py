"""The frame ``punchline.prompts`` returns: the user's own rows, each repeated per model x sample, beside
the answers of the steps that ran.

Why not the run's ``outputs.parquet`` as it is: that file is the pipeline's, the same for every caller (a
column for every step it may run, an input column named like an output column renamed ``input.<name>``,
the input's values as JSON read them); read back it also loses the DataFrame's index. A notebook user wants
their frame back: its index, its columns under their names with their dtypes, and only the answer columns
of what they asked for. So the answers are taken from the file (the columns from ``row_id`` on) and put
beside the user's rows, which are taken from the object the user passed (pandas, polars) or, for the
others, from the file's input columns under their own names.

Which input row an output row answers is the order of first appearance of its ``row_id``: the pipeline
writes rows input row x model x sample, every input row with all of its samples (a failed one too, with
its ``error``), so the k-th distinct ``row_id`` is the k-th input row, whatever ``id_field`` is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from punchline.cluster.stages.outputs import SCHEMA_TAIL
from punchline.data.errors import InputError, PunchlineError

PARSED = ("parsed", "judge_parsed")  # the fields a parser spreads over columns ``<field>.<name>``
_PARSE = ("parsed", "parse_error")
_JUDGE_PARSE = ("judge_parsed", "judge_parse_error")


def answer_fields(*, parse: bool, judge: bool, judge_parse: bool) -> list[str]:
    """The answer fields a call's result has, in the file's order: generate's always, the parse step's with
    ``parse=``, the judge's with ``judge=`` (its parse's when it has one). A step not asked for has no
    column: all-empty columns are noise, and their absence says the step did not run."""
    kept = []
    for field, _ in SCHEMA_TAIL:
        if field in _JUDGE_PARSE:
            wanted = judge_parse
        elif field.startswith("judge_"):
            wanted = judge
        elif field in _PARSE:
            wanted = parse
        else:
            wanted = True
        if wanted:
            kept.append(field)
    return kept


def field_of(column: str) -> str:
    """The answer field a column of the file holds (``parsed.answer`` -> ``parsed``)."""
    head, dot, _ = column.partition(".")
    return head if dot and head in PARSED else column


def check_names(columns: Sequence[str], fields: Sequence[str]) -> None:
    """One line, before anything runs, when an input column is named like an answer column of this call."""
    clashes = [c for c in columns if field_of(c) in fields]
    if clashes:
        first = clashes[0]
        raise InputError(
            f"is also the name of an answer column of the result ({', '.join(map(repr, clashes))}): rename the "
            f"input column, and its name in the template (e.g. data.rename(columns={{{first!r}: {first + '_in'!r}}}))",
            file="data",
            field=first,
        )


def result_frame(
    data: Any, outputs: pa.Table, columns: Sequence[str], fields: Sequence[str], info: Mapping[str, Any]
) -> Any:
    """The returned frame (see :func:`punchline.api.prompts` for its schema): ``outputs`` is the run's
    ``outputs.parquet``, whose first ``len(columns)`` columns are the input's ``columns``."""
    names = outputs.column_names
    start = len(columns)
    if names[start : start + 1] != ["row_id"]:
        raise PunchlineError(
            f"run {info['run_id']}: its outputs do not have this data's {start} columns first (another run's id?)"
        )
    answers = outputs.select([i for i in range(start, len(names)) if field_of(names[i]) in fields])
    encoded = answers.column("row_id").combine_chunks().dictionary_encode()
    positions, rows = encoded.indices.cast(pa.int64()), len(encoded.dictionary)
    top = type(data).__module__.partition(".")[0]
    if top in ("pandas", "polars") and rows != len(data):
        raise PunchlineError(f"run {info['run_id']}: its outputs answer {rows} rows, the data has {len(data)}")
    if top == "pandas":
        return _pandas(data, answers, positions, info)
    if top == "polars":
        return _polars(data, answers, positions, info)
    table = pa.Table.from_arrays(
        outputs.columns[:start] + answers.columns, names=list(columns) + answers.column_names
    )  # the input columns as the run read them, under their own names (the file renames a clash)
    frame = _to_pandas(table, info)
    frame.index = positions.to_numpy()
    frame.attrs["punchline"] = dict(info)
    return frame


def _pandas(data: Any, answers: pa.Table, positions: pa.Array, info: Mapping[str, Any]) -> Any:
    inputs = data.take(positions.to_numpy())  # the user's columns, dtypes and index labels, repeated
    frame = inputs.reset_index(drop=True).join(_to_pandas(answers, info))  # no name in both: check_names
    frame.index = inputs.index
    frame.attrs = {**data.attrs, "punchline": dict(info)}
    return frame


def _polars(data: Any, answers: pa.Table, positions: pa.Array, info: Mapping[str, Any]) -> Any:
    frame = data[positions.to_pylist()].hstack(type(data)(answers))
    frame.attrs = {"punchline": dict(info)}  # polars has no attrs: this object's own, as pandas spells it
    return frame


def _to_pandas(table: pa.Table, info: Mapping[str, Any]) -> Any:
    try:
        return table.to_pandas()
    except ImportError:
        raise PunchlineError(
            f"punchline.prompts returns a pandas DataFrame for this data: pip install pandas "
            f"(the outputs are run {info['run_id']}'s, in {info['runs_dir']})"
        ) from None
