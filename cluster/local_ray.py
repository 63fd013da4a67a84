"""The runs folder's own local Ray head: started once, shared by the folder's drivers, outliving a kill -9.

Why: ``ray.init(address="local")`` makes Ray a child of the driver. A driver killed with ``kill -9``
takes it down, and with it the detached worker actors that would have finished and committed the calls
they had in flight (``workers/driver_watch.py``): those calls were paid again on resume. And every run
and every resume waited for a fresh Ray (seconds of CPU on a small machine), then for its shutdown.

So the default local Ray belongs to the runs folder (``runs/_ray/<env>/``), like the embedded Redis server
(``cluster/local_redis.py``), and is kept as it is, by the runs folder's keeper (``cluster/keeper.py``: the
folder's locks, the drivers' registrations, the keeper process and its loop):

* the first driver that needs it starts ``ray start --head --block`` (loopback only, no dashboard,
  sized by :class:`RaySettings`) as a process in its own session, so a ``kill -9`` of the driver does
  not reach it. It starts it once its own worker is ready to call (:meth:`LocalRay.start`, from the first
  :meth:`LocalRay.ready`), not at once: on two cores the head's half-dozen processes importing Ray would
  otherwise share the CPU with the driver's imports and delay the first call; and it never waits for it;
* later drivers (a resume, a second ``make run``, an overlapping run) find it through ``head.json`` and
  join it with ``ray.init(address=...)``; every driver registers itself in ``clients/`` and touches its
  file every ``HEARTBEAT_S`` while it runs;
* a detached keeper (``python -m punchline.cluster.local_ray DIR LINGER_S``) stops the head once no live
  driver has been registered for ``PUNCHLINE_LOCAL_RAY_LINGER_S`` and no shard worker of ours is left
  in it (a killed driver's workers finish their calls in flight, commit, then end): SIGTERM to the
  ``--block`` process, which stops its children, then SIGKILL to any process of the head's session
  still there after ``STOP_WAIT_S``. No driver stops the head itself: the next run reuses it.

The workers of a head inherit the environment of the driver that started it (provider keys, S3
settings, ``PUNCHLINE_*``), so the head is chosen by a digest of that environment and of its sizing
(:func:`head_key`): a driver with another environment gets a head of its own in the same folder, never
workers that read someone else's keys. Workers are found without importing Ray: processes of the
head's session whose title Ray set to ``ray::ShardWorker...``.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import msgspec
import structlog

from punchline.cluster import keeper
from punchline.cluster.keeper import ClientFile, cmdline, folder_lock, live_clients, pid_alive, stat_fields
from punchline.cluster.private_files import open_private, private_dir, read_private, write_private
from punchline.cluster.ray_runtime import RaySettings
from punchline.data.errors import ConfigError, InfraError
from punchline.data.settings import LOCAL_RAY_DASHBOARD_PORT, LOCAL_RAY_LINGER_S

log = structlog.get_logger("punchline.local_ray")

RAY_DIR = "_ray"
READY_TEXT = "Ray runtime started"  # what `ray start` prints once the head's GCS and raylet are up
KEEPER_MODULE = "punchline.cluster.local_ray"  # the keeper's entry point (this module's __main__)
HEARTBEAT_S = 5.0
KEEPER_POLL_S = 1.0
STOP_WAIT_S = 60.0  # SIGTERM, then this long for the head's processes to end, then SIGKILL for those left
KILL_WAIT_S = 10.0  # SIGKILL, then this long for the head's processes to be gone (before its files are removed)
SLOW_START_TEXT = "timed out during startup"  # Ray gives its raylet 30 s (hard-coded): a loaded machine misses it
START_TRIES = 3  # a head that ended with SLOW_START_TEXT is started again, this many times in all
START_TIMEOUT_S = 300.0  # a loaded 2-core machine took 45 s; a driver that needs Ray gives up after this
# the longest --temp-dir whose socket paths fit Ray's 107 bytes: <temp>/session_<date>_<time>_<us>_<pid>/sockets/
# plasma_store adds 66 (a 7-digit pid); a longer runs folder's heads are given a short link to their folder
MAX_TEMP_DIR_BYTES = 107 - 66
SESSION_PREFIX, SHORT_PREFIX = "session-", "pl-ray-"  # a head's folder for Ray's files; its short link's folder
DRAIN_MAX_S = 900.0  # a killed driver's workers past this are stuck, not draining: the head is stopped anyway
WORKER_TITLE = "ray::ShardWorker"
AUTH_MODE_ENV = "RAY_AUTH_MODE"  # Ray's token auth: on for our heads unless the user set it
TOKEN_ENV = "RAY_AUTH_TOKEN"  # a token the user gave Ray themselves (kept as it is)
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"  # where Ray reads the token from: our head's own file unless the user set one
TOKEN_FILE = "auth_token"  # the head's token, 0600 in its folder: never the user's ~/.ray (see docs/architecture.md)
# variables that differ between two shells (or a make and a shell) without changing what a worker sees
VOLATILE_ENV = ("PWD", "OLDPWD", "SHLVL", "_", "PYTEST_CURRENT_TEST", "COLUMNS", "LINES", "TERM", "PS1")
VOLATILE_PREFIXES = ("MAKE", "MFLAGS", "SSH_", "TMUX", "TERM_", "WINDOWID", "DISPLAY")


class HeadRecord(msgspec.Struct, frozen=True):
    """The running head of one ``runs/_ray/<env>/`` folder (``head.json``)."""

    pid: int  # the `ray start --block` process; also its session id, shared by every process of the head
    address: str  # 127.0.0.1:PORT, the head's GCS
    host: str
    started_at: float
    dashboard: str = ""  # http://127.0.0.1:PORT with --ray-dashboard or PUNCHLINE_LOCAL_RAY_DASHBOARD_PORT, else none
    session_dir: str = ""  # Ray's files of this head (its --temp-dir: sessions, logs, sockets), in the runs folder
    short_dir: str = ""  # a private /tmp folder whose link Ray was given instead, when session_dir is too long


def ray_dir(runs_dir: str | os.PathLike[str]) -> Path:
    return Path(runs_dir).resolve() / RAY_DIR


def head_key(settings: RaySettings, env: dict[str, str] | None = None) -> str:
    """Which head of the folder a driver uses: one per environment its workers would inherit and per sizing."""
    source = dict(os.environ if env is None else env)
    source.setdefault(AUTH_MODE_ENV, "token")  # what the head runs with (and a joining driver sets)
    kept = sorted((k, v) for k, v in source.items() if k not in VOLATILE_ENV and not k.startswith(VOLATILE_PREFIXES))
    sizing = [sys.executable, settings.num_cpus, settings.object_store_bytes]
    return hashlib.sha256(json.dumps([kept, sizing]).encode()).hexdigest()[:16]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def notice(text: str) -> None:
    """One line for the person at the terminal (stderr, like the CLI's warnings; a progress display keeps it above)."""
    print(f"punchline: {text}", file=sys.stderr, flush=True)


def head_command(settings: RaySettings, temp_dir: str, dashboard_port: int = 0) -> list[str]:
    """``ray start --head --block`` on the loopback; every port it would otherwise take at a fixed
    number (GCS 6379, client 10001, dashboard 8265, agent 52365) taken free, so heads never collide.
    ``temp_dir``: where Ray keeps the head's files (:func:`session_dirs`), never ``/tmp/ray``.
    ``dashboard_port``: Ray's dashboard on 127.0.0.1 there (behind the head's token), else none."""
    argv = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", f"--temp-dir={temp_dir}"]
    argv += [f"--port={_free_port()}", "--node-ip-address=127.0.0.1"]
    if dashboard_port:
        argv += ["--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard_port}"]
    else:
        argv += ["--include-dashboard=false", f"--dashboard-port={_free_port()}"]
    argv += [f"--ray-client-server-port={_free_port()}"]
    argv += [f"--dashboard-agent-listen-port={_free_port()}", "--disable-usage-stats"]
    if settings.num_cpus is not None:
        argv.append(f"--num-cpus={settings.num_cpus}")
    if settings.object_store_bytes is not None:
        argv.append(f"--object-store-memory={settings.object_store_bytes}")
    return argv


def session_dirs(folder: Path) -> tuple[Path, Path | None]:
    """A new head's own folder for Ray's files (``runs/_ray/<env>/session-XXXX``: its sessions, logs and sockets, 250
    KiB a run), and the short path Ray is given for it when that folder's path is too long for Ray's unix sockets
    (``<temp>/session_<date>_<pid>/sockets/plasma_store`` must fit ``sockaddr_un``'s 107 bytes): a link to it in a
    private ``/tmp/pl-ray-XXXX`` folder, else None. Both are removed when the head stops (:func:`remove_session`):
    the files stay in the runs folder (deleted with it), and only a link ever sits in ``/tmp``."""
    real = Path(tempfile.mkdtemp(prefix=SESSION_PREFIX, dir=folder))  # 0700, one per head: a next head never shares it
    if len(str(real)) <= MAX_TEMP_DIR_BYTES:
        return real, None
    short = Path(tempfile.mkdtemp(prefix=SHORT_PREFIX, dir="/tmp"))  # ours (0700), not another user's to plant in
    (short / "t").symlink_to(real)
    return real, short


def ray_temp_dir(head: HeadRecord) -> str:
    """The path a head's Ray was given as its ``--temp-dir``: the short link when there is one."""
    return str(Path(head.short_dir) / "t") if head.short_dir else head.session_dir


def remove_session(head: HeadRecord, folder: Path) -> None:
    """Ray's files of a head that stopped (every process of it ended): its folder, found in ``folder`` (where the
    head's folder is now: the runs folder may have been moved), and its short link."""
    name = Path(head.session_dir).name
    if name.startswith(SESSION_PREFIX):
        shutil.rmtree(folder / name, ignore_errors=True)
    if Path(head.short_dir).name.startswith(SHORT_PREFIX):
        shutil.rmtree(head.short_dir, ignore_errors=True)  # the link only: rmtree never follows it


def _port_of(argv: list[str]) -> int:
    return int(next(a for a in argv if a.startswith("--port=")).split("=", 1)[1])


def read_head(folder: Path) -> HeadRecord | None:
    """The folder's head if its process is still that head (not a reused pid), else None."""
    raw = read_private(folder / "head.json")
    if not raw:
        return None
    try:
        head = msgspec.json.decode(raw, type=HeadRecord)
    except msgspec.DecodeError:
        return None
    if head.host != socket.gethostname() or not _is_head(head):
        return None
    return head


def _is_head(head: HeadRecord) -> bool:
    argv = cmdline(head.pid)
    return "--head" in argv and f"--port={head.address.rsplit(':', 1)[1]}" in argv


def session_processes(sid: int) -> list[int]:
    """Every live process of session ``sid`` (a head's: its GCS, raylet, agents and workers), from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = stat_fields(int(entry.name))
        if len(fields) > 3 and int(fields[3]) == sid and fields[0] != "Z":  # a zombie has ended (its parent reaps it)
            found.append(int(entry.name))
    return found


def shard_workers(sid: int) -> list[int]:
    """The head's shard-worker actors still alive (a killed driver's, draining): Ray titles their processes."""
    return [pid for pid in session_processes(sid) if " ".join(cmdline(pid)).startswith(WORKER_TITLE)]


class LocalRay:
    """One driver's use of the runs folder's local Ray head (see the module's docstring).

    :meth:`join` never waits for Ray: it registers, starts a head if none runs, and returns;
    :meth:`ready` (non-blocking) and :meth:`wait` say when the head is up; :meth:`leave` unregisters
    (the keeper stops the head after the linger, so the next run finds it up).

    ``dashboard_port``: Ray's dashboard on 127.0.0.1 at this port (0: a free one) if this driver starts the head;
    None: ``PUNCHLINE_LOCAL_RAY_DASHBOARD_PORT``'s (0 there: none). The head is the folder's, shared: one already
    running keeps the dashboard it started with (the driver says so in one line rather than restart it under
    another driver's run)."""

    def __init__(
        self, runs_dir: str | os.PathLike[str], settings: RaySettings, dashboard_port: int | None = None
    ) -> None:
        self.settings = settings
        env_port = LOCAL_RAY_DASHBOARD_PORT.get()
        self.dashboard_port = dashboard_port if dashboard_port is not None else (env_port or None)
        self._said_dashboard = False
        self.folder = ray_dir(runs_dir) / head_key(settings)
        self.head: HeadRecord | None = None  # None until found (join) or started (start)
        self.started = False  # whether this driver started the head
        self._client = ClientFile(self.folder)
        self._proc: subprocess.Popen[bytes] | None = None  # the head, when this driver started it
        self._tries = 1  # heads this driver started (one more after each start Ray itself timed out)
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self._env_before: dict[str, str | None] = {}  # what auth_for_join changed in os.environ, restored on leave

    @property
    def token_path(self) -> Path:
        return self.folder / TOKEN_FILE

    def auth_env(self) -> dict[str, str]:
        """The variables Ray needs to log in to this head: token auth on, and the token read from the head's own
        0600 file (``runs/_ray/<env>/auth_token``), unless the user set the mode or a token themselves. So a
        machine with nothing in ``~/.ray`` (``ray start`` makes no token; only ``ray.init`` does) starts it."""
        env = {}
        if not os.environ.get(AUTH_MODE_ENV):
            env[AUTH_MODE_ENV] = "token"
        if not os.environ.get(TOKEN_ENV) and not os.environ.get(TOKEN_PATH_ENV):
            env[TOKEN_PATH_ENV] = str(self.token_path)
        return env

    def check_startable(self) -> None:
        """What the head will need, proven before the run's first paid call (the head itself starts only when a
        stage needs it, maybe after batches were paid for): Ray and its ``ray start`` in this Python, Ray's auth
        settings usable, and the head's token writable in its folder (written now; a starting head writes a new
        one). A failure is one line, exit 2, before anything is paid."""
        if importlib.util.find_spec("ray") is None:
            raise InfraError(
                f"Ray is not installed for {sys.executable}: the local Ray head cannot start; reinstall punchline"
            )
        mode = os.environ.get(AUTH_MODE_ENV, "")
        if mode and mode.lower() not in ("token", "disabled"):
            raise ConfigError(f"must be token or disabled, got {mode!r}", field=AUTH_MODE_ENV)
        path = os.environ.get(TOKEN_PATH_ENV)
        if path and not os.environ.get(TOKEN_ENV) and not Path(path).is_file():
            raise ConfigError(
                f"names {path}, which is not a file: the local Ray head would find no token", field=TOKEN_PATH_ENV
            )
        if self.auth_env().get(TOKEN_PATH_ENV) == str(self.token_path):
            self._write_token()

    def _write_token(self) -> None:
        """A new random token for a head about to start (under ``join.lock``): 0600, never through a link."""
        write_private(self.token_path, secrets.token_hex(32))

    @property
    def address(self) -> str:
        assert self.head is not None, "start() first"
        return self.head.address

    def join(self) -> LocalRay:
        """Register, and find the folder's head if one runs (a resume, the next run); never starts one."""
        private_dir(self.folder.parent)
        private_dir(self.folder)
        private_dir(self.folder / "clients")
        with folder_lock(self.folder / "join.lock"):
            self._client.write()
            self.head = read_head(self.folder)
            if self.head is None:
                self.check_startable()
        if self.head is not None:
            spawn_keeper(self.folder)
            log.info("local_ray_joined", address=self.head.address, folder=str(self.folder))
            self._say_dashboard(self.head)
        self._heartbeat = threading.Thread(target=self._beat, name="local-ray-heartbeat", daemon=True)
        self._heartbeat.start()
        return self

    def start(self) -> None:
        """Start the folder's head unless one runs; never waits for it to be up."""
        if self.head is not None:
            return
        with folder_lock(self.folder / "join.lock"):
            self.head = read_head(self.folder)  # another driver may have started one meanwhile
            if self.head is None:
                self.head = self._start_head()
                self.started = True
        spawn_keeper(self.folder)
        self._say_dashboard(self.head)

    def _say_dashboard(self, head: HeadRecord) -> None:
        """Where the asked-for dashboard is, once (a head found running may have none: said, not restarted)."""
        if self.dashboard_port is None or self._said_dashboard:
            return
        self._said_dashboard = True
        if not head.dashboard:
            notice(
                "the runs folder's Ray head was started by an earlier run without a dashboard and is shared: none "
                f"this run (a new head, once it stopped {LOCAL_RAY_LINGER_S.get():g} s after its last run, has one)"
            )
            return
        asked = f":{self.dashboard_port}"
        other = "" if self.dashboard_port == 0 or head.dashboard.endswith(asked) else " (the running head's port)"
        notice(f"Ray's dashboard: {head.dashboard}{other}; it asks for the head's token, in {self.token_path}")

    def _start_head(self) -> HeadRecord:
        dashboard_port = 0 if self.dashboard_port is None else self.dashboard_port or _free_port()
        session_dir, short_dir = session_dirs(self.folder)
        temp_dir = str(short_dir / "t") if short_dir is not None else str(session_dir)
        argv = head_command(self.settings, temp_dir, dashboard_port)
        env = dict(os.environ, PYTHONUNBUFFERED="1", RAY_USAGE_STATS_ENABLED="0")
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # Ray's switch: bind the loopback, not every interface
        env.update(self.auth_env())  # token auth with the head's own token; the workers inherit both
        env.pop("RAY_ADDRESS", None)
        if env.get(TOKEN_PATH_ENV) == str(self.token_path):
            self._write_token()
        fd = open_private(self.folder / "head.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            self._proc = proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=fd,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.folder,
                start_new_session=True,  # not killed with the driver, its terminal or its process group
                close_fds=True,
            )
        finally:
            os.close(fd)
        head = HeadRecord(
            pid=proc.pid,
            address=f"127.0.0.1:{_port_of(argv)}",
            host=socket.gethostname(),
            started_at=time.time(),
            dashboard=f"http://127.0.0.1:{dashboard_port}" if dashboard_port else "",
            session_dir=str(session_dir),
            short_dir=str(short_dir or ""),
        )
        write_private(self.folder / "head.json", msgspec.json.encode(head).decode())
        log.info("local_ray_starting", address=head.address, pid=head.pid)
        if head.dashboard:  # the dashboard asks for the token: a browser takes it once, then keeps a cookie
            log.info("local_ray_dashboard", url=head.dashboard, token_file=str(self.token_path))
        return head

    def auth_for_join(self) -> None:
        """Make this process present the head's token, as ``ray.init`` does for a local Ray it starts (it sets
        the variables in its own process, then refreshes what Ray read at import: a notebook may have imported
        Ray before); a mode or token the user chose stays. :meth:`leave` puts the variables back."""
        env = self.auth_env()
        if not env:
            return
        for key, value in env.items():
            self._env_before.setdefault(key, os.environ.get(key))
            os.environ[key] = value
        if "ray" in sys.modules:
            refresh_ray_auth()

    def _log_tail(self, lines: int = 3) -> str:
        text = read_private(self.folder / "head.log") or ""
        return " | ".join(ln.strip() for ln in text.splitlines()[-lines:] if ln.strip())

    def _start_timed_out(self) -> bool:
        """The head this driver started ended because Ray's own start-up wait ran out (not a real failure)."""
        return self._proc is not None and SLOW_START_TEXT in (read_private(self.folder / "head.log") or "")

    def ready(self) -> bool:
        """The head is up (never waits; starts it if none runs); InfraError when it died before or after
        coming up."""
        self.start()
        assert self.head is not None
        ended = self._proc.poll() is not None if self._proc is not None else not _is_head(self.head)
        if ended and self._start_timed_out() and self._tries < START_TRIES:
            self._tries += 1
            log.warning("local_ray_start_again", reason=SLOW_START_TEXT, attempt=self._tries, of=START_TRIES)
            stop_head(self.head.pid, wait_s=0.0)  # what the failed start left (its GCS may run on), and its files
            remove_session(self.head, self.folder)
            with folder_lock(self.folder / "join.lock"):
                self.head = self._start_head()
            spawn_keeper(self.folder)  # the last one may have left with the head that ended
            return False
        if ended:
            raise InfraError(f"the local Ray head ({self.folder}) ended: {self._log_tail() or 'no output'}")
        return READY_TEXT in (read_private(self.folder / "head.log") or "")

    def wait(self, timeout_s: float = START_TIMEOUT_S) -> str:
        """Block until the head is up; its address."""
        deadline = time.monotonic() + timeout_s
        while not self.ready():
            if time.monotonic() > deadline:
                raise InfraError(
                    f"the local Ray head ({self.folder}) did not start in {timeout_s:.0f} s: "
                    f"{self._log_tail() or 'no output'}"
                )
            time.sleep(0.1)
        return self.address

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self._client.beat()
                if self.head is not None:  # a killed keeper is replaced: the head is never left without one
                    spawn_keeper(self.folder)
            except Exception as exc:  # a vanished folder must not kill the heartbeat quietly
                log.warning("local_ray_heartbeat_error", error=f"{type(exc).__name__}: {exc}")

    def leave(self) -> None:
        """Unregister; the head stays up for the linger (the keeper stops it)."""
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=5)
        self._client.remove()
        for key, value in self._env_before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._env_before.clear()

    def __enter__(self) -> LocalRay:
        return self.join()

    def __exit__(self, *exc: object) -> None:
        self.leave()


def refresh_ray_auth() -> None:
    """Make an imported Ray read ``RAY_AUTH_*`` again (its configuration and its cached token)."""
    from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]  # lazy: Ray, imported already

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def spawn_keeper(folder: Path) -> None:
    """Start the head's keeper unless one already watches it."""
    head = read_head(folder)
    linger_s = str(LOCAL_RAY_LINGER_S.get())
    keeper.spawn_keeper(KEEPER_MODULE, folder, head.pid if head is not None else 0, (linger_s,))


