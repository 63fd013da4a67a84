"""The keeper of a runs folder's local Ray head, and the head's parent: it starts ``ray start --head --block`` as
its own child (``python -m punchline.services.ray_keeper DIR --start LINGER_S CPUS STORE_BYTES
DASHBOARD_PORT``), starts it again when Ray timed out its start, stops it once no driver and no draining shard worker
has been there for the linger, removes its files, and exits when it is gone.

Why the keeper starts the head, not the driver that needs it: the head must end with whoever keeps it. Started by
a driver (in a session of its own, so that a ``kill -9`` of the driver does not reach it), the head's keeper was a
detached process beside it; once that keeper was killed with the driver, the head (its GCS, raylet, agents and
workers) ran on until the next driver joined the runs folder, maybe never. Now the keeper is the parent of the
``--block`` process, which gets the parent-death signal (:func:`keeper.die_with_parent`, SIGTERM, set before
``exec``): however the keeper ends, the kernel SIGTERMs the ``--block`` process, and Ray's SIGTERM handler stops
every process it started (the raylet stops its workers and agents). The head is told not to drain first
(``RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0``: a drain waits for an idle node, which a shard worker mid-call never
is, so a stop took 30 s); it then ends within about 2 s.

What stops the rest when the ``--block`` process is killed with the keeper, and who removes the head's files once
the keeper is gone: the keeper's **second** (:func:`after_keeper`, ``python -m ... DIR --after``), a small process
started by the keeper, that only reads a pipe from it (the record of each head it starts) until the pipe closes,
that is until the keeper ended, however it ended. It then waits (``SECOND_WAIT_S`` at most) for the ``--block``
process to end, SIGKILLs whatever of the head's session is left (Ray kills its own children when ``--block`` dies,
through the same signal, but its two agents would wait 60 s for a GCS that is gone, and a worker a few seconds),
and removes the head's files. A keeper that stopped its head itself leaves it nothing to do.

Its loop is the shared keeper's (``services/keeper.py``); what it keeps is :class:`KeptHead`. A module of its
own, beside the drivers' side (``services/local_ray.py``), so that it imports no logging stack and no Ray.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

import msgspec

from punchline.data.errors import LedgerUnavailable
from punchline.data.extras import ray_client_installed
from punchline.data.settings import LOCAL_RAY_LINGER_S
from punchline.services import keeper
from punchline.services.keeper import (
    FAILED,
    READY,
    START_FLAG,
    FolderHold,
    cmdline,
    live_clients,
    same_process,
    say,
    start_ticks,
    stat_fields,
)
from punchline.services.private_files import open_private, read_private, write_private
from punchline.services.ray_settings import RaySettings

KEEPER_MODULE = "punchline.services.ray_keeper"  # this module: the keeper's entry point
AFTER_FLAG = "--after"  # the keeper's second (after_keeper)
HEAD_FILE, HEAD_LOG = "head.json", "head.log"  # the running head's record; what `ray start` printed
READY_TEXT = "Ray runtime started"  # what `ray start` prints once the head's GCS and raylet are up
SLOW_START_TEXT = "timed out during startup"  # Ray gives its raylet 30 s (hard-coded): a loaded machine misses it
START_TRIES = 3  # a head that ended with SLOW_START_TEXT is started again, this many times in all
KEEPER_POLL_S = 1.0
STOP_WAIT_S = 60.0  # SIGTERM, then this long for the head's processes to end, then SIGKILL for those left
KILL_WAIT_S = 10.0  # SIGKILL, then this long for the head's processes to be gone (before its files are removed)
SECOND_WAIT_S = 10.0  # the keeper's second gives a head whose keeper ended (SIGTERMed by the kernel) this long
# a starting keeper waits this long for the last keeper (whose head ended) to let go of keeper.lock: it SIGKILLs
# what is left of its head first
TAKEOVER_S = KILL_WAIT_S + 3 * KEEPER_POLL_S
START_TIMEOUT_S = 60.0  # a driver waits this long for the keeper to say it started the head (not that it is up)
DRAIN_MAX_S = 900.0  # a killed driver's workers past this are stuck, not draining: the head is stopped anyway
WORKER_TITLE = "ray::ShardWorker"
# the longest --temp-dir whose socket paths fit Ray's 107 bytes: <temp>/session_<date>_<time>_<us>_<pid>/sockets/
# plasma_store adds 66 (a 7-digit pid); a longer runs folder's heads are given a short link to their folder
MAX_TEMP_DIR_BYTES = 107 - 66
SESSION_PREFIX, SHORT_PREFIX = "session-", "pl-ray-"  # a head's folder for Ray's files; its short link's folder
AUTH_MODE_ENV = "RAY_AUTH_MODE"  # Ray's token auth: on for our heads unless the user set it
TOKEN_ENV = "RAY_AUTH_TOKEN"  # a token the user gave Ray themselves (kept as it is)
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"  # where Ray reads the token from: our head's own file unless the user set one
TOKEN_FILE = "auth_token"  # the head's token, 0600 in its folder: never the user's ~/.ray (see docs/architecture.md)
DRAIN_ENV = "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"  # Ray waits this long on SIGTERM for an idle node: 0 for ours
NONE_ARG = "-"  # a sizing left to Ray, on the keeper's command line


class HeadRecord(msgspec.Struct, frozen=True):
    """The running head of one ``runs/_ray/<env>/`` folder (``head.json``, written by its keeper)."""

    pid: int  # the `ray start --block` process; also its session id, shared by every process of the head
    address: str  # 127.0.0.1:PORT, the head's GCS
    host: str
    started_at: float
    dashboard: str = ""  # http://127.0.0.1:PORT with --ray-dashboard or PUNCHLINE_LOCAL_RAY_DASHBOARD_PORT, else none
    session_dir: str = ""  # Ray's files of this head (its --temp-dir: sessions, logs, sockets), in the runs folder
    short_dir: str = ""  # a private /tmp folder whose link Ray was given instead, when session_dir is too long
    ticks: int = 0  # the `--block` process's start time (keeper.start_ticks): with the pid, its identity


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def head_command(settings: RaySettings, temp_dir: str, dashboard_port: int = 0) -> list[str]:
    """``ray start --head --block`` on the loopback; every port it would otherwise take at a fixed
    number (GCS 6379, client 10001, dashboard 8265, agent 52365) taken free, so heads never collide.
    ``temp_dir``: where Ray keeps the head's files (:func:`session_dirs`), never ``/tmp/ray``.
    ``dashboard_port``: Ray's dashboard on 127.0.0.1 there (behind the head's token), else none."""
    argv = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", f"--temp-dir={temp_dir}"]
    argv += [f"--port={free_port()}", "--node-ip-address=127.0.0.1"]
    if dashboard_port:
        argv += ["--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard_port}"]
    else:
        argv += ["--include-dashboard=false", f"--dashboard-port={free_port()}"]
    if ray_client_installed():  # else (no cluster extra) Ray starts no client server and refuses its port
        argv += [f"--ray-client-server-port={free_port()}"]
    argv += [f"--dashboard-agent-listen-port={free_port()}", "--disable-usage-stats"]
    if settings.num_cpus is not None:
        argv.append(f"--num-cpus={settings.num_cpus}")
    if settings.object_store_bytes is not None:
        argv.append(f"--object-store-memory={settings.object_store_bytes}")
    return argv


def auth_env(folder: Path) -> dict[str, str]:
    """The variables Ray needs to log in to the head of ``folder``: token auth on, and the token read from the
    head's own 0600 file (``runs/_ray/<env>/auth_token``), unless the user set the mode or a token themselves. So a
    machine with nothing in ``~/.ray`` (``ray start`` makes no token; only ``ray.init`` does) starts it."""
    env = {}
    if not os.environ.get(AUTH_MODE_ENV):
        env[AUTH_MODE_ENV] = "token"
    if not os.environ.get(TOKEN_ENV) and not os.environ.get(TOKEN_PATH_ENV):
        env[TOKEN_PATH_ENV] = str(folder / TOKEN_FILE)
    return env


def write_token(folder: Path) -> None:
    """A new random token for a head about to start: 0600, never through a link."""
    write_private(folder / TOKEN_FILE, secrets.token_hex(32))


def head_env(folder: Path) -> dict[str, str]:
    """The head's environment: the keeper's, that is its driver's (what the workers are to see: provider keys, S3
    settings, ``PUNCHLINE_*``), with token auth on the head's own token, the loopback only, and no drain on SIGTERM
    (the keeper's end stops the head at once: see the module's docstring)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", RAY_USAGE_STATS_ENABLED="0")
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # Ray's switch: bind the loopback, not every interface
    env[DRAIN_ENV] = "0"
    env.update(auth_env(folder))
    env.pop("RAY_ADDRESS", None)
    return env


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


