"""The runs folder's own ledger: one embedded Redis shared by every driver that uses the folder.

Why shared: the ledger is what stops two runs from paying for one request twice (the request lease
``pl:req:<key>`` is global). Two drivers with a Redis each would each grant the lease, and both
would call. So the embedded server belongs to the runs folder (``runs/_ledger/``), not to a run:

* the first driver that needs it starts it (under ``join.lock``, so two drivers starting at the
  same moment start one server, not two);
* every driver registers itself in ``runs/_ledger/clients/`` (a file per driver, touched every
  ``HEARTBEAT_S``) and finds the running server through its lock record;
* a driver that leaves removes its file and stops the server if no live driver is left;
* a detached keeper process (``python -m punchline.cluster.local_ledger DIR``) stops the server
  once no live driver has been registered for a while, so a driver killed with ``kill -9`` does
  not keep it alive forever. A driver is live while its process exists and its heartbeat is fresh
  (the heartbeat also guards against a reused pid).

Stopping is a clean SIGTERM: the AOF (``appendfsync always``) keeps everything acknowledged, and the
next driver starts the server again on the same folder.

Every member watches the server (``WATCH_S``): when it is gone while drivers still use it (killed,
crashed, or stopped by the keeper while this driver was paused past ``PUNCHLINE_LEDGER_STALE_S``) the driver registers
again and restarts it from its AOF on the same port, so the URLs workers hold stay valid and the run
carries on within seconds. What a restart cannot cure (a full disk, a server that dies again at once)
stops the run instead, and so does a disk that is about to be full (less than ``LOW_SPACE_BYTES``
free beside the AOF; the default store shares that disk), before a write is lost: the watcher
records the reason and raises :class:`LedgerFailed` in the driver's main thread (through
``SIGUSR2``), one line instead of minutes of "connection refused".
The watcher also starts a keeper again when the keeper itself was killed, so the server is never
left without one, and it checks the folder's entries as the server's start does (``check_folder_files``): a
link planted where the server will open a file by name (the next AOF file of a rewrite) stops the server and the
run, one line naming it, before anything is written through it.

Every file of the folder is opened without following symbolic links and only if this user owns it
(``private_files.open_private``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import structlog

from punchline.cluster.private_files import check_folder_files, open_private, private_dir, read_private, write_private
from punchline.cluster.redis_server import EmbeddedRedis
from punchline.data.errors import LedgerFailed, LedgerUnavailable
from punchline.data.settings import LEDGER_STALE_S
from punchline.schedulers.redis_client import redact_url

log = structlog.get_logger("punchline.ledger")

LEDGER_DIR = "_ledger"
HEARTBEAT_S = 5.0
KEEPER_POLL_S = 2.0
KEEPER_GRACE_POLLS = 3  # consecutive polls without a live driver before the keeper stops the server
JOIN_TIMEOUT_S = 60.0
WATCH_S = 0.5  # how often a member checks that the server is still there
LOW_SPACE_BYTES = 256 * 1024  # less free than this beside the AOF: the disk is full, a restart would die again
MAX_RESTARTS = 5  # restarts within RESTART_WINDOW_S before the server counts as dying for good
RESTART_WINDOW_S = 60.0
FAILURE_SIGNAL = signal.SIGUSR2


def ledger_dir(runs_dir: str | os.PathLike[str]) -> Path:
    return Path(runs_dir).resolve() / LEDGER_DIR


@contextlib.contextmanager
def _flock(path: Path, *, timeout_s: float = JOIN_TIMEOUT_S, blocking: bool = True) -> Iterator[bool]:
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


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def start_ticks(pid: int) -> int:
    """When ``pid`` started (clock ticks after boot: ``/proc/<pid>/stat`` field 22), 0 if no such process. With
    the pid it names one process for the machine's uptime; a pid alone is reused within minutes on a busy
    machine, and a path (a working folder) changes when the runs folder is moved."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces; fields[0] is field 3
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
    def deleted(self) -> bool:
        return os.fstat(self.fd).st_nlink == 0

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


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
            fresh = fresh and _pid_alive(int(record.get("pid", 0)))
        if fresh:
            alive.append(path)
        elif prune:
            path.unlink(missing_ok=True)
    return alive


