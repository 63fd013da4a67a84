"""The runs folder's local Ray head (services/local_ray.py, its keeper services/ray_keeper.py): it
outlives a kill -9 of its driver, a resume adopts it, two drivers share it, its keeper stops it (every process of it,
checked by pid) once no driver and no draining shard worker is left, and a killed keeper takes it along, files and all.

The keeper's rules are checked against stand-in heads (``tests/services/stand_in_keeper.py``: a process titled like
`ray start --head` whose child is titled like a Ray shard-worker actor), the rest against real `ray start` heads.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from punchline.data.errors import ConfigError
from punchline.services import ray_keeper
from punchline.services.keeper import cmdline, folder_lock, is_kept, start_ticks
from punchline.services.local_ray import LocalRay, ray_dir
from punchline.services.ray_keeper import (
    READY_TEXT,
    SLOW_START_TEXT,
    HeadRecord,
    ray_temp_dir,
    read_head,
    session_processes,
)
from punchline.services.ray_settings import RaySettings
from punchline.workers.fake.server import FakeProviderServer
from tests.cluster.run.test_faults import ROOT, wait_for
from tests.fixtures.engine import driver_argv
from tests.pipelines.prompts.test_prompts_pipeline import ROWS, _check_outputs, _outputs, prompts_config

SETTINGS = RaySettings(num_cpus=1, object_store_bytes=100 * 1024 * 1024)
# a driver in miniature: joins the folder's head (starting it if none), says where it is, then waits
MEMBER = textwrap.dedent(
    """
    import sys
    from punchline.services.local_ray import LocalRay
    from punchline.services.ray_settings import RaySettings
    head = LocalRay(sys.argv[1], RaySettings(num_cpus=1, object_store_bytes=100 * 1024 * 1024)).join()
    head.start()
    print("@", head.address, head.started, head.head.pid, flush=True)
    head.wait()
    print("@ ready", flush=True)
    sys.stdin.read()
    head.leave()
    """
)


STAND_IN_MODULE = "tests.services.stand_in_keeper"


def _member(runs: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", MEMBER, str(runs)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def _line(proc: subprocess.Popen[str]) -> list[str]:
    """The member's next own line (its log lines go to the same stdout)."""
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        assert line, "the member ended early"
        if line.startswith("@ "):
            return line.split()[1:]


def _said(proc: subprocess.Popen[str]) -> tuple[str, bool, int]:
    address, started, pid = _line(proc)
    return address, started == "True", int(pid)


def _wait_ready(proc: subprocess.Popen[str]) -> None:
    assert _line(proc) == ["ready"]


def _stand_in(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, kind: str, linger_s: float) -> tuple[Path, HeadRecord]:
    """A head's folder (no driver registered) whose keeper started a stand-in head of ``kind``; its record."""
    folder = tmp_path / "runs" / "_ray" / "env"
    (folder / "clients").mkdir(parents=True, mode=0o700)
    _use_stand_in(monkeypatch, tmp_path, kind)
    monkeypatch.setenv("PUNCHLINE_LOCAL_RAY_LINGER_S", str(linger_s))
    ray_keeper.start_head(folder, SETTINGS, 0)
    head = read_head(folder)
    assert head is not None and head.short_dir, "a test's runs folder is too long a path: Ray gets a short link"
    assert Path(head.session_dir).parent == folder and Path(ray_temp_dir(head)).resolve() == Path(head.session_dir)
    return folder, head


def _use_stand_in(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, kind: str) -> Path:
    """Keepers started from now on start stand-in heads of ``kind``; the file where they log each head's argv."""
    monkeypatch.setattr(ray_keeper, "KEEPER_MODULE", STAND_IN_MODULE)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the keeper imports the stand-in from the tests
    monkeypatch.setenv("STAND_IN_HEAD", kind)
    monkeypatch.setenv("STAND_IN_LOG", str(tmp_path / "heads.jsonl"))
    return tmp_path / "heads.jsonl"


def _keepers(folder: Path) -> list[int]:
    """The keeper and its second, of ``folder`` (found by their command lines)."""
    found = []
    for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
        argv = cmdline(pid)
        if str(folder) in argv and ({"--start", "--after"} & set(argv)) and start_ticks(pid):  # 0: a zombie
            found.append(pid)
    return found


