"""The checkpoint store on a local (or shared POSIX) folder.

Writes go to a temp file under ``<root>/.tmp/``, are fsynced, then moved into place, so readers see
the old bytes or the new bytes, never half. ``if_absent`` uses ``link(2)``: creating a hard link
fails with EEXIST if the name exists, atomically, across threads and processes (and on NFSv3+),
which is exactly the "first committer wins" primitive the ledger needs. ``rename(2)`` cannot be
used for that because it silently replaces the target.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import secrets
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from punchline.data.errors import InputError, StoreError
from punchline.data.store import Store

TMP_DIR = ".tmp"
READ_PIECE = 1 << 20  # bytes a streamed read (get_chunks) holds at once


def validate_key(key: str) -> str:
    """Keys are relative ``/``-separated paths without ``.``/``..``/empty segments.

    The same rule holds for every backend so a run can move between a folder and S3. A bad key is
    a bug or bad input (never retried), hence ``InputError`` rather than ``StoreError``.
    """
    if not isinstance(key, str) or not key:
        raise InputError("store key must be a non-empty string", field="key", record=repr(key))
    if key.startswith("/") or key.endswith("/"):
        raise InputError("store key must be relative and name a file", field="key", record=key)
    if "\\" in key or "\x00" in key or any(ord(c) < 32 for c in key):
        raise InputError("store key has a backslash or control character", field="key", record=key)
    parts = key.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise InputError("store key has an empty, '.' or '..' segment", field="key", record=key)
    if parts[0] == TMP_DIR:
        raise InputError(f"store keys under {TMP_DIR}/ are reserved", field="key", record=key)
    return key


def validate_prefix(prefix: str) -> str:
    """A prefix is empty or a key-like string (may end in ``/``)."""
    if prefix == "":
        return prefix
    validate_key(prefix[:-1] if prefix.endswith("/") else prefix)
    return prefix


def _write_all(fd: int, chunks: Iterable[bytes]) -> None:
    """Every byte of ``chunks`` (small chunks are gathered, so a streamed artifact is not a syscall a line)."""
    pending = bytearray()
    for chunk in chunks:
        if not pending and len(chunk) >= 1 << 16:
            _drain(fd, chunk)
            continue
        pending += chunk
        if len(pending) >= 1 << 20:
            _drain(fd, pending)
            pending = bytearray()
    if pending:
        _drain(fd, pending)


def _drain(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalStore(Store):
    """Keys map to files under ``root``; ``root`` is created on first use."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).absolute()
        self.url = str(self.root)
        self._tmp_dir = self.root / TMP_DIR
        self._made: set[Path] = set()  # folders this process made or found (a write skips mkdir for them)
        self._nonce = secrets.token_hex(4)
        self._seq = itertools.count()

    def __repr__(self) -> str:
        return f"LocalStore({self.url!r})"

    def __reduce__(self) -> tuple[type[LocalStore], tuple[str]]:
        return (LocalStore, (self.url,))

    def _path(self, key: str) -> Path:
        return self.root / validate_key(key)

    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> bool:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InputError("store values are bytes", field="data", record=key)
        return self._write(key, [data], if_absent=if_absent)

    def put_chunks(self, key: str, chunks: Iterable[bytes]) -> None:
        self._write(key, chunks, if_absent=False)

    def _write(self, key: str, chunks: Iterable[bytes], *, if_absent: bool) -> bool:
        """Write into a synced temp file, then link it (``if_absent``: fails if the key exists) or rename it
        into place, and sync the folder: readers see old or new, never half, even after a crash."""
        final = self._path(key)
        try:
            tmp, fd = self._temp_file(final.parent)
        except OSError as exc:
            raise StoreError(f"{self.url}: cannot prepare write of {key!r}: {exc}") from exc
        try:
            try:
                _write_all(fd, chunks)
                os.fsync(fd)
            finally:
                os.close(fd)
            if if_absent:
                try:
                    os.link(tmp, final)
                except FileExistsError:
                    return False
            else:
                os.replace(tmp, final)
            _fsync_dir(final.parent)
            return True
        except OSError as exc:
            if exc.errno in (errno.EISDIR, errno.ENOTDIR):
                raise StoreError(f"{self.url}: key {key!r} collides with a folder of keys") from exc
            raise StoreError(f"{self.url}: cannot write {key!r}: {exc}") from exc
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def _temp_file(self, parent: Path) -> tuple[str, int]:
        """A new temp file (and the key's folder). Folders known to exist are not made again, and names
        come from a counter rather than ``tempfile``: a response-cache write is on every unit's path, and
        these syscalls were a third of its cost. A folder removed behind our back is made again."""
        for attempt in (0, 1):
            if attempt or parent not in self._made:
                self._tmp_dir.mkdir(parents=True, exist_ok=True)
                parent.mkdir(parents=True, exist_ok=True)
                self._made.add(parent)
            name = f"{self._tmp_dir}/{os.getpid()}.{self._nonce}.{next(self._seq)}.tmp"
            try:
                return name, os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            except FileNotFoundError:
                if attempt:
                    raise
                self._made.clear()
        raise AssertionError("unreachable")

    def get(self, key: str) -> bytes | None:
        path = self._path(key)
        try:
            return path.read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
        except OSError as exc:
            raise StoreError(f"{self.url}: cannot read {key!r}: {exc}") from exc

    def get_chunks(self, key: str) -> Iterator[bytes] | None:
        path = self._path(key)
        try:
            f = path.open("rb")
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
        except OSError as exc:
            raise StoreError(f"{self.url}: cannot read {key!r}: {exc}") from exc
        return self._pieces(key, f)

    def _pieces(self, key: str, f: BinaryIO) -> Iterator[bytes]:
        with f:
            while True:
                try:
                    piece = f.read(READ_PIECE)
                except OSError as exc:
                    raise StoreError(f"{self.url}: cannot read {key!r}: {exc}") from exc
                if not piece:
                    return
                yield piece

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str = "") -> Iterator[str]:
        """Keys starting with ``prefix`` (plain string prefix, like S3), sorted."""
        validate_prefix(prefix)
        # Only walk the deepest folder the prefix fully names.
        folder = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        base = self.root / folder if folder else self.root
        keys: list[str] = []
        try:
            for dirpath, dirnames, filenames in os.walk(base):
                rel_dir = os.path.relpath(dirpath, self.root)
                if rel_dir == ".":
                    dirnames[:] = [d for d in dirnames if d != TMP_DIR]
                    rel_dir = ""
                for name in filenames:
                    key = f"{rel_dir}/{name}" if rel_dir else name
                    if key.startswith(prefix):
                        keys.append(key)
        except OSError as exc:
            raise StoreError(f"{self.url}: cannot list {prefix!r}: {exc}") from exc
        keys.sort()
        return iter(keys)

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink()
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as exc:
            raise StoreError(f"{self.url}: cannot delete {key!r}: {exc}") from exc
        with contextlib.suppress(OSError):
            _fsync_dir(path.parent)
