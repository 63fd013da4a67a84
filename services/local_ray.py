"""The runs folder's own local Ray head: started once, shared by the folder's drivers, outliving a kill -9.

Why: ``ray.init(address="local")`` makes Ray a child of the driver. A driver killed with ``kill -9``
takes it down, and with it the detached worker actors that would have finished and committed the calls
they had in flight (``workers/driver_watch.py``): those calls were paid again on resume. And every run
and every resume waited for a fresh Ray (seconds of CPU on a small machine), then for its shutdown.

So the default local Ray belongs to the runs folder (``runs/_ray/<env>/``), like the embedded Redis server
(``services/local_redis.py``), and is kept as it is, by a keeper that is its parent
(``services/ray_keeper.py``; the folder's locks, the drivers' registrations and the keeper's loop are shared,
``services/keeper.py``):

* the first driver that needs it has a new keeper start ``ray start --head --block`` (loopback only, no
  dashboard, sized by :class:`RaySettings`) as the keeper's child, in a session of its own, so a ``kill -9`` of
  the driver does not reach it, while a killed keeper takes it along. The driver waits for the keeper's one line
  (it started the head and recorded it in ``head.json``), never for the head to be up. It starts it once its own
  worker is ready to call (:meth:`LocalRay.start`, from the first :meth:`LocalRay.ready`), not at once: on two
  cores the head's half-dozen processes importing Ray would otherwise share the CPU with the driver's imports and
  delay the first call;
* later drivers (a resume, a second ``make run``, an overlapping run) find it through ``head.json`` and
  join it with ``ray.init(address=...)``; every driver registers itself in ``clients/`` and touches its
  file every ``HEARTBEAT_S`` while it runs;
* the keeper stops the head once no live driver has been registered for ``PUNCHLINE_LOCAL_RAY_LINGER_S`` and no
  shard worker of ours is left in it (a killed driver's workers finish their calls in flight, commit, then end).
  No driver stops the head itself: the next run reuses it.

The workers of a head inherit the environment of the driver that started it (provider keys, S3
settings, ``PUNCHLINE_*``), so the head is chosen by a digest of that environment and of its sizing
(:func:`head_key`): a driver with another environment gets a head of its own in the same folder, never
workers that read someone else's keys. Workers are found without importing Ray: processes of the
head's session whose title Ray set to ``ray::ShardWorker...``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import threading
import time
from pathlib import Path

import structlog

from punchline.data.errors import ConfigError, InfraError, LedgerUnavailable
from punchline.data.extras import require_cluster_extra
from punchline.data.settings import LOCAL_RAY_DASHBOARD_PORT, LOCAL_RAY_LINGER_S
from punchline.services.keeper import ClientFile, folder_lock, is_kept
from punchline.services.private_files import private_dir, read_private
from punchline.services.ray_keeper import (
    AUTH_MODE_ENV,
    HEAD_LOG,
    READY_TEXT,
    SLOW_START_TEXT,
    TOKEN_ENV,
    TOKEN_FILE,
    TOKEN_PATH_ENV,
    HeadRecord,
    auth_env,
    free_port,
    head_record,
    read_head,
    start_head,
    write_token,
)
from punchline.services.ray_settings import RaySettings

log = structlog.get_logger("punchline.local_ray")

RAY_DIR = "_ray"
HEARTBEAT_S = 5.0
START_TIMEOUT_S = 300.0  # a loaded 2-core machine took 45 s; a driver that needs Ray gives up after this
# variables that differ between two shells (or a make and a shell) without changing what a worker sees
VOLATILE_ENV = ("PWD", "OLDPWD", "SHLVL", "_", "PYTEST_CURRENT_TEST", "COLUMNS", "LINES", "TERM", "PS1")
VOLATILE_PREFIXES = ("MAKE", "MFLAGS", "SSH_", "TMUX", "TERM_", "WINDOWID", "DISPLAY")


def ray_dir(runs_dir: str | os.PathLike[str]) -> Path:
    return Path(runs_dir).resolve() / RAY_DIR


def head_key(settings: RaySettings, env: dict[str, str] | None = None) -> str:
    """Which head of the folder a driver uses: one per environment its workers would inherit and per sizing."""
    source = dict(os.environ if env is None else env)
    source.setdefault(AUTH_MODE_ENV, "token")  # what the head runs with (and a joining driver sets)
    kept = sorted((k, v) for k, v in source.items() if k not in VOLATILE_ENV and not k.startswith(VOLATILE_PREFIXES))
    sizing = [sys.executable, settings.num_cpus, settings.object_store_bytes]
    return hashlib.sha256(json.dumps([kept, sizing]).encode()).hexdigest()[:16]


def notice(text: str) -> None:
    """One line for the person at the terminal (stderr, like the CLI's warnings; a progress display keeps it above)."""
    print(f"punchline: {text}", file=sys.stderr, flush=True)


class LocalRay:
    """One driver's use of the runs folder's local Ray head (see the module's docstring).

    :meth:`join` never waits for Ray: it registers, finds the head if one runs, and returns; :meth:`start` has a
    keeper start one if none runs (waiting for the keeper's word, not for Ray); :meth:`ready` (non-blocking but for
    that start) and :meth:`wait` say when the head is up; :meth:`leave` unregisters
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
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self._env_before: dict[str, str | None] = {}  # what auth_for_join changed in os.environ, restored on leave

    @property
    def token_path(self) -> Path:
        return self.folder / TOKEN_FILE

    def auth_env(self) -> dict[str, str]:
        """The variables Ray needs to log in to this head (:func:`ray_keeper.auth_env`)."""
        return auth_env(self.folder)

    def check_startable(self) -> None:
        """What the head will need, proven before the run's first paid call (the head itself starts only when a
        stage needs it, maybe after batches were paid for): Ray and its ``ray start`` in this Python, the cluster
        extra when Ray's dashboard is asked for, Ray's auth settings usable, and the head's token writable in its
        folder (written now; a starting head writes a new one). A failure is one line, exit 2, before anything is
        paid."""
        if importlib.util.find_spec("ray") is None:
            raise InfraError(
                f"Ray is not installed for {sys.executable}: the local Ray head cannot start; reinstall punchline"
            )
        if self.dashboard_port is not None:
            require_cluster_extra(
                "Ray's dashboard on the local head",
                field=f"{LOCAL_RAY_DASHBOARD_PORT.flag} / {LOCAL_RAY_DASHBOARD_PORT.name}",
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
            write_token(self.folder)

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
            log.info("local_ray_joined", address=self.head.address, folder=str(self.folder))
            self._say_dashboard(self.head)
        self._heartbeat = threading.Thread(target=self._beat, name="local-ray-heartbeat", daemon=True)
        self._heartbeat.start()
        return self

    def start(self) -> None:
        """Start the folder's head unless one runs or a keeper is at work on one; never waits for it to be up.
        A keeper that holds the folder with no head up starts its head again (Ray timed out its start) or clears
        what it left, then exits: a keeper started now would only wait for its lock, so nothing starts until then
        (:meth:`ready` asks again)."""
        if self.head is not None:
            return
        with folder_lock(self.folder / "join.lock"):
            head = read_head(self.folder)  # another driver may have started one meanwhile
            if head is None:
                if is_kept(self.folder):
                    return
                head = self._start_head()
                self.started = True
            self.head = head
        self._say_dashboard(head)

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
        """Have a new keeper start the head (under ``join.lock``); its record, as the keeper wrote it (the head may
        have ended already: :meth:`ready` says so)."""
        dashboard_port = 0 if self.dashboard_port is None else self.dashboard_port or free_port()
        try:
            start_head(self.folder, self.settings, dashboard_port)
        except LedgerUnavailable as exc:  # the keeper's reason (it is no ledger's)
            raise InfraError(f"the local Ray head ({self.folder}) did not start: {exc}") from None
        head = head_record(self.folder)
        if head is None:
            raise InfraError(f"the local Ray head's keeper ({self.folder}) said it started it, but left no head.json")
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
        text = read_private(self.folder / HEAD_LOG) or ""
        return " | ".join(ln.strip() for ln in text.splitlines()[-lines:] if ln.strip())

    def ready(self) -> bool:
        """The head is up (starts it if none runs; never waits for Ray); InfraError when it ended and its keeper
        is gone (it clears what the head left, then exits). A head Ray timed out while starting is started again
        by its keeper: followed here through ``head.json``."""
        self.start()
        if self.head is None:
            return False  # a keeper is at work on the folder's head (start)
        head = read_head(self.folder)
        if head is None:
            if is_kept(self.folder):
                return False  # its keeper starts it again, or clears what it left before it exits
            raise InfraError(f"the local Ray head ({self.folder}) ended: {self._log_tail() or 'no output'}")
        if head != self.head:
            log.warning("local_ray_start_again", reason=SLOW_START_TEXT, pid=head.pid)
            self.head = head
        return READY_TEXT in (read_private(self.folder / HEAD_LOG) or "")

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