def _leaves_nothing(folder: Path, head: HeadRecord, within_s: float = 30.0) -> None:
    """No process of the head, no keeper of it, none of its files."""
    wait_for(lambda: not session_processes(head.pid) and not _keepers(folder), timeout_s=within_s)
    wait_for(lambda: not Path(head.session_dir).exists() and not Path(head.short_dir).exists(), timeout_s=10)


def _head_gone(pid: int, timeout_s: float = 180.0) -> None:
    """No process of the head's session is left (its GCS, raylet, agents, workers)."""
    wait_for(lambda: not session_processes(pid), timeout_s=timeout_s)


@pytest.fixture
def linger(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> float:
    """The keeper's linger for this test (its drivers and keepers read it from the environment)."""
    seconds = float(getattr(request, "param", 1.0))
    monkeypatch.setenv("PUNCHLINE_LOCAL_RAY_LINGER_S", str(seconds))
    return seconds


def test_keeper_waits_for_draining_workers_then_stops_every_process_of_the_head(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, head = _stand_in(monkeypatch, tmp_path, "draining", linger_s=0.2)  # its worker busy for 3 s
    assert is_kept(folder) and len(_keepers(folder)) == 2  # the keeper, and its second
    wait_for(lambda: not session_processes(head.pid), timeout_s=60)
    assert time.time() - head.started_at >= 2.5, "the keeper stopped the head while a shard worker was still draining"
    _leaves_nothing(folder, head)  # Ray's files of the head went with it: its folder, and the short link in /tmp
    assert not (folder / "head.json").exists()


@pytest.mark.parametrize("how", ["moved", "deleted"])
def test_a_runs_folder_moved_or_deleted_during_the_linger_leaves_nothing_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """The keeper holds its folder open: a runs folder renamed (or removed) while the head lingers still has its
    head stopped, every process of it, and its files removed (from where the folder is now)."""
    folder, head = _stand_in(monkeypatch, tmp_path, "draining", linger_s=3.0)
    time.sleep(1.0)  # the keeper holds the folder, within its linger
    if how == "moved":
        (tmp_path / "runs").rename(tmp_path / "runs-renamed")
    else:
        subprocess.run(["rm", "-rf", str(tmp_path / "runs")], check=True)
    wait_for(lambda: not session_processes(head.pid) and not _keepers(folder), timeout_s=120)
    assert not Path(head.short_dir).exists(), "the head's link in /tmp outlived it"
    if how == "moved":  # its files, in the runs folder where it is now: removed too
        assert not list((tmp_path / "runs-renamed").rglob("session-*"))


@pytest.mark.parametrize("killed", [["keeper"], ["keeper", "head"]])
def test_a_killed_keeper_takes_its_head_along_every_process_and_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, killed: list[str]
) -> None:
    """``kill -9`` of the keeper: the kernel SIGTERMs the head (its child, with the parent-death signal), and the
    keeper's second SIGKILLs what of the head's session is left (here a worker deaf to SIGTERM, as Ray's agents are
    to a dead GCS for 60 s) and removes its files; the same when the head's ``--block`` process is killed too."""
    folder, head = _stand_in(monkeypatch, tmp_path, "stuck", linger_s=600.0)
    wait_for(lambda: len(session_processes(head.pid)) == 2, timeout_s=30)
    keeper_pid = next(pid for pid in _keepers(folder) if "--start" in cmdline(pid))
    for pid in [keeper_pid] + ([head.pid] if "head" in killed else []):
        os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    _leaves_nothing(folder, head)
    gone_s = time.monotonic() - killed_at
    print(f"head, keepers and files gone {gone_s:.1f} s after the kill -9 of the {' and the '.join(killed)}")
    assert gone_s < 15.0


def test_a_driver_leaves_the_head_to_a_keeper_at_work_on_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, linger: float
) -> None:
    """A keeper that starts its head again (or clears what it left) holds ``keeper.lock`` with no head up: a driver
    starts no head of its own meanwhile (its keeper would wait for that lock, then fail the run), and starts one
    once that keeper is gone."""
    heads_log = _use_stand_in(monkeypatch, tmp_path, "draining")
    member = LocalRay(tmp_path / "runs", SETTINGS).join()
    try:
        with folder_lock(member.folder / "keeper.lock"):  # a keeper at work
            assert not member.ready() and not member.ready()
            assert member.head is None and not heads_log.exists()
        assert member.wait(60).startswith("127.0.0.1:") and member.started
        assert len(heads_log.read_text().splitlines()) == 1
    finally:
        member.leave()
    assert member.head is not None
    _leaves_nothing(member.folder, member.head)


