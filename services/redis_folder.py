"""The Redis server already serving a folder, seen from outside it: the folder's lock record, whether the server
that answers is the process that record names, and stopping it.

Why a module of its own, without a Redis client library: the runs folder's keeper
(``services/redis_keeper.py``, a process of its own beside every local run) needs only these, once every two
seconds, and importing redis-py cost it a quarter of a CPU second a run. What it asks the server (``AUTH`` and ``INFO
server`` over a bare socket) is :mod:`punchline.schedulers.server.server_info`, where the engine's Redis conversations
are. The embedded server (``services/redis_server.py``) writes the record and uses these to find and stop a running
server too.

The record (``redis.lock``, JSON) is written by the server's starter while it holds the file's lock; a server
counts as running only while someone holds that lock *and* the server at the recorded URL reports the recorded
process id and run id (a port is reused by other servers within minutes on a busy machine).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import time
from pathlib import Path
from urllib.parse import quote

from punchline.data.errors import LedgerUnavailable
from punchline.data.redaction import REDACTED
from punchline.schedulers.server.server_info import server_info
from punchline.services.private_files import open_private, read_password, read_private

LOCK_FILE = "redis.lock"  # the server's record, locked while its starter lives
PASSWORD_FILE = "password"  # the server's password (0600), beside the record


def embedded_identity(folder: Path) -> str:
    """The identity of a runs folder's own ledger (``folder``: its ``_ledger``): no password, no port."""
    return f"embedded ledger {folder} on {socket.gethostname()}"


def _recorded(folder: Path) -> dict[str, object] | None:
    """The folder's record as its server's starter wrote it (held or not), None when there is none."""
    try:
        record = json.loads(read_private(folder / LOCK_FILE) or "")
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def lock_record(folder: Path) -> dict[str, object] | None:
    """The lock file's record if a live process holds the folder's lock, else None."""
    lock_path = folder / LOCK_FILE
    try:
        fd = open_private(lock_path, os.O_RDONLY)
    except (OSError, LedgerUnavailable):
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None  # nobody holds it: no server
    except BlockingIOError:
        pass
    finally:
        os.close(fd)
    return _recorded(folder)


def recorded_pid(folder: Path) -> int:
    """The process id the folder's record names (held or not), 0 when there is none."""
    record = _recorded(folder)
    try:
        return int(str(record["pid"])) if record is not None else 0
    except (ValueError, KeyError):
        return 0


def serves_dir(url: str, data_dir: str | os.PathLike[str], *, timeout_s: float = 2.0) -> bool:
    """Whether the Redis at ``url`` answers and is the server recorded in ``data_dir``'s lock file
    (same process id and server run id).

    Use before reusing a server recorded by an earlier (killed) driver: the port may since have
    been taken by another run's server, which must not be mistaken for ours.
    """
    record = _recorded(Path(data_dir))
    info = server_info(url, timeout_s=timeout_s) if record is not None else None
    if info is None or record is None:
        return False
    with contextlib.suppress(ValueError, TypeError):
        return info.get("run_id", "") == str(record.get("server_id")) and int(info.get("process_id", "-1")) == int(
            str(record.get("pid", -2))
        )
    return False


def find_running(data_dir: str | os.PathLike[str]) -> str | None:
    """The URL (with password) of a live server already serving ``data_dir`` (e.g. left by a
    killed driver), else None. Reuse it instead of starting a second server on the same files."""
    folder = Path(data_dir).resolve()
    record = lock_record(folder)
    password = read_password(folder / PASSWORD_FILE)
    if record is None or password is None:
        return None
    public = str(record.get("url", ""))
    url = public.replace(f":{REDACTED}@", f":{quote(password, safe='')}@", 1)
    return url if serves_dir(url, folder) else None


def stop_running(data_dir: str | os.PathLike[str], timeout_s: float = 15.0) -> bool:
    """Stop the server serving ``data_dir`` (started by any process): SIGTERM once its identity
    is checked, then wait for the folder's lock to be released. False if none was running."""
    folder = Path(data_dir).resolve()
    url = find_running(folder)
    record = lock_record(folder)
    if url is None or record is None:
        return False
    with contextlib.suppress(ProcessLookupError, TypeError, ValueError):
        os.kill(int(str(record["pid"])), signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while lock_record(folder) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    return True