def stop_head(sid: int, wait_s: float = STOP_WAIT_S) -> None:
    """SIGTERM the head (it stops its children), then SIGKILL whatever of its session is left; returns once no
    process of it is left (or ``KILL_WAIT_S`` after the SIGKILL)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(sid, signal.SIGTERM)
    _wait_ended(sid, wait_s)
    for pid in session_processes(sid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _wait_ended(sid, KILL_WAIT_S)


def _wait_ended(sid: int, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    while session_processes(sid) and time.monotonic() < deadline:
        time.sleep(0.2)


class KeptHead:
    """What the keeper (:func:`keeper.keep`) keeps here: the folder's head, in use while a driver is registered
    or a killed driver's shard workers still drain (for ``DRAIN_MAX_S`` at the most)."""

    def __init__(self) -> None:
        self.alone_since: float | None = None  # no driver left (workers may still drain)
        self.head: HeadRecord | None = None  # the head last seen running: whose files to remove once it stopped
        self.folder: Path | None = None  # where the head's folder is (the keeper's hold on it: it follows a move)

    def running(self, folder: Path) -> int | None:
        self.folder = folder
        head = read_head(folder)
        if head is not None and head != self.head:
            if self.head is not None:  # started again (Ray timed out its start): the last one's files go
                self._remove_session(self.head.pid)
            self.head = head
        return head.pid if head is not None else None

    def in_use(self, folder: Path, pid: int) -> bool:
        now = time.monotonic()
        drivers = bool(live_clients(folder))
        self.alone_since = None if drivers else (self.alone_since or now)
        draining = not drivers and bool(shard_workers(pid))
        stuck = self.alone_since is not None and now - self.alone_since > DRAIN_MAX_S
        return drivers or (draining and not stuck)

    def retire(self, folder: Path) -> None:
        (folder / "head.json").unlink(missing_ok=True)  # a driver joining now starts a new head

    def stop(self, pid: int) -> None:
        stop_head(pid)
        self._remove_session(pid)

    def ended(self, folder: Path) -> None:
        _stop_leftovers(folder)
        if self.head is not None:
            self._remove_session(self.head.pid)

    def stop_orphan(self, pid: int) -> None:
        """Stop the head whose folder is gone if ``pid`` (the same process) is still a ``ray start --head --block``
        in a session of its own; its link in ``/tmp`` goes too (its files went with the folder)."""
        argv = cmdline(pid)
        if "--head" in argv and "--block" in argv and session_processes(pid):
            stop_head(pid)
        self._remove_session(pid)

    def _remove_session(self, pid: int) -> None:
        """Ray's files of the head ``pid`` once no process of it is left (a process still running keeps them)."""
        if self.head is not None and self.folder is not None and self.head.pid == pid and not session_processes(pid):
            remove_session(self.head, self.folder)