class LocalLedger:
    """One driver's membership of the runs folder's ledger (a context manager).

    ``url`` carries the password and stays in this process; ``public_url`` (``***``) and
    ``password_file`` are what is recorded and handed to workers. ``failure`` is set (and
    :class:`LedgerFailed` raised in the main thread that joined) when the server died for good.
    """

    def __init__(self, runs_dir: str | os.PathLike[str]) -> None:
        self.folder = ledger_dir(runs_dir)
        self.url = ""
        self.public_url = ""
        self.started = False  # whether this driver started the server
        self.restarts = 0  # how often this driver restarted a server that died under it
        self.failure: str | None = None
        self._client_file: Path | None = None
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self._restart_times: list[float] = []
        self._main_ident: int | None = None
        self._old_handler: object = None

    @property
    def password_file(self) -> str:
        return str(self.folder / "password")

    @property
    def identity(self) -> str:
        """What guards a store (no password, no port): this machine's runs-folder ledger."""
        return f"embedded ledger {self.folder} on {socket.gethostname()}"

    def _register(self) -> None:
        """(Re)write this driver's registration: the keeper may have pruned it while we were paused."""
        if self._client_file is None:
            name = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}.json"
            self._client_file = self.folder / "clients" / name
        record = {"host": socket.gethostname(), "pid": os.getpid(), "at": time.time()}
        write_private(self._client_file, json.dumps(record))

    def join(self) -> LocalLedger:
        private_dir(self.folder)
        private_dir(self.folder / "clients")
        full = disk_full(self.folder, "")
        if full is not None:
            raise LedgerFailed(full.replace("the ledger stopped: ", "cannot start the ledger: "))
        with _flock(self.folder / "join.lock"):
            self._register()
            try:
                url = EmbeddedRedis.find_running(self.folder)
                if url is None:
                    server = EmbeddedRedis(self.folder)
                    server.start()
                    server.detach()  # the server outlives this driver when others still use it
                    url = server.url
                    self.started = True
            except BaseException:
                assert self._client_file is not None
                self._client_file.unlink(missing_ok=True)
                self._client_file = None
                raise
        self.url = url
        self.public_url = redact_url(url)
        spawn_keeper(self.folder)
        if threading.current_thread() is threading.main_thread():
            self._main_ident = threading.get_ident()
            self._old_handler = signal.signal(FAILURE_SIGNAL, self._raise_failure)
        self._heartbeat = threading.Thread(target=self._watch, name="ledger-watch", daemon=True)
        self._heartbeat.start()
        return self

    def _raise_failure(self, signum: int, frame: object) -> None:
        if self.failure is not None:
            raise LedgerFailed(self.failure)

    def _watch(self) -> None:
        """Heartbeat, keeper and server watch: restart the server when it is gone, stop the run when
        it cannot be restarted."""
        last_beat = time.monotonic()
        while not self._stop.wait(WATCH_S):
            try:
                if time.monotonic() - last_beat >= HEARTBEAT_S:
                    last_beat = time.monotonic()
                    if self._client_file is not None and not self._client_file.exists():
                        with _flock(self.folder / "join.lock"):
                            self._register()
                    elif self._client_file is not None:
                        os.utime(self._client_file, follow_symlinks=False)
                    spawn_keeper(self.folder)  # a killed keeper is replaced: the server is never orphaned
                full = disk_full(self.folder, "")  # stop before the AOF or a shard write runs out of room
                if full is not None:
                    raise LedgerFailed(full)
                self._check_files()
                if EmbeddedRedis._record(self.folder) is None and not self._stop.is_set():
                    self._revive()
            except LedgerFailed as exc:
                self._fail(str(exc))
                return
            except Exception as exc:  # a bug or a vanished folder must not kill the heartbeat quietly
                log.warning("ledger_watch_error", error=f"{type(exc).__name__}: {exc}")

    def _check_files(self) -> None:
        """The server opens files by name while it runs (a rewrite's new AOF files, under names one can guess):
        a link or another user's file planted in the folder is found here within ``WATCH_S``, and the server
        is stopped before it writes through it (SIGTERM: what it acknowledged is in the AOF already; a restart
        refuses the folder until the entry is removed). The run stops with one line naming the entry."""
        try:
            check_folder_files(self.folder)
        except LedgerUnavailable as exc:
            if self._stop.is_set():
                return
            EmbeddedRedis.stop_running(self.folder)
            raise LedgerFailed(f"the ledger stopped: {exc}; then resume the run (same command with --run-id)") from None

    def _revive(self) -> None:
        """The server is gone while this driver uses it: start it again from its AOF on the same port."""
        with _flock(self.folder / "join.lock"):
            if self._stop.is_set():
                return
            self._register()
            if EmbeddedRedis.find_running(self.folder) is not None:
                return  # another member restarted it first
            server = EmbeddedRedis(self.folder, port=urlsplit(self.url).port)
            full = disk_full(self.folder, server._log_tail())
            if full is not None:
                raise LedgerFailed(full)
            now = time.monotonic()
            self._restart_times = [t for t in self._restart_times if now - t < RESTART_WINDOW_S] + [now]
            if len(self._restart_times) > MAX_RESTARTS:
                raise LedgerFailed(
                    f"the ledger in {self.folder} died {MAX_RESTARTS + 1} times within {RESTART_WINDOW_S:.0f} s: "
                    f"{server._log_tail(2)}"
                )
            try:
                server.start()
            except LedgerUnavailable as exc:
                why = disk_full(self.folder, str(exc)) or f"the ledger could not be restarted: {exc}"
                raise LedgerFailed(why) from None
            server.detach()
            self.restarts += 1
            log.warning("ledger_restarted", folder=str(self.folder), restarts=self.restarts)
        spawn_keeper(self.folder)

    def _fail(self, reason: str) -> None:
        self.failure = reason
        log.error("ledger_failed", reason=reason)
        if self._main_ident is not None:
            signal.pthread_kill(self._main_ident, FAILURE_SIGNAL)

    def leave(self) -> bool:
        """Unregister; stop the server if no live driver is left. True if this call stopped it."""
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=5)
        if self._main_ident is not None and threading.current_thread() is threading.main_thread():
            signal.signal(FAILURE_SIGNAL, self._old_handler)  # type: ignore[arg-type]
            self._main_ident = None
        if self._client_file is None:
            return False
        with _flock(self.folder / "join.lock"):
            self._client_file.unlink(missing_ok=True)
            self._client_file = None
            if live_clients(self.folder):
                return False
            return EmbeddedRedis.stop_running(self.folder)

    def __enter__(self) -> LocalLedger:
        return self.join()

    def __exit__(self, *exc: object) -> None:
        self.leave()


