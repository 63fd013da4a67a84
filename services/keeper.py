"""A runs folder's kept processes, and the one keeper that stops them: shared by the embedded Redis server
(``services/local_redis.py``, kept by ``services/redis_keeper.py``) and the local Ray head
(``services/local_ray.py``, kept by ``services/ray_keeper.py``).

Each is one process per folder, started by the first driver that needs it and used by every driver of the
folder; it must outlive a ``kill -9`` of its driver (other drivers use it), yet not run forever once nobody
does, nor once its keeper is gone. So the pieces, the same for both:

* the folder's two locks (:func:`folder_lock`): ``join.lock`` orders joining, starting and stopping;
  ``keeper.lock`` is held by the folder's one keeper (:func:`is_kept`);
* every driver registers in ``clients/`` (:class:`ClientFile`) and touches its file while it runs; a
  registration counts while its process exists and its file is fresh (:func:`live_clients`);
* the driver that needs the process starts a keeper (:func:`spawn_starter`, ``python -m <module> DIR --start ...``)
  that starts the kept process as its own child and says so (:func:`say`); the child gets the parent-death signal
  before ``exec`` (:func:`die_with_parent`), so it ends with its keeper however the keeper ends, and a ``kill -9``
  of the keeper and every driver leaves nothing;
* the keeper's loop (:func:`watch`) stops the kept process once it has been unused for the linger, and exits when
  it is gone;
* the keeper knows its process by identity, pid and start time (:func:`same_process`), never by pid alone
  (reused within minutes on a busy machine) nor by path (a runs folder may be moved); it holds the folder
  open (:class:`FolderHold`), so it follows a moved folder and stops its process when the folder is deleted.

What differs between the two (how to find the process, whether it is in use, how to stop it) is a :class:`Kept`.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import secrets
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Protocol

from punchline.data.errors import LedgerUnavailable
from punchline.data.settings import LEDGER_STALE_S
from punchline.services.private_files import check_folder_files, open_private, read_private, write_private

JOIN_TIMEOUT_S = 60.0
START_FLAG = "--start"  # a keeper that starts the kept process as its child (spawn_starter)
READY, FAILED = "ready", "failed"  # what a starting keeper says to its driver (say)
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent ends


@contextlib.contextmanager
def folder_lock(path: Path, *, timeout_s: float = JOIN_TIMEOUT_S, blocking: bool = True) -> Iterator[bool]:
    """Hold an exclusive flock on ``path``; yields False (not holding it) when ``blocking`` is off
    and someone else has it."""
    fd = open_private(path, os.O_RDWR | os.O_CREAT)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not blocking:
                    yield False
                    return
                if time.monotonic() > deadline:
                    raise LedgerUnavailable(f"{path} stayed locked for {timeout_s:.0f} s") from None
                time.sleep(0.05)
        yield True
    finally:
        os.close(fd)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stat_fields(pid: int) -> list[str]:
    """``/proc/<pid>/stat`` from field 3 (the state) on: after the command name, which may hold spaces. [] if no
    such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return []
    return stat.rsplit(")", 1)[1].split()


