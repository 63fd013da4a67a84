"""A user's own Redis (``--redis-url``) set up as ``docs/deploy.md`` says (issue 39, item 4): the run's user runs only
the scripts the loader loaded, and ``plan`` and ``run`` check them before anything starts; ``plan`` takes the Redis a
run would use, from ``--redis-url``, ``PUNCHLINE_REDIS_URL`` or the config (item 8b)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from punchline.cluster.cli.main import main
from punchline.schedulers import lua
from punchline.schedulers.server.ledger_access import LOADER_USER, RUN_USER, missing_scripts, setuser_lines
from punchline.services.redis_server import find_redis_server, free_port

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def user_redis(tmp_path: Path) -> Iterator[int]:
    """A bare server (no config of ours, as a user runs one) given the two documented users; its port."""
    port = free_port()
    proc = subprocess.Popen(
        [find_redis_server(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    admin = redis.Redis(port=port)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                admin.ping()
                break
            except redis.exceptions.ConnectionError:
                assert time.monotonic() < deadline and proc.poll() is None, "the server did not start"
                time.sleep(0.05)
        for line in setuser_lines("run-pw", "load-pw"):
            assert admin.execute_command(*line.split()) == b"OK", line  # each line as redis-cli sends it
        yield port
    finally:
        admin.close()
        proc.terminate()
        proc.wait(timeout=10)


def _url(port: int, user: str, password: str) -> str:
    return f"redis://{user}:{password}@127.0.0.1:{port}/0"


def test_the_deploy_docs_show_the_acl_lines_the_engine_makes() -> None:
    """The lines docs/deploy.md tells a user to run are the ones made from the allow-list the embedded ledger uses."""
    docs = (ROOT / "docs" / "deploy.md").read_text()
    for line in setuser_lines():
        assert f"\n{line}\n" in docs, line


def test_a_user_redis_set_up_as_documented_refuses_the_wipe(user_redis: int) -> None:
    run = redis.Redis.from_url(_url(user_redis, RUN_USER, "run-pw"))
    try:
        run.set("pl:x", "1")
        for command in (("EVAL", "return redis.call('DEL', KEYS[1])", "1", "pl:x"), ("SCRIPT", "LOAD", "return 1"),
                        ("SCAN", "0"), ("KEYS", "*"), ("DEL", "pl:x"), ("FLUSHALL",), ("CONFIG", "GET", "dir"),
                        ("ACL", "LIST")):  # fmt: skip
            with pytest.raises(redis.exceptions.NoPermissionError):
                run.execute_command(*command)
        assert run.get("pl:x") == b"1"
    finally:
        run.close()


def test_plan_and_run_refuse_a_user_redis_without_its_scripts_until_the_loader_loads_them(
    user_redis: int, make_config: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = make_config(jokes=2, models=("3b",), samples=1)
    run_url = _url(user_redis, RUN_USER, "run-pw")
    assert main(["plan", str(cfg), "--redis-url", run_url]) == 2
    err = capsys.readouterr().err
    assert "scripts are not loaded" in err and "python -m punchline.schedulers.server.ledger_access load" in err
    assert "run-pw" not in err
    here = ["--runs-dir", str(cfg.parent / "runs"), "--store", str(cfg.parent / "store"), "--no-progress"]
    assert main(["run", str(cfg), "--redis-url", run_url, *here]) == 2  # the same line, before anything starts
    assert "scripts are not loaded" in capsys.readouterr().err

    loaded = subprocess.run(
        [sys.executable, "-m", "punchline.schedulers.server.ledger_access", "load"],
        input=_url(user_redis, LOADER_USER, "load-pw") + "\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert loaded.returncode == 0, loaded.stderr
    assert "scripts loaded on redis://loader:***@" in loaded.stdout and "load-pw" not in loaded.stdout

    assert main(["plan", str(cfg), "--redis-url", run_url]) == 0
    out = capsys.readouterr().out
    assert f"ledger: redis://{RUN_USER}:***@127.0.0.1:{user_redis}/0 answers" in out and "run-pw" not in out
    client = redis.Redis.from_url(run_url)
    try:
        assert missing_scripts(client) == []
        renew = client.register_script(lua.script("run_claim_renew"))  # EVALSHA as the run's user
        assert renew(keys=["pl:c"], args=["me", 1000]) == 2
    finally:
        client.close()


def test_plan_takes_the_redis_url_from_the_flag_the_environment_or_the_config(
    redis_url: str,
    make_config: Callable[..., Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before: plan had no --redis-url and read no PUNCHLINE_REDIS_URL, so a Redis a run would refuse passed it."""
    cfg = make_config(jokes=2, models=("3b",), samples=1)
    wrong = redis_url.replace(redis_url.split("@")[0].split(":")[-1], "wrong-password", 1)
    assert main(["plan", str(cfg)]) == 0  # no Redis named: the embedded one, which plan does not start
    assert "ledger:" not in capsys.readouterr().out

    monkeypatch.setenv("PUNCHLINE_REDIS_URL", wrong)
    assert main(["plan", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "refused the password" in err and "wrong-password" not in err

    assert main(["plan", str(cfg), "--redis-url", redis_url]) == 0  # the flag over the environment
    assert "answers and holds the engine's scripts" in capsys.readouterr().out

    monkeypatch.delenv("PUNCHLINE_REDIS_URL")
    cfg.write_text(cfg.read_text().replace("[run]\n", f'[run]\nredis_url = "{wrong}"\n', 1))
    assert main(["plan", str(cfg)]) == 2  # [run] redis_url, as run reads it
    assert "refused the password" in capsys.readouterr().err


def test_a_redis_without_our_users_works_as_before(
    user_redis: int, make_config: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """A Redis whose one user may do anything (requirepass, as deployments had it): the run's check loads the
    scripts itself, with that user, and nothing more is asked of whoever runs it."""
    admin_url = f"redis://127.0.0.1:{user_redis}/0"  # the bare server's default user: no password, every command
    client = redis.Redis.from_url(admin_url)
    try:
        assert len(missing_scripts(client)) == len(lua.names()) - 2  # all but the two libraries
        assert main(["plan", str(make_config(jokes=2, models=("3b",), samples=1)), "--redis-url", admin_url]) == 0
        assert "answers and holds the engine's scripts" in capsys.readouterr().out
        assert missing_scripts(client) == []
    finally:
        client.close()
