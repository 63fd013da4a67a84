"""The runs folder's own Redis server (it holds the ledger): one embedded Redis shared by every driver that uses
the folder, kept by the runs folder's keeper (``services/redis_keeper.py``; its loop,
``services/keeper.py``, is the local Ray head's keeper's too).

Why shared: the ledger is what stops two runs from paying for one request twice (the request lease
``pl:req:<key>`` is global). Two drivers with a Redis each would each grant the lease, and both
would call. So the embedded server belongs to the runs folder (``runs/_ledger/``), not to a run:

* the first driver that needs it starts it (under ``join.lock``, so two drivers starting at the
  same moment start one server, not two);
* every driver registers itself in ``runs/_ledger/clients/`` (a file per driver, touched every
  ``HEARTBEAT_S``) and finds the running server through its lock record;
* a driver that leaves removes its file and stops the server if no live driver is left;
* a detached keeper process (``python -m punchline.services.redis_keeper DIR``) stops the server
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
import os
import signal
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import structlog

from punchline.data.errors import LedgerFailed, LedgerUnavailable
from punchline.schedulers.server.redis_client import redact_url
from punchline.schedulers.server.server_info import server_info
from punchline.services.keeper import ClientFile, FolderHold, folder_lock, live_clients
from punchline.services.private_files import check_folder_files, private_dir
from punchline.services.redis_folder import embedded_identity, find_running, lock_record, stop_running
from punchline.services.redis_keeper import start_server
from punchline.services.redis_server import EmbeddedRedis

log = structlog.get_logger("punchline.ledger")

REDIS_DIR = "_ledger"  # the folder's name in a runs folder, kept from before the module's rename: existing ones work
HEARTBEAT_S = 5.0
WATCH_S = 0.5  # how often a member checks that the server is still there
LOW_SPACE_BYTES = 256 * 1024  # less free than this beside the AOF: the disk is full, a restart would die again
MAX_RESTARTS = 5  # restarts within RESTART_WINDOW_S before the server counts as dying for good
RESTART_WINDOW_S = 60.0
FAILURE_SIGNAL = signal.SIGUSR2


def redis_dir(runs_dir: str | os.PathLike[str]) -> Path:
    """The runs folder's Redis server's folder (its AOF, password, locks and client registrations)."""
    return Path(runs_dir).resolve() / REDIS_DIR


class LocalRedis:
    """One driver's membership of the runs folder's Redis server, the ledger's home (a context manager).

    ``url`` carries the password and stays in this process; ``public_url`` (``***``) and
    ``password_file`` are what is recorded and handed to workers. ``failure`` is set (and
    :class:`LedgerFailed` raised in the main thread that joined) when the server died for good.
    """

    def __init__(self, runs_dir: str | os.PathLike[str]) -> None:
        self.runs_dir = Path(runs_dir).resolve()
        self.folder = redis_dir(runs_dir)
        self._holds: list[FolderHold] = []  # the runs folder and the ledger's, held open: a deletion is seen
        self.url = ""
        self.public_url = ""
        self.started = False  # whether this driver started the server
        self.restarts = 0  # how often this driver restarted a server that died under it
        self.failure: str | None = None
        self._client = ClientFile(self.folder)
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
        return embedded_identity(self.folder)

    def join(self) -> LocalRedis:
        private_dir(self.folder)
        private_dir(self.folder / "clients")
        full = disk_full(self.folder, "")
        if full is not None:
            raise LedgerFailed(full.replace("the ledger stopped: ", "cannot start the ledger: "))
        with folder_lock(self.folder / "join.lock"):
            self._client.write()
            try:
                url = find_running(self.folder)
                if url is None:
                    # the keeper starts it, as its child: it outlives this driver while others use it, never its keeper
                    start_server(self.folder)
                    url = self._running_url()
                    self.started = True
            except BaseException:
                self._client.remove()
                raise
        self.url = url
        self.public_url = redact_url(url)
        self._holds = [FolderHold(self.runs_dir), FolderHold(self.folder)]
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
                self._check_folder()
                if time.monotonic() - last_beat >= HEARTBEAT_S:
                    last_beat = time.monotonic()
                    self._client.beat()
                full = disk_full(self.folder, "")  # stop before the AOF or a shard write runs out of room
                if full is not None:
                    raise LedgerFailed(full)
                self._check_files()
                if lock_record(self.folder) is None and not self._stop.is_set():
                    self._revive()
            except LedgerFailed as exc:
                self._fail(str(exc))
                return
            except Exception as exc:  # a bug or a vanished folder must not kill the heartbeat quietly
                log.warning("ledger_watch_error", error=f"{type(exc).__name__}: {exc}")

    def _running_url(self) -> str:
        """The URL of the server a keeper just said is up; LedgerUnavailable if it has ended already."""
        url = find_running(self.folder)
        if url is None:
            raise LedgerUnavailable(f"the ledger in {self.folder} started, then ended: {_log_tail(self.folder)}")
        return url

    def _check_folder(self) -> None:
        """The runs folder (or its ledger's) deleted under the run: nothing of the run can be kept any more (its
        ledger's AOF, its log, its Ray head's files), so the run stops within ``WATCH_S``, with one line naming the
        folder. The server is stopped first (its keeper would within its poll): no worker takes a lease after
        this, so no call is paid for after it."""
        gone = next((hold for hold in self._holds if hold.deleted), None)
        if gone is None or self._stop.is_set():
            return
        info = server_info(self.url) or {}  # the server still answers at its URL, its folder gone
        pid = int(info["process_id"]) if info.get("process_id", "").isdigit() else 0
        if pid > 0:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        what = "the runs folder" if gone is self._holds[0] else "the runs folder's ledger"
        where = self.runs_dir if gone is self._holds[0] else self.folder
        raise LedgerFailed(
            f"{what} {where} was deleted while this run used it: the run stopped, no call is made after this "
            "(keep the runs folder while a run uses it)"
        )

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
            stop_running(self.folder)
            raise LedgerFailed(f"the ledger stopped: {exc}; then resume the run (same command with --run-id)") from None

    def _revive(self) -> None:
        """The server is gone while this driver uses it: start it again from its AOF on the same port."""
        with folder_lock(self.folder / "join.lock"):
            if self._stop.is_set():
                return
            self._client.write()
            if find_running(self.folder) is not None:
                return  # another member restarted it first
            full = disk_full(self.folder, _log_tail(self.folder))
            if full is not None:
                raise LedgerFailed(full)
            now = time.monotonic()
            self._restart_times = [t for t in self._restart_times if now - t < RESTART_WINDOW_S] + [now]
            if len(self._restart_times) > MAX_RESTARTS:
                raise LedgerFailed(
                    f"the ledger in {self.folder} died {MAX_RESTARTS + 1} times within {RESTART_WINDOW_S:.0f} s: "
                    f"{_log_tail(self.folder, 2)}"
                )
            try:
                start_server(self.folder, port=urlsplit(self.url).port)  # a new keeper, the server its child
                self._running_url()
            except LedgerUnavailable as exc:
                why = disk_full(self.folder, str(exc)) or f"the ledger could not be restarted: {exc}"
                raise LedgerFailed(why) from None
            self.restarts += 1
            log.warning("ledger_restarted", folder=str(self.folder), restarts=self.restarts)

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
        deleted = any(hold.deleted for hold in self._holds)
        for hold in self._holds:
            hold.close()
        self._holds = []
        if not self._client.registered:
            return False
        if deleted:  # nothing left to leave: its keeper stopped the server when the folder went
            self._client.remove()
            return False
        with folder_lock(self.folder / "join.lock"):
            self._client.remove()
            if live_clients(self.folder):
                return False
            return stop_running(self.folder)

    def __enter__(self) -> LocalRedis:
        return self.join()

    def __exit__(self, *exc: object) -> None:
        self.leave()


def _log_tail(folder: Path, lines: int = 5) -> str:
    """The last lines of the folder's server log (why a server did not start, or died)."""
    return EmbeddedRedis(folder)._log_tail(lines)


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