def cmdline(pid: int) -> list[str]:
    """``pid``'s command line as it shows it (a process may retitle itself), [] if no such process."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def start_ticks(pid: int) -> int:
    """When ``pid`` started (clock ticks after boot: ``/proc/<pid>/stat`` field 22), 0 if no such process. With
    the pid it names one process for the machine's uptime; a pid alone is reused within minutes on a busy
    machine, and a path (a working folder) changes when the runs folder is moved."""
    fields = stat_fields(pid)
    return int(fields[19]) if len(fields) > 19 and fields[0] != "Z" else 0


def same_process(pid: int, ticks: int) -> bool:
    """Whether ``pid`` is still the process that started at ``ticks`` (never one that reused the pid)."""
    return pid > 0 and ticks > 0 and start_ticks(pid) == ticks


class FolderHold:
    """A keeper's hold on its folder: an open directory, so the keeper finds the folder where it is now (moved or
    renamed under it: ``path`` follows it) and sees it deleted (``deleted``), whatever path it was started with."""

    def __init__(self, folder: Path) -> None:
        self.fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)

    @property
    def path(self) -> Path:
        return Path(f"/proc/self/fd/{self.fd}")  # the kernel resolves it to the directory itself, wherever it is

    @property
    def real_path(self) -> Path:
        """Where the folder is now, as a path any process can use (:attr:`path` is this process's alone)."""
        return Path(os.readlink(self.path))

    @property
    def deleted(self) -> bool:
        return os.fstat(self.fd).st_nlink == 0

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


class ClientFile:
    """One driver's registration in a folder's ``clients/``: written on joining, touched while the driver runs
    (:meth:`beat`), removed when it leaves. A keeper prunes one whose driver is gone or silent."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.path: Path | None = None

    @property
    def registered(self) -> bool:
        return self.path is not None

    def write(self) -> None:
        """(Re)write the registration (call under ``join.lock``): a keeper may have pruned it while we were paused."""
        if self.path is None:
            self.path = self.folder / "clients" / f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}.json"
        record = {"host": socket.gethostname(), "pid": os.getpid(), "at": time.time()}
        write_private(self.path, json.dumps(record))

    def beat(self) -> None:
        """Keep the registration fresh; write it again (under ``join.lock``) if a keeper pruned it meanwhile."""
        if self.path is None:
            return
        if not self.path.exists():
            with folder_lock(self.folder / "join.lock"):
                self.write()
        else:
            os.utime(self.path, follow_symlinks=False)

    def remove(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)
            self.path = None


def live_clients(folder: Path, *, prune: bool = True) -> list[Path]:
    """Registrations of drivers that are still alive; stale ones are removed when ``prune``."""
    host = socket.gethostname()
    now = time.time()
    alive: list[Path] = []
    for path in sorted((folder / "clients").glob("*.json")):
        try:
            record = json.loads(read_private(path) or "")
            age = now - path.lstat().st_mtime
        except (OSError, ValueError):
            continue
        fresh = age < LEDGER_STALE_S.get()  # a registration untouched this long is a dead (or frozen) driver
        if isinstance(record, dict) and record.get("host") == host:
            fresh = fresh and pid_alive(int(record.get("pid", 0)))
        if fresh:
            alive.append(path)
        elif prune:
            path.unlink(missing_ok=True)
    return alive


def is_kept(folder: Path) -> bool:
    """Whether a keeper holds ``folder``'s ``keeper.lock`` (found by taking it for an instant when free)."""
    with folder_lock(folder / "keeper.lock", blocking=False) as free:
        return not free


def open_keeper(folder: Path, *, wait_s: float = 0.0) -> tuple[FolderHold, int] | None:
    """A keeper's start: hold the folder open and take its ``keeper.lock``. None when the folder is gone (or not
    ours); an fd of -1 when another keeper still watches the folder after ``wait_s`` (the caller closes the hold and
    ends, saying why). A keeper that is to start the kept process waits: the last keeper, whose process just ended,
    lets go of the lock within its poll."""
    try:
        hold = FolderHold(folder)
    except OSError:
        return None
    try:
        fd = open_private(hold.path / "keeper.lock", os.O_RDWR | os.O_CREAT)
    except (OSError, LedgerUnavailable):
        hold.close()
        return None
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return hold, fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return hold, -1
            time.sleep(0.05)


def take_folder(folder: Path, what: str, *, wait_s: float) -> tuple[FolderHold, int] | None:
    """A starting keeper's :func:`open_keeper`, its failures said to the driver waiting for it (:func:`say`): the
    folder gone (or an entry in it not ours: named by the folder's check), or kept by another keeper still. None
    then; else the hold and the fd that holds ``keeper.lock``. ``what``: the folder's name in the line."""
    opened = open_keeper(folder, wait_s=wait_s)
    if opened is None:
        try:
            check_folder_files(folder)
            say(f"{FAILED} {what} {folder} is gone")
        except LedgerUnavailable as exc:
            say(f"{FAILED} {exc}")
        return None
    hold, fd = opened
    if fd < 0:
        hold.close()
        say(f"{FAILED} {folder} is kept by another keeper still (its keeper.lock is held)")
        return None
    return hold, fd


def spawn_starter(module: str, folder: Path, settings: Sequence[str], *, timeout_s: float) -> None:
    """Start a keeper that starts the kept process itself (``python -m module FOLDER --start *settings``), so that
    the kept process is the keeper's child and ends with it (its parent-death signal, set before ``exec``): a
    ``kill -9`` of the keeper and of every driver leaves nothing running. Returns once the keeper says the process
    is up (:func:`say`); raises LedgerUnavailable with the keeper's reason, or when it said nothing in
    ``timeout_s`` (then it is killed, and what it started with it)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", module, str(folder), START_FLAG, *settings],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # not killed with the driver, its terminal or its process group
        close_fds=True,
    )
    assert proc.stdout is not None
    try:
        ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
        line = proc.stdout.readline().decode(errors="replace").strip() if ready else ""
    finally:
        proc.stdout.close()
    if line == READY:
        return
    if not ready:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        raise LedgerUnavailable(f"the keeper of {folder} said nothing within {timeout_s:.0f} s")
    proc.wait()  # it ends after saying why (or it died): no zombie left behind
    raise LedgerUnavailable(line.removeprefix(FAILED).strip() or f"the keeper of {folder} ended ({proc.returncode})")


def say(line: str) -> None:
    """A starting keeper's one line to the driver that spawned it (:func:`spawn_starter`): ``READY``, or
    ``FAILED`` and why. Its stdout is then /dev/null: the driver stops reading, and a later write cannot block."""
    with contextlib.suppress(OSError):
        os.write(1, (" ".join(line.split()) + "\n").encode())
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.close(null)


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A ``preexec_fn`` for a kept process: the kernel sends it ``sig`` when the process that started it (its
    keeper) ends, however it ends (``PR_SET_PDEATHSIG``, kept across ``exec``). If the keeper is gone already
    (killed between ``fork`` and this call), the child ends at once. Linux only; a keeper is single-threaded, as a
    ``preexec_fn`` needs."""
    parent = os.getpid()
    libc = ctypes.CDLL(None, use_errno=True)

    def preexec() -> None:
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0 or os.getppid() != parent:
            os._exit(1)

    return preexec


class Kept(Protocol):
    """What one kind of kept process tells the keeper's loop (:func:`watch`); ``folder`` is where the folder is now."""

    def running(self, folder: Path) -> int | None:
        """The kept process's pid while it runs (0: running, pid unknown), None once it is gone."""

    def in_use(self, folder: Path, pid: int) -> bool:
        """Whether anyone still needs it (asked under ``join.lock``, once a poll)."""

    def retire(self, folder: Path) -> None:
        """Unused past the linger (under ``join.lock``): stop it, or at least make the next driver start another."""

    def stop(self, pid: int) -> None:
        """After :meth:`retire`, with both locks let go: stop what is left of it (may take a while)."""

    def ended(self, folder: Path) -> None:
        """It ended on its own (its folder still there): clear up what it left."""

    def stop_orphan(self, pid: int) -> None:
        """Its folder was deleted under it and ``pid`` is still that process (checked): stop it."""


def watch(hold: FolderHold, fd: int, kept: Kept, *, linger_s: float, poll_s: float, pid: int, ticks: int) -> int:
    """The keeper's loop, holding the folder (``hold``) and its ``keeper.lock`` (``fd``; both closed on return):
    retire the kept process once it has been unused for ``linger_s``; exit when it is gone. A process found running
    later (restarted) is followed. The folder is held open (:class:`FolderHold`), so a moved runs folder is still
    kept, as if it had not moved, and a deleted one has its process stopped at once."""
    here = hold.path
    try:
        idle_since: float | None = None
        while True:
            now_pid = None if hold.deleted else kept.running(here)
            if now_pid is None:
                if hold.deleted:
                    _stop_orphan(kept, pid, ticks)
                else:
                    kept.ended(here)
                return 0
            if now_pid and now_pid != pid:
                pid, ticks = now_pid, start_ticks(now_pid)
            retired = False
            with contextlib.suppress(OSError), folder_lock(here / "join.lock", blocking=False) as free:  # rm -rf
                if free:
                    now = time.monotonic()
                    idle_since = None if kept.in_use(here, pid) else (idle_since or now)
                    if idle_since is not None and now - idle_since >= linger_s:
                        kept.retire(here)
                        # let go of keeper.lock before join.lock: the next driver to join starts a new process
                        # and must find no keeper, so that it starts one
                        os.close(fd)
                        fd = -1
                        retired = True
            if retired:
                kept.stop(pid)
                return 0
            time.sleep(poll_s)
    finally:
        if fd >= 0:
            os.close(fd)
        hold.close()


def _stop_orphan(kept: Kept, pid: int, ticks: int) -> None:
    if same_process(pid, ticks):
        kept.stop_orphan(pid)
