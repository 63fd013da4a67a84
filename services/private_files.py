"""The files and folders of a folder the engine keeps on a shared machine (the embedded ledger's, the local Ray
head's): mode 0600 / 0700 from the start, never through a symbolic link, never a file or folder another user
owns. One place spells these checks for every such folder (:mod:`~punchline.services.redis_server`,
:mod:`~punchline.services.local_redis`, :mod:`~punchline.services.local_ray`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from punchline.data.errors import LedgerUnavailable


def open_private(path: Path, flags: int) -> int:
    """An fd of ``path`` (a file in a ledger folder), opened without following a symlink and only if
    this user owns it: a link or a file planted there by someone else must never make us write (or
    trust) another file. Raises LedgerUnavailable naming the file otherwise."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LedgerUnavailable(f"{path} is a symbolic link; remove it (the ledger never follows links)") from None
        raise
    st = os.fstat(fd)
    if st.st_uid != os.getuid() or not stat.S_ISREG(st.st_mode):
        os.close(fd)
        what = "not a regular file" if not stat.S_ISREG(st.st_mode) else f"owned by uid {st.st_uid}, not by us"
        raise LedgerUnavailable(f"{path} is {what}; remove it")
    return fd


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600 from the first byte (never readable by others), never
    through a symlink and never into a file someone else owns (checked before truncating)."""
    fd = open_private(path, os.O_WRONLY | os.O_CREAT)
    with os.fdopen(fd, "w") as fh:
        fh.truncate(0)
        fh.write(text)
        os.fchmod(fh.fileno(), 0o600)


def read_private(path: Path) -> str | None:
    """The text of a ledger-folder file (no symlink, ours), or None when it is missing or unreadable."""
    try:
        fd = open_private(path, os.O_RDONLY)
    except (OSError, LedgerUnavailable):
        return None
    with os.fdopen(fd) as fh:
        return fh.read()


def private_dir(path: Path) -> None:
    """A 0700 folder of ours: a symlink or someone else's folder in its place is refused."""
    path.mkdir(parents=True, exist_ok=True)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise LedgerUnavailable(f"{path} is not a folder of ours (a symbolic link or another user's); remove it")
    os.chmod(path, 0o700)


# the folders of a ledger's folder the server or the drivers write in (the AOF's, the drivers' registrations)
_SUBFOLDERS = ("appendonlydir", "clients")


def check_folder_files(folder: Path) -> None:
    """Refuse (LedgerUnavailable, naming the entry) a symbolic link, another user's entry or a special file
    (a pipe, a device) anywhere in a ledger's folder: its files, its ``appendonlydir`` (the AOF) and
    ``clients``. A dangling link counts: the server would create its target."""
    for path in _entries(folder):
        try:
            st = os.lstat(path)
        except FileNotFoundError:  # gone since the listing (a rewrite's temp file renamed or removed)
            continue
        if stat.S_ISLNK(st.st_mode):
            raise LedgerUnavailable(f"{path} is a symbolic link; remove it (the ledger never follows links)")
        if st.st_uid != os.getuid():
            raise LedgerUnavailable(f"{path} is owned by uid {st.st_uid}, not by us; remove it")
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode) or stat.S_ISSOCK(st.st_mode)):
            raise LedgerUnavailable(f"{path} is a special file (a pipe or a device); remove it")


def _entries(folder: Path) -> list[Path]:
    """The entries of a ledger's folder and of its subfolders (one level: the server makes no deeper ones)."""
    try:
        top = sorted(folder.iterdir())
    except FileNotFoundError:
        return []
    out = list(top)
    for sub in _SUBFOLDERS:
        path = folder / sub
        if path in top and not path.is_symlink() and path.is_dir():
            with contextlib.suppress(FileNotFoundError):  # removed since the listing
                out += sorted(path.iterdir())
    return out


def read_password(path: str | os.PathLike[str]) -> str | None:
    text = read_private(Path(path))
    return (text.strip() or None) if text is not None else None
