"""Reading and writing the project's JSON files.

Every artifact is written as upstream wrote it (``json.dump(obj, f, indent=2)``) so files stay
byte-comparable with the published ones, and always via temp file + rename so that a crash or a
validation error never leaves a half-written file at the destination.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from punchline.data.errors import InputError

T = TypeVar("T")

_PATH_RE = re.compile(r"at `\$(?P<path>[^`]*)`")


def _split_path(path: str) -> tuple[str | None, str | None]:
    """Turn msgspec's ``$[3].straight[0]`` / ``$["12"].models`` into (record, field)."""
    parts = re.findall(r"\[([^\]]+)\]|\.([A-Za-z_][A-Za-z0-9_]*)", path)
    tokens = [a or b for a, b in parts]
    if not tokens:
        return None, None
    record = tokens[0].strip('"')
    fields = [t.strip('"') for t in tokens[1:]]
    return record, ".".join(fields) if fields else None


def validation_location(exc: msgspec.ValidationError) -> tuple[str | None, str | None, str]:
    """(record, field, detail) of a msgspec validation error, for messages that name where it is."""
    message = str(exc)
    match = _PATH_RE.search(message)
    record, field = _split_path(match.group("path")) if match else (None, None)
    return record, field, _PATH_RE.sub("", message).strip().rstrip("-").strip()


def decode_file(path: str | os.PathLike[str], type_: type[T] | Any) -> T:
    """Decode a JSON file into ``type_``; every failure names the file, record and field."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise InputError("file not found", file=str(p)) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", file=str(p)) from None
    return decode_bytes(raw, type_, source=str(p))


def decode_bytes(raw: bytes, type_: type[T] | Any, *, source: str) -> T:
    try:
        return msgspec.json.decode(raw, type=type_)
    except msgspec.ValidationError as exc:
        record, field, detail = validation_location(exc)
        raise InputError(detail, file=source, record=record, field=field) from None
    except msgspec.DecodeError as exc:
        raise InputError(f"malformed JSON: {exc}", file=source) from None


def dumps_upstream(obj: Any) -> str:
    """The exact text upstream's ``json.dump(obj, f, indent=2)`` produces."""
    return json.dumps(msgspec.to_builtins(obj), indent=2)


def upstream_object_chunks(items: Iterable[tuple[str, Any]]) -> Iterator[bytes]:
    """``dumps_upstream(dict(items)).encode()`` in pieces, one member at a time, so a large artifact is
    never held as Python objects and text at once. The bytes are identical (the store tests check)."""
    first = True
    for key, value in items:
        body = json.dumps(msgspec.to_builtins(value), indent=2).replace("\n", "\n  ")
        yield (("{\n  " if first else ",\n  ") + json.dumps(key) + ": " + body).encode("utf-8")
        first = False
    yield b"{}" if first else b"\n}"


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write via a temp file in the same folder and rename: readers see old or new, never half."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_upstream_json(path: str | os.PathLike[str], obj: Any) -> None:
    atomic_write_bytes(path, dumps_upstream(obj).encode("utf-8"))