def head_record(folder: Path) -> HeadRecord | None:
    """What ``head.json`` says (whether or not that head still runs), None if nothing readable."""
    try:
        return msgspec.json.decode(read_private(folder / HEAD_FILE) or "", type=HeadRecord)
    except msgspec.DecodeError:
        return None


def read_head(folder: Path) -> HeadRecord | None:
    """The folder's head if its process is still that head (not a reused pid), else None."""
    head = head_record(folder)
    if head is None or head.host != socket.gethostname() or not _is_head(head):
        return None
    return head


def _is_head(head: HeadRecord) -> bool:
    argv = cmdline(head.pid)
    return "--head" in argv and f"--port={head.address.rsplit(':', 1)[1]}" in argv


def session_processes(sid: int) -> list[int]:
    """Every live process of session ``sid`` (a head's: its GCS, raylet, agents and workers), from /proc. A pid is
    never reused while a process of the session it leads is left, so these are that head's, whoever reaped it."""
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


def stop_head(sid: int, wait_s: float = STOP_WAIT_S) -> None:
    """SIGTERM the head (it stops its children), then SIGKILL whatever of its session is left; returns once no
    process of it is left (or ``KILL_WAIT_S`` after the SIGKILL). ``sid`` must still be the head's process (this
    keeper's child, not yet reaped): a pid alone may name another process once it was reaped."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(sid, signal.SIGTERM)
    _wait_ended(sid, wait_s)
    kill_session(sid)


def kill_session(sid: int) -> None:
    """SIGKILL every process left of the session ``sid`` (safe after its leader was reaped: see
    :func:`session_processes`); returns once none is left, or after ``KILL_WAIT_S``."""
    for pid in session_processes(sid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _wait_ended(sid, KILL_WAIT_S)


def _wait_ended(sid: int, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    while session_processes(sid) and time.monotonic() < deadline:
        time.sleep(0.2)


class KeptHead:
    """What the keeper (:func:`keeper.watch`) keeps here: the head it started as its child (:meth:`start`), in use
    while a driver is registered or a killed driver's shard workers still drain (for ``DRAIN_MAX_S`` at the most).
    ``after``: the pipe to the keeper's second (:func:`after_keeper`), told of every head started."""

    def __init__(
        self, hold: FolderHold, settings: RaySettings, dashboard_port: int = 0, after: IO[bytes] | None = None
    ) -> None:
        self.hold = hold
        self.settings = settings
        self.dashboard_port = dashboard_port
        self.after = after
        self.proc: subprocess.Popen[bytes] | None = None
        self.head: HeadRecord | None = None  # the head last started: whose files to remove once it stopped
        self.tries = 0  # heads started (one more after each start Ray itself timed out)
        self.alone_since: float | None = None  # no driver left (workers may still drain)

    def start(self) -> HeadRecord:
        """Start a head as this keeper's child, in a session of its own (its id, the head's pid, names every process
        of the head), with the parent-death signal; record it in ``head.json`` (call holding ``keeper.lock``)."""
        folder = self.hold.real_path  # a path the head's own processes can use (the hold's is this process's)
        session_dir, short_dir = session_dirs(folder)
        temp_dir = str(short_dir / "t") if short_dir is not None else str(session_dir)
        argv = head_command(self.settings, temp_dir, self.dashboard_port)
        env = head_env(folder)
        try:
            if env.get(TOKEN_PATH_ENV) == str(folder / TOKEN_FILE):
                write_token(folder)
            fd = open_private(folder / HEAD_LOG, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            try:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=fd,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=folder,
                    start_new_session=True,  # its session: every process of the head, found by session_processes
                    close_fds=True,  # the pipe to the second among them: its end must be this keeper's end
                    preexec_fn=keeper.die_with_parent(signal.SIGTERM),
                )
            finally:
                os.close(fd)
        except (OSError, LedgerUnavailable):
            shutil.rmtree(session_dir, ignore_errors=True)
            if short_dir is not None:
                shutil.rmtree(short_dir, ignore_errors=True)
            raise
        self.tries += 1
        self.proc = proc
        self.head = HeadRecord(
            pid=proc.pid,
            address=f"127.0.0.1:{_port_of(argv)}",
            host=socket.gethostname(),
            started_at=time.time(),
            dashboard=f"http://127.0.0.1:{self.dashboard_port}" if self.dashboard_port else "",
            session_dir=str(session_dir),
            short_dir=str(short_dir or ""),
            ticks=start_ticks(proc.pid),
        )
        write_private(folder / HEAD_FILE, msgspec.json.encode(self.head).decode())
        self._tell_after(self.head)
        return self.head

    def _tell_after(self, head: HeadRecord) -> None:
        if self.after is not None:
            with contextlib.suppress(OSError):  # a second that died leaves the keeper keeping its head all the same
                self.after.write(msgspec.json.encode(head) + b"\n")
                self.after.flush()

    def running(self, folder: Path) -> int | None:
        """The head's pid while it runs; a head Ray timed out while starting is started again (``START_TRIES``)."""
        if self.proc is None or self.head is None:
            return None
        if self.proc.poll() is None:
            return self.proc.pid
        log = read_private(folder / HEAD_LOG) or ""
        if SLOW_START_TEXT in log and self.tries < START_TRIES:
            kill_session(self.head.pid)  # what the failed start left (its GCS may run on)
            remove_session(self.head, folder)
            return self.start().pid
        return None

    def in_use(self, folder: Path, pid: int) -> bool:
        now = time.monotonic()
        drivers = bool(live_clients(folder))
        self.alone_since = None if drivers else (self.alone_since or now)
        draining = not drivers and bool(shard_workers(pid))
        stuck = self.alone_since is not None and now - self.alone_since > DRAIN_MAX_S
        return drivers or (draining and not stuck)

    def retire(self, folder: Path) -> None:
        (folder / HEAD_FILE).unlink(missing_ok=True)  # a driver joining now starts a new head

    def stop(self, pid: int) -> None:
        stop_head(pid)
        self._reap_and_remove()

    def ended(self, folder: Path) -> None:
        """It ended on its own (not to be started again): what is left of it goes, then its record and files."""
        if self.head is not None:
            kill_session(self.head.pid)
            (folder / HEAD_FILE).unlink(missing_ok=True)  # this keeper's (a next keeper waits for keeper.lock)
        self._reap_and_remove()

    def stop_orphan(self, pid: int) -> None:
        """Stop the head whose folder is gone (the keeper checked ``pid`` is still that process); its link in
        ``/tmp`` goes too (its files went with the folder)."""
        stop_head(pid)
        self._reap_and_remove()

    def _reap_and_remove(self) -> None:
        """Ray's files of the head once no process of it is left (a process still running keeps them)."""
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=KILL_WAIT_S)
        if self.head is not None and not session_processes(self.head.pid):
            remove_session(self.head, self.hold.path)