def test_the_keeper_imports_no_logging_stack_and_no_ray() -> None:
    probe = "import sys, punchline.services.ray_keeper; print(sorted({'structlog', 'ray'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
@pytest.mark.parametrize("linger", [30.0], indirect=True)  # longer than a resume takes to arrive
def test_head_outlives_a_killed_driver_is_adopted_and_stopped_once_no_driver_is_left(
    tmp_path: Path, linger: float
) -> None:
    runs = tmp_path / "runs"
    first = _member(runs)
    address, started, pid = _said(first)
    assert started and address.startswith("127.0.0.1:")
    _wait_ready(first)
    first.kill()  # kill -9: the head is in its own session, the driver's death does not reach it
    first.wait()
    resume = LocalRay(runs, SETTINGS).join()  # the resume: joins the running head, starts none
    try:
        assert (resume.address, resume.started, resume.head and resume.head.pid) == (address, False, pid)
        assert resume.wait(60) == address
    finally:
        resume.leave()
    stopped_at = time.monotonic()
    _head_gone(pid, timeout_s=linger + 180)
    assert time.monotonic() - stopped_at >= linger / 2, "the keeper did not linger"
    assert read_head(resume.folder) is None and not (resume.folder / "head.json").exists()


# a notebook: Ray imported first, then a run joins the folder's head (token auth on) and leaves it at its end
NOTEBOOK = textwrap.dedent(
    """
    import sys
    import ray
    from punchline.cluster.run.run_services import LazyRay
    from punchline.services.local_ray import LocalRay
    from punchline.services.ray_settings import RaySettings
    settings = RaySettings(num_cpus=1, object_store_bytes=100 * 1024 * 1024)
    with LocalRay(sys.argv[1], settings) as head:
        lazy = LazyRay(head, settings, lambda: None)
        assert lazy(True) and ray.is_initialized()
        assert ray.get(ray.remote(lambda: 42).remote()) == 42
        lazy.close()
        print("@", ray.is_initialized(), head.head.pid, flush=True)
    """
)


