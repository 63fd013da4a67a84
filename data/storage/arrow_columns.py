"""Arrow arrays from Python lists, for flat columns, without pandas.

Why: ``pyarrow.array`` (and ``pyarrow.table``, which calls it) imports pandas the first time it is called,
installed or not needed, to ask whether the list is a pandas object: 0.22 s of CPU and 40 MB in every run
that writes a Parquet file, a tenth of a millisecond per call in a 2,000-call run. A flat column (strings,
64- or 32-bit integers, doubles, booleans: every answer column and most input columns) is simple enough to
lay out here, in Arrow's own buffers (validity bits, offsets, values), and give to
``pyarrow.Array.from_buffers``, which asks nothing of pandas.

Anything else (a nested value, a number out of range, a value of another Python type, a subclass) goes to
``pyarrow.array`` as before: the same array and the same errors, at pandas' price. :func:`infer_type` and
:func:`column` equal ``pyarrow.array(values).type`` and ``pyarrow.array(values, type=...)`` on every list
(tests/data/test_arrow_columns.py compares them, values and Parquet bytes).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pyarrow is imported by the caller when it writes a Parquet file
    import pyarrow as pa

INT64 = (-(2**63), 2**63 - 1)
INT32 = (-(2**31), 2**31 - 1)
EXACT_FLOAT_INT = 2**53  # an int larger than this may not convert to a double exactly: pyarrow decides
MAX_OFFSET = 2**31 - 1  # a string column's bytes beyond this need large_string: pyarrow decides


def _validity(values: Sequence[Any]) -> tuple[bytearray, int]:
    """Arrow's validity bitmap (bit i set: value i is not null, least significant bit first) and the nulls."""
    bits = bytearray((len(values) + 7) // 8)
    nulls = 0
    for i, v in enumerate(values):
        if v is None:
            nulls += 1
        else:
            bits[i >> 3] |= 1 << (i & 7)
    return bits, nulls


def _strings(pa: Any, values: Sequence[Any]) -> pa.Array | None:
    if any(v is not None and type(v) is not str for v in values):
        return None
    data = "".join(v for v in values if v is not None).encode()  # a lone surrogate raises, as pyarrow does
    if len(data) > MAX_OFFSET:
        return None
    offsets = array("i", [0])
    end = 0
    for v in values:
        if v is not None:
            end += len(v.encode()) if not v.isascii() else len(v)
        offsets.append(end)
    bits, nulls = _validity(values)
    buffers = [pa.py_buffer(bits) if nulls else None, pa.py_buffer(offsets), pa.py_buffer(data)]
    return pa.Array.from_buffers(pa.string(), len(values), buffers, null_count=nulls)


def _numbers(code: str, ok: Callable[[Any], bool]) -> Callable[[Any, Any, Sequence[Any]], pa.Array | None]:
    """A builder of a fixed-width number column (``array`` typecode ``code``) whose non-null values pass ``ok``."""

    def build(pa: Any, arrow_type: Any, values: Sequence[Any]) -> pa.Array | None:
        if not all(v is None or ok(v) for v in values):
            return None
        data = array(code, [0 if v is None else v for v in values])
        bits, nulls = _validity(values)
        buffers = [pa.py_buffer(bits) if nulls else None, pa.py_buffer(data)]
        return pa.Array.from_buffers(arrow_type, len(values), buffers, null_count=nulls)

    return build


def _in(bounds: tuple[int, int]) -> Callable[[Any], bool]:
    return lambda v: type(v) is int and bounds[0] <= v <= bounds[1]


def _double(v: Any) -> bool:
    return type(v) is float or (type(v) is int and -EXACT_FLOAT_INT <= v <= EXACT_FLOAT_INT)


def _booleans(pa: Any, values: Sequence[Any]) -> pa.Array | None:
    if any(v is not None and type(v) is not bool for v in values):
        return None
    data = bytearray((len(values) + 7) // 8)
    for i, v in enumerate(values):
        if v:
            data[i >> 3] |= 1 << (i & 7)
    bits, nulls = _validity(values)
    buffers = [pa.py_buffer(bits) if nulls else None, pa.py_buffer(data)]
    return pa.Array.from_buffers(pa.bool_(), len(values), buffers, null_count=nulls)


_INT64 = _numbers("q", _in(INT64))
_INT32 = _numbers("i", _in(INT32))
_FLOAT64 = _numbers("d", _double)


def column(pa: Any, values: Sequence[Any], arrow_type: pa.DataType) -> pa.Array:
    """``pyarrow.array(values, type=arrow_type)``, without pandas for a flat column. ``pa``: the pyarrow module
    (imported by the caller, which needs it anyway)."""
    built: pa.Array | None = None
    if arrow_type == pa.string():
        built = _strings(pa, values)
    elif arrow_type == pa.int64():
        built = _INT64(pa, arrow_type, values)
    elif arrow_type == pa.int32():
        built = _INT32(pa, arrow_type, values)
    elif arrow_type == pa.float64():
        built = _FLOAT64(pa, arrow_type, values)
    elif arrow_type == pa.bool_():
        built = _booleans(pa, values)
    return built if built is not None else pa.array(values, type=arrow_type)


def infer_type(pa: Any, values: Sequence[Any]) -> pa.DataType:
    """``pyarrow.array(values).type`` (raising what it raises), without pandas when the values are flat: all
    null, strings, booleans, integers, or integers and floats."""
    summary = TypeSummary()
    summary.add(values)
    flat = summary.flat_type(pa)
    return flat if flat is not None else pa.array(values).type


class TypeSummary:
    """What :func:`infer_type` needs of a column, gathered a chunk of values at a time, so that a column streamed
    from a file is typed without being held (issue 42): the values' Python types, and whether every int fits
    int64 and every number a double. :meth:`flat_type` is ``infer_type`` of all the values seen when they are
    flat; None when they are not (a nested value, a subclass, an int out of range): then only the values
    themselves say, and the caller reads them again for ``infer_type``."""

    def __init__(self) -> None:
        self.kinds: set[type] = set()
        self.int64 = True  # every int is in int64's range
        self.double = True  # every int and float converts to a double exactly

    def add(self, values: Sequence[Any]) -> None:
        kinds = {type(v) for v in values if v is not None}
        self.kinds |= kinds
        if int in kinds:
            ints = [v for v in values if type(v) is int]
            self.int64 = self.int64 and all(INT64[0] <= v <= INT64[1] for v in ints)
            self.double = self.double and all(_double(v) for v in ints)

    def flat_type(self, pa: Any) -> pa.DataType | None:
        kinds = self.kinds
        if not kinds:
            return pa.null()
        if kinds == {str}:
            return pa.string()
        if kinds == {bool}:
            return pa.bool_()
        if kinds == {int} and self.int64:
            return pa.int64()
        if kinds in ({float}, {int, float}) and self.double:
            return pa.float64()
        return None