def start_head(folder: Path, settings: RaySettings, dashboard_port: int) -> None:
    """Start the folder's head through a new keeper, its parent (call under ``join.lock``, with this driver
    registered); returns once the keeper started it and wrote ``head.json``, not once it is up (``head.log``
    says so). ``dashboard_port``: Ray's dashboard there, 0 for none. LedgerUnavailable with the keeper's reason
    when it cannot start it."""
    settings_args = [_arg(settings.num_cpus), _arg(settings.object_store_bytes), str(dashboard_port)]
    args = [str(LOCAL_RAY_LINGER_S.get()), *settings_args]
    keeper.spawn_starter(KEEPER_MODULE, folder, args, timeout_s=START_TIMEOUT_S)


def _arg(value: int | None) -> str:
    return NONE_ARG if value is None else str(value)


def _value(arg: str) -> int | None:
    return None if arg == NONE_ARG else int(arg)


def serve(folder: Path, linger_s: float, settings: RaySettings, dashboard_port: int) -> int:
    """A starting keeper (``--start``): take the folder's ``keeper.lock``, start its second, then the head as this
    process's child, say so to the driver waiting for it (:func:`keeper.say`), then keep it."""
    taken = keeper.take_folder(folder, "the local Ray head's folder", wait_s=TAKEOVER_S)
    if taken is None:
        return 1
    hold, fd = taken
    try:
        second = subprocess.Popen(
            [sys.executable, "-m", KEEPER_MODULE, str(folder), AFTER_FLAG],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            close_fds=True,  # keeper.lock's fd among them: the second must never hold the folder's lock
        )
        kept = KeptHead(hold, settings, dashboard_port, second.stdin)
        head = kept.start()
    except (OSError, LedgerUnavailable) as exc:
        os.close(fd)
        hold.close()
        say(f"{FAILED} the local Ray head could not start: {exc}")
        return 1
    say(READY)
    return keeper.watch(hold, fd, kept, linger_s=linger_s, poll_s=KEEPER_POLL_S, pid=head.pid, ticks=head.ticks)