@pytest.mark.slow
def test_a_process_that_imported_ray_joins_the_head_and_leaves_it(tmp_path: Path, linger: float) -> None:
    done = subprocess.run(
        [sys.executable, "-c", NOTEBOOK, str(tmp_path / "runs")], capture_output=True, text=True, cwd=ROOT, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said = next(ln.split()[1:] for ln in done.stdout.splitlines() if ln.startswith("@ "))
    assert said[0] == "False"  # disconnected: a next run in that process joins whatever head is up then
    _head_gone(int(said[1]))


@pytest.mark.slow
def test_two_drivers_on_one_folder_share_one_head(tmp_path: Path, linger: float) -> None:
    runs = tmp_path / "runs"
    members = [_member(runs), _member(runs)]  # at the same moment: the join lock makes one head
    try:
        said = [_said(m) for m in members]
        assert said[0][0] == said[1][0] and said[0][2] == said[1][2]
        assert sorted(s[1] for s in said) == [False, True]
        for m in members:
            _wait_ready(m)
    finally:
        for m in members:
            m.communicate("", timeout=60)  # leave: unregistered, the keeper stops the head after the linger
    _head_gone(said[0][2])


@pytest.mark.slow
@pytest.mark.parametrize("linger", [30.0], indirect=True)  # longer than a resume takes to arrive
def test_default_local_ray_kill_9_and_resume_adopt_the_head_each_request_asked_once(
    tmp_path: Path, fake: FakeProviderServer, redis_url: str, linger: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No --ray-address: the driver starts the folder's head, works while it starts, is killed mid-run
    while Ray's workers have calls in flight; the resume joins the same head, the killed driver's workers
    drain into it, and the keeper stops it when both are gone."""
    units = ROWS * 2
    cfg = prompts_config(tmp_path, fake, rows=ROWS, shard_size=4)
    fake.configure(latency_ms_min=600, latency_ms_max=900)  # Ray's workers join before the run is over
    # ... asked to, as the driver's own worker waits on its calls (alone, it would finish without Ray)
    monkeypatch.setenv("PUNCHLINE_LOCAL_RAY_CPU_SHARE", "0")
    argv = driver_argv(cfg, "killed-head", tmp_path, "--redis-url", redis_url)
    folder = ray_dir(tmp_path / "runs")
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def head_of_run() -> HeadRecord | None:
        heads = [read_head(f) for f in folder.glob("*") if f.is_dir()]
        return next((h for h in heads if h is not None), None)

    def ray_workers_calling() -> bool:
        head = head_of_run()
        titles = [_title(p) for p in session_processes(head.pid)] if head is not None else []
        return any(t.startswith("ray::ShardWorker.work") for t in titles) or proc.poll() is not None

    wait_for(ray_workers_calling, timeout_s=300)
    time.sleep(2.0)  # the Ray workers' first calls are in flight
    assert proc.poll() is None, f"driver ended before the kill: {proc.stderr.read().decode()[-2000:]}"  # type: ignore[union-attr]
    head = head_of_run()
    assert head is not None
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert fake.stats().total_calls < units
    resumed = subprocess.run(argv, cwd=ROOT, capture_output=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr.decode()[-3000:]
    assert head_of_run() == head, "the resume did not adopt the head the killed driver started"
    assert len([f for f in folder.iterdir() if f.is_dir()]) == 1  # and started none of its own
    jsonl, _ = _outputs(tmp_path, "store", "killed-head")
    _check_outputs(jsonl)
    _head_gone(head.pid, timeout_s=300)  # the keeper stopped it: drivers gone, the drained workers ended
    calls = fake.stats().calls
    assert len(calls) == units
    twice = {key: n for key, n in calls.items() if n > 1}
    # every worker drained its calls in flight into the head: the Ray workers (detached actors) and the
    # driver's own worker (a process of its own): none is asked twice
    assert not twice, f"{len(twice)} request(s) asked twice: {twice}"


def _dashboard_asks_for_the_token(dashboard: str, token: str) -> None:
    """Ray's dashboard answers with the head's token (once it listens), and refuses without it."""

    def status(headers: dict[str, str]) -> int:
        request = urllib.request.Request(f"{dashboard}/api/version", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return 0  # not listening yet

    wait_for(lambda: status({"Authorization": f"Bearer {token}"}) == 200, timeout_s=180)
    assert status({}) in (401, 403), "the dashboard answered without the head's token"


def _title(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.slow
def test_the_default_path_starts_the_folders_head_on_a_machine_with_nothing_in_home(
    tmp_path: Path, fake: FakeProviderServer, linger: float
) -> None:
    """A stranger's machine: HOME empty (no ``~/.ray/auth_token``; ``ray start`` makes none). The run is big
    enough for the folder's head, which starts with a token of its own (0600, in its folder), handed to the
    head, its workers and the driver; nothing is written into HOME's ``.ray``; nothing is left running."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"), XDG_CONFIG_HOME=str(home / ".config"))
    env["PUNCHLINE_LOCAL_RAY_CPU_SHARE"] = "0"  # Ray's workers join the long stage though its worker waits on calls
    cfg = prompts_config(tmp_path, fake, rows=ROWS, shard_size=4)
    fake.configure(latency_ms_min=600, latency_ms_max=900)  # Ray's workers join before the run is over
    folder = ray_dir(tmp_path / "runs")
    seen: dict[str, object] = {}
    proc = subprocess.Popen(
        driver_argv(cfg, "empty-home", tmp_path), cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )

    def head_up() -> bool:
        for sub in (f for f in folder.glob("*") if f.is_dir()):
            head = read_head(sub)
            if head is not None:
                seen["head"], seen["folder"] = head, sub
                environ = Path(f"/proc/{head.pid}/environ").read_bytes().split(b"\0")
                seen["env"] = dict(e.decode().split("=", 1) for e in environ if b"=" in e)
                return True
        return proc.poll() is not None

    wait_for(head_up, timeout_s=300)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err.decode()[-3000:]
    assert "head" in seen, "the run never needed the folder's head: make it bigger"
    token = seen["folder"] / "auth_token"  # type: ignore[operator]
    assert token.is_file() and (token.stat().st_mode & 0o777) == 0o600
    head_env = seen["env"]
    assert isinstance(head_env, dict)
    assert head_env["RAY_AUTH_MODE"] == "token" and head_env["RAY_AUTH_TOKEN_PATH"] == str(token)
    assert not (home / ".ray").exists(), "the user's ~/.ray was written"
    log = (tmp_path / "runs" / "empty-home" / "log.jsonl").read_text()
    assert '"worker": "punchline:empty-home' in log, "no shard was done by a Ray worker of the head"
    assert b"ledger_joined" not in out, "a log line went to stdout"
    jsonl, _ = _outputs(tmp_path, "store", "empty-home")
    _check_outputs(jsonl)
    head = seen["head"]
    assert isinstance(head, HeadRecord)
    _head_gone(head.pid, timeout_s=linger + 180)


@pytest.mark.parametrize(
    ("name", "value", "field"),
    [("RAY_AUTH_TOKEN_PATH", "/no/such/token", "RAY_AUTH_TOKEN_PATH"), ("RAY_AUTH_MODE", "tokn", "RAY_AUTH_MODE")],
)
def test_a_head_that_could_not_start_is_refused_when_the_run_joins_before_any_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, value: str, field: str
) -> None:
    """The head starts only when a stage needs it (maybe after batches were paid for), so what it needs is
    proven when the driver joins the folder: a user's Ray auth setting that would stop it is one line then."""
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as raised:
        LocalRay(tmp_path / "runs", SETTINGS).join()
    assert raised.value.field == field


def test_joining_writes_the_heads_token_privately_and_never_into_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    head = LocalRay(tmp_path / "runs", SETTINGS).join()
    try:
        assert (head.token_path.stat().st_mode & 0o777) == 0o600 and len(head.token_path.read_text()) == 64
        assert head.auth_env() == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(head.token_path)}
        head.auth_for_join()  # as the driver does before ray.init (Ray not imported here: nothing to refresh)
        assert os.environ["RAY_AUTH_TOKEN_PATH"] == str(head.token_path)
    finally:
        head.leave()
    assert "RAY_AUTH_TOKEN_PATH" not in os.environ and "RAY_AUTH_MODE" not in os.environ  # put back on leave
    assert not (tmp_path / "home").exists()
    monkeypatch.setenv("RAY_AUTH_TOKEN", "the-users-own")  # a user's own token is used as it is
    assert "RAY_AUTH_TOKEN_PATH" not in LocalRay(tmp_path / "runs2", SETTINGS).auth_env()