def disk_full(folder: Path, log_tail: str) -> str | None:
    """The reason to give when the ledger died of a full disk (its log says so, or almost no space is
    left beside its AOF), else None."""
    try:
        st = os.statvfs(folder)
        free = st.f_bavail * st.f_frsize
    except OSError:
        free = LOW_SPACE_BYTES
    said = any(s in log_tail for s in ("No space left", "Short write", "ENOSPC"))
    if free >= LOW_SPACE_BYTES and not said:
        return None
    return (
        f"the ledger stopped: no space left on the disk of {folder} ({free // 1024} KiB free); "
        "free some space, then resume the run (same command with --run-id)"
    )


def spawn_keeper(folder: Path) -> None:
    """Start the folder's keeper unless one is already watching it (it holds ``keeper.lock``)."""
    with _flock(folder / "keeper.lock", blocking=False) as free:
        if not free:
            return
    pid = _server_pid(folder)
    subprocess.Popen(
        [sys.executable, "-m", "punchline.cluster.local_ledger", str(folder), str(pid), str(start_ticks(pid))],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # not killed with the driver's terminal or process group
        close_fds=True,
    )


def open_keeper(folder: Path) -> tuple[FolderHold, int] | None:
    """A keeper's start, shared by the ledger's and the Ray head's: hold the folder open and take its
    ``keeper.lock``. None when the folder is gone (or not ours): the caller stops its orphan; an fd of -1 when
    another keeper already watches the folder (the caller closes the hold and ends)."""
    try:
        hold = FolderHold(folder)
    except OSError:
        return None
    try:
        fd = open_private(hold.path / "keeper.lock", os.O_RDWR | os.O_CREAT)
    except (OSError, LedgerUnavailable):
        hold.close()
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return hold, -1
    return hold, fd


def keep(folder: Path, server_pid: int = 0, server_ticks: int = 0) -> int:
    """The keeper's loop: stop the server once no live driver has been registered for a few polls
    (the last driver was killed before it could leave); exit when the server is gone. ``server_pid`` and
    ``server_ticks`` name the server the spawning driver saw (:func:`same_process`): it is stopped if its folder
    is deleted under it. The folder is held open (:class:`FolderHold`), so a moved runs folder is still kept."""
    opened = open_keeper(folder)
    if opened is None:  # the folder is already gone (or not a folder of ours)
        _stop_orphan(server_pid, server_ticks)
        return 0
    hold, fd = opened
    here = hold.path
    try:
        if fd < 0:
            return 0  # another keeper watches this folder
        idle = 0
        if not server_pid:
            server_pid = _server_pid(here)
            server_ticks = start_ticks(server_pid)
        while not hold.deleted and EmbeddedRedis.find_running(here) is not None:
            try:
                with _flock(here / "join.lock", blocking=False) as free:
                    if free:
                        idle = 0 if live_clients(here) else idle + 1
                        if idle >= KEEPER_GRACE_POLLS:
                            EmbeddedRedis.stop_running(here)
                            # let go of keeper.lock before join.lock: the next driver to join starts a
                            # new server and must find no keeper, so that it starts one
                            os.close(fd)
                            fd = -1
                            return 0
            except OSError:  # the folder is being removed under us
                break
            time.sleep(KEEPER_POLL_S)
        if hold.deleted:  # the folder was deleted under the server: stop it too
            _stop_orphan(server_pid, server_ticks)
        return 0
    finally:
        if fd >= 0:
            os.close(fd)
        hold.close()


def _server_pid(folder: Path) -> int:
    try:
        return int(json.loads(read_private(folder / "redis.lock") or "")["pid"])
    except (ValueError, KeyError, TypeError):
        return 0


def _stop_orphan(pid: int, ticks: int) -> None:
    """SIGTERM the server whose folder is gone, if ``pid`` is still that server (same start time), never a
    process that reused the pid."""
    if same_process(pid, ticks):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)


if __name__ == "__main__":
    sys.exit(keep(Path(sys.argv[1]), *(int(a) for a in sys.argv[2:4])))