def after_keeper(folder: Path) -> int:
    """The keeper's second: read the records of the heads the keeper starts from stdin (a pipe whose other end only
    the keeper holds) until it closes, when the keeper ended however it ended; then make sure the last head ended
    too: give its ``--block`` process ``SECOND_WAIT_S`` to stop (the kernel SIGTERMed it), SIGKILL what is left of its
    session, remove its files. Nothing is left to do when the keeper stopped its head itself."""
    hold = FolderHold(folder)
    try:
        head: HeadRecord | None = None
        for line in sys.stdin.buffer:
            with contextlib.suppress(msgspec.DecodeError):
                head = msgspec.json.decode(line, type=HeadRecord)
        if head is None:
            return 0
        deadline = time.monotonic() + SECOND_WAIT_S
        while same_process(head.pid, head.ticks) and time.monotonic() < deadline:
            time.sleep(0.2)
        kill_session(head.pid)  # the leader gone, nothing stops the rest of its session but this
        if not session_processes(head.pid):
            remove_session(head, hold.path)
        return 0
    finally:
        hold.close()


def main(argv: list[str]) -> int:
    if argv[2:3] == [AFTER_FLAG] and len(argv) == 3:
        return after_keeper(Path(argv[1]))
    if argv[2:3] == [START_FLAG] and len(argv) == 7:
        settings = RaySettings(num_cpus=_value(argv[4]), object_store_bytes=_value(argv[5]))
        return serve(Path(argv[1]), float(argv[3]), settings, int(argv[6]))
    usage = f"{START_FLAG} LINGER_S CPUS STORE_BYTES DASHBOARD_PORT | {AFTER_FLAG}"
    sys.exit(f"usage: python -m {KEEPER_MODULE} DIR {usage}")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