@pytest.mark.slow
def test_the_heads_dashboard_behind_a_flag_asks_for_the_heads_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, linger: float
) -> None:

    from tests.fixtures.ray_start import free_port

    port = free_port()
    monkeypatch.setenv("PUNCHLINE_LOCAL_RAY_DASHBOARD_PORT", str(port))
    member = _member(tmp_path / "runs")
    try:
        _address, started, pid = _said(member)
        assert started
        _wait_ready(member)
        folder = next(f for f in ray_dir(tmp_path / "runs").iterdir() if f.is_dir())
        head = read_head(folder)
        assert head is not None and head.dashboard == f"http://127.0.0.1:{port}"
        token = (folder / "auth_token").read_text()
        _dashboard_asks_for_the_token(head.dashboard, token)
    finally:
        member.communicate("", timeout=60)
    _head_gone(pid)


# a driver in miniature asking for the dashboard (``--ray-dashboard PORT``: argv[2]), or not (no argv[2])
DASHBOARD_MEMBER = MEMBER.replace(
    "RaySettings(num_cpus=1, object_store_bytes=100 * 1024 * 1024))",
    "RaySettings(num_cpus=1, object_store_bytes=100 * 1024 * 1024), int(sys.argv[2]) if sys.argv[2:] else None)",
)


def _dashboard_member(runs: Path, *port: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", DASHBOARD_MEMBER, str(runs), *port],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def test_ray_dashboard_flag_is_a_run_option_with_an_optional_port(capsys: pytest.CaptureFixture[str]) -> None:
    from punchline.cluster.cli.main import build_parser
    from punchline.cluster.cli.shared import run_options

    parser = build_parser()
    given = {
        (): None,
        ("--ray-dashboard",): 0,
        ("--ray-dashboard=0",): 0,
        ("--ray-dashboard", "8270"): 8270,
    }
    for flags, port in given.items():
        assert run_options(parser.parse_args(["run", "c.toml", *flags])).ray_dashboard_port == port, flags
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "c.toml", "--ray-dashboard=70000"])
    assert "70000 is not a port" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "--help"])
    assert "--ray-dashboard [PORT]" in capsys.readouterr().out


