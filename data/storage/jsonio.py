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


def decode_bytes(raw: bytes, type_: type[T] | Any, *, source: str, record: str | int | None = None) -> T:
    """Decode JSON into ``type_``; a failure names the file, record and field. A key repeated in
    one object is an error: JSON parsers silently keep the last one, hiding a broken merge or edit."""
    try:
        value = msgspec.json.decode(raw, type=type_)
    except msgspec.ValidationError as exc:
        where, field, detail = validation_location(exc)
        if record is not None:  # the caller's record is the outer one: msgspec's path is inside it
            field = ".".join(k for k in (where, field) if k) or None
        raise InputError(detail, file=source, record=where if record is None else record, field=field) from None
    except msgspec.DecodeError as exc:
        raise InputError(f"malformed JSON: {exc}", file=source, record=record) from None
    reject_duplicate_keys(raw, source=source, record=record)
    return value


class _Duplicate(Exception):
    pass


class _Pairs(list[Any]):
    """An object's (key, value) pairs in file order (so repeated keys survive parsing)."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> None:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _Duplicate(key)
        seen.add(key)


def _find_duplicate(node: Any, path: list[str]) -> tuple[list[str], str] | None:
    if isinstance(node, _Pairs):
        seen: set[str] = set()
        for key, _ in node:
            if key in seen:
                return path, key
            seen.add(key)
        for key, value in node:
            found = _find_duplicate(value, [*path, key])
            if found:
                return found
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found = _find_duplicate(value, [*path, str(i)])
            if found:
                return found
    return None


def reject_duplicate_keys(raw: bytes | str, *, source: str, record: str | int | None = None) -> None:
    """InputError naming the record and the repeated key if any JSON object in ``raw`` repeats a key."""
    try:
        json.loads(raw, object_pairs_hook=_no_duplicates)
        return
    except _Duplicate:
        pass
    except ValueError:
        return  # not for us to judge: the decoder above already accepted or refused it
    found = _find_duplicate(json.loads(raw, object_pairs_hook=_Pairs), [])
    if found is None:
        return
    path, key = found
    if record is None and path:
        record, path = path[0], path[1:]
    raise InputError(
        f"key {key!r} appears twice in one object", file=source, record=record, field=".".join([*path, key])
    )


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


NOT_REGULAR = "is not a regular file (a device, a pipe, a socket); give a file path"


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write via a temp file in the same folder and rename: readers see old or new, never half."""
    p = Path(path)
    if p.exists() and not p.is_file():  # never replace a device, a pipe or a socket with a regular file
        raise InputError(NOT_REGULAR, file=str(p))
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


def overwrite_in_place(path: str | os.PathLike[str], data: bytes) -> None:
    """Rewrite an existing file in its own blocks (no temp copy): the last resort on a full disk, where
    :func:`atomic_write_bytes` has no room. Not atomic; used only for a small record that must say how
    a run ended."""
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
    try:
        os.write(fd, data)
        os.ftruncate(fd, len(data))
        os.fsync(fd)
    finally:
        os.close(fd)


def write_upstream_json(path: str | os.PathLike[str], obj: Any) -> None:
    atomic_write_bytes(path, dumps_upstream(obj).encode("utf-8"))


def _nearest_existing(p: Path) -> Path:
    for candidate in [p, *p.parents]:
        if candidate.exists():
            return candidate
    return Path(".")


def check_out_file(path: str | os.PathLike[str], *, flag: str = "--out") -> Path:
    """An output file we will be able to write: not a folder, no file standing where a folder must
    be, a writable folder. Checked before any work, so a bad ``--out`` costs nothing."""
    p = Path(path)
    if not str(path).strip():
        raise InputError("is empty", field=flag)
    if p.is_dir():
        raise InputError("is a directory; give a file path", file=str(p), field=flag)
    if p.exists() and not p.is_file():
        raise InputError(NOT_REGULAR, file=str(p), field=flag)
    _check_writable_parent(p.parent, p, flag)
    return p


def check_out_dir(path: str | os.PathLike[str], *, flag: str = "--out") -> Path:
    """An output folder we will be able to create or write into."""
    p = Path(path)
    if not str(path).strip():
        raise InputError("is empty", field=flag)
    if p.exists() and not p.is_dir():
        raise InputError("is a file; give a folder", file=str(p), field=flag)
    _check_writable_parent(p, p, flag)
    return p


def _check_writable_parent(folder: Path, target: Path, flag: str) -> None:
    existing = _nearest_existing(folder)
    if not existing.is_dir():
        raise InputError(f"{existing} is a file, so no folder can be made there", file=str(target), field=flag)
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InputError(f"folder {existing} is not writable", file=str(target), field=flag)