def keep(folder: Path, linger_s: float, head_pid: int = 0, head_ticks: int = 0) -> int:
    """The keeper's loop (:func:`keeper.keep`): stop the head once no live driver and no shard worker has been
    there for ``linger_s``; exit when the head is gone. ``head_pid`` and ``head_ticks``: the head the spawning
    driver saw, stopped if the folder is deleted under it (``rm -rf runs``). A runs folder moved or renamed
    during the linger is still kept, and its head stopped after the linger as if it had not moved."""
    return keeper.keep(folder, KeptHead(), linger_s=linger_s, poll_s=KEEPER_POLL_S, pid=head_pid, ticks=head_ticks)


def _stop_leftovers(folder: Path) -> None:
    """The head recorded in ``folder`` died on its own (its --block process killed): stop what is left of it."""
    raw = read_private(folder / "head.json")
    try:
        head = msgspec.json.decode(raw or "", type=HeadRecord)
    except msgspec.DecodeError:
        return
    if head.host == socket.gethostname() and not pid_alive(head.pid):
        (folder / "head.json").unlink(missing_ok=True)
        stop_head(head.pid, wait_s=0.0)
        if not session_processes(head.pid):
            remove_session(head, folder)


if __name__ == "__main__":
    sys.exit(keep(Path(sys.argv[1]), float(sys.argv[2]), *(int(a) for a in sys.argv[3:5])))