@pytest.mark.slow
def test_ray_dashboard_flag_on_a_free_port_prints_its_url_and_asks_for_the_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, linger: float
) -> None:

    monkeypatch.delenv("PUNCHLINE_LOCAL_RAY_DASHBOARD_PORT", raising=False)
    member = _dashboard_member(tmp_path / "runs", "0")  # 0: a free port
    try:
        _address, started, pid = _said(member)
        assert started
        folder = next(f for f in ray_dir(tmp_path / "runs").iterdir() if f.is_dir())
        head = read_head(folder)
        assert head is not None and head.dashboard.startswith("http://127.0.0.1:")
        assert int(head.dashboard.rsplit(":", 1)[1]) > 0
        _wait_ready(member)
        token = (folder / "auth_token").read_text()
        _dashboard_asks_for_the_token(head.dashboard, token)
    finally:
        _out, err = member.communicate("", timeout=60)
    said = [ln for ln in err.splitlines() if "dashboard" in ln]
    assert said == [
        f"punchline: Ray's dashboard: {head.dashboard}; it asks for the head's token, in {folder}/auth_token"
    ]
    _head_gone(pid)


@pytest.mark.slow
def test_ray_dashboard_flag_on_a_shared_head_without_one_says_so_and_keeps_the_head(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, linger: float
) -> None:
    monkeypatch.delenv("PUNCHLINE_LOCAL_RAY_DASHBOARD_PORT", raising=False)
    runs = tmp_path / "runs"
    first = _dashboard_member(runs)  # an earlier run, no dashboard asked: the head starts without one
    second: subprocess.Popen[str] | None = None
    try:
        address, started, pid = _said(first)
        assert started
        second = _dashboard_member(runs, "0")
        joined = _said(second)
        assert joined == (address, False, pid), "the head was restarted for the dashboard"
        head = read_head(next(ray_dir(runs).iterdir()))
        assert head is not None and head.pid == pid and head.dashboard == ""
        _wait_ready(second)
    finally:
        first.communicate("", timeout=60)
        _out, err = second.communicate("", timeout=60) if second is not None else ("", "")
    said = [ln for ln in err.splitlines() if "dashboard" in ln]
    assert len(said) == 1 and "started by an earlier run without a dashboard" in said[0], err[-2000:]
    _head_gone(pid)


def test_a_head_that_ray_timed_out_while_starting_is_started_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, linger: float
) -> None:
    """Ray gives a new node 30 s to register (hard-coded) and ends `ray start` when a loaded machine misses that:
    that is no failure of the run's, so the keeper starts the head again, and the driver follows it (seen at load
    15 in a suite run)."""
    heads_log = _use_stand_in(monkeypatch, tmp_path, "slow-once")
    head = LocalRay(tmp_path / "runs", SETTINGS).join()
    try:
        assert head.wait().startswith("127.0.0.1:")
        argvs = [json.loads(line) for line in heads_log.read_text().splitlines()]
        assert len(argvs) == 2 and SLOW_START_TEXT in " ".join(argvs[0])
        assert head.started and head.head is not None and read_head(head.folder) == head.head
        assert READY_TEXT in (head.folder / "head.log").read_text()  # the second one started
        # each head its own folder for Ray's files, in the runs folder (a long path: Ray is given a short link to it)
        temp_dirs = [next(a for a in argv if a.startswith("--temp-dir=")).split("=", 1)[1] for argv in argvs[1:]]
        assert temp_dirs == [ray_temp_dir(head.head)]
        # the failed start's files went with it: one head, one folder of Ray's files
        assert [p.name for p in head.folder.glob("session-*")] == [Path(head.head.session_dir).name]
        assert Path(head.head.session_dir).parent == head.folder and Path(temp_dirs[0]).resolve() == Path(
            head.head.session_dir
        )
    finally:
        head.leave()
    if head.head is not None:
        _leaves_nothing(head.folder, head.head, within_s=linger + 120)
