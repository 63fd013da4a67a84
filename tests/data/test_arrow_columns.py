"""The pandas-free column builder equals pyarrow.array: types, values, errors and Parquet bytes."""

from __future__ import annotations

import io
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from punchline.data.storage.arrow_columns import column, infer_type

ROOT = Path(__file__).resolve().parents[2]

FLAT = st.one_of(
    st.none(),
    st.text(max_size=8),
    st.booleans(),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**31) - 2, max_value=2**31 + 1),
)
ODD = st.one_of(
    FLAT, st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=2), st.integers(), max_size=2)
)
TYPES = [pa.string(), pa.int64(), pa.int32(), pa.float64(), pa.bool_(), pa.null()]


def _outcome(build: Any) -> tuple[str, Any]:
    try:
        return "ok", build()
    except Exception as exc:
        return "error", type(exc).__name__


def _values(arr: pa.Array) -> list[Any]:
    return ["NaN" if isinstance(v, float) and math.isnan(v) else v for v in arr.to_pylist()]


def _same_column(values: list[Any], arrow_type: pa.DataType) -> None:
    ours = _outcome(lambda: column(pa, values, arrow_type))
    theirs = _outcome(lambda: pa.array(values, type=arrow_type))
    assert ours[0] == theirs[0], (values, arrow_type, ours, theirs)
    if ours[0] == "ok":
        ours[1].validate(full=True)
        assert ours[1].type == theirs[1].type and ours[1].null_count == theirs[1].null_count
        # Array.equals says NaN != NaN (pyarrow's own [nan] is not equal to itself): the values, NaN as NaN
        assert _values(ours[1]) == _values(theirs[1]), (values, arrow_type)
    else:
        assert ours[1] == theirs[1]


@settings(max_examples=400, deadline=None)
@given(st.lists(ODD, max_size=12))
def test_infer_type_is_pyarrows(values: list[Any]) -> None:
    ours = _outcome(lambda: infer_type(pa, values))
    theirs = _outcome(lambda: pa.array(values).type)
    assert ours == theirs, values


@settings(max_examples=400, deadline=None)
@given(st.lists(FLAT, max_size=12), st.sampled_from(TYPES))
def test_column_is_pyarrows(values: list[Any], arrow_type: pa.DataType) -> None:
    _same_column(values, arrow_type)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.text()), max_size=30))
def test_text_columns_write_the_same_parquet_bytes(values: list[Any]) -> None:
    def parquet(arr: pa.Array) -> bytes:
        sink = io.BytesIO()
        pq.write_table(pa.Table.from_arrays([arr], names=["t"]), sink, compression="zstd")
        return sink.getvalue()

    assert parquet(column(pa, values, pa.string())) == parquet(pa.array(values, type=pa.string()))


@pytest.mark.parametrize(
    ("values", "arrow_type"),
    [
        (["a", "\udc80"], pa.string()),  # a lone surrogate: no UTF-8 for it
        ([True, 1], pa.int64()),
        ([2**63], pa.int64()),
        ([2**31], pa.int32()),
        ([2**53 + 1, 0.5], pa.float64()),
        (["é", None, "日本", ""], pa.string()),
        ([None] * 9 + [1], pa.int64()),
        ([float("nan"), None, 1.5], pa.float64()),
    ],
)
def test_edges_match(values: list[Any], arrow_type: pa.DataType) -> None:
    _same_column(values, arrow_type)


def test_a_parquet_output_imports_no_pandas(tmp_path: Path) -> None:
    """The prompts pipeline's Parquet file, written in a fresh process, leaves pandas unimported."""
    probe = (
        "import sys\n"
        "from punchline.cluster.stages.outputs import Layout, OutputRow, parquet_chunks\n"
        "layout = Layout([{'q': 'x', 'n': 1, 'f': 0.5, 'b': True}], parsed={'a': 'integer'})\n"
        "row = OutputRow(row_id='r0', model='m', sample=0, text='hi', parsed={'a': 3})\n"
        "data = b''.join(parquet_chunks([(row, {'q': 'x', 'n': 1, 'f': 0.5, 'b': True})], layout))\n"
        "print(len(data) > 0, 'pandas' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "False"]
