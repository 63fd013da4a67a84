"""What a user copies and reads from the commands: whole run ids, one line per job (issue 22)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from punchline.cluster.cli.main import main
from punchline.cluster.ray_cluster.ray_jobs import shorten
from punchline.cluster.run.driver import RunRecord, Services


def _record(run_id: str) -> RunRecord:
    return RunRecord(
        run_id=run_id,
        pipeline="puns",
        config_path="configs/demo.toml",
        config_toml="",
        created_at=0.0,
        services=Services(redis_url="redis://127.0.0.1:1/0", store_url="runs"),
        stages=["collect"],
        state="finished",
    )


def test_runs_shows_whole_run_ids_on_a_narrow_terminal(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    ids = ["demo-20261201-170234-46ad", "a-very-long-run-name-that-someone-chose-for-their-study-" + "x" * 60]
    for run_id in ids:
        (tmp_path / run_id).mkdir()
        (tmp_path / run_id / "run.json").write_bytes(msgspec.json.encode(_record(run_id)))
    assert main(["runs", "--runs-dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    for run_id in ids:
        assert sum(run_id in line for line in lines) == 1, "\n".join(lines)  # whole, on one line
        row = next(line for line in lines if run_id in line)
        assert "finished" in row


def test_a_job_message_is_one_short_line() -> None:
    trace = "Job failed due to an application error, last available logs:\n" + "\n".join(
        f"  File 'x.py', line {i}" for i in range(25)
    )
    assert shorten(trace) == "Job failed due to an application error, last available logs:"
    long = "x" * 300
    assert len(shorten(long)) == 160 and shorten(long).endswith("…")
    assert shorten("") == ""


def test_a_failed_jobs_line_shows_its_cause() -> None:
    """Ray's message is "failed with exit code N, last available logs" and the output: `jobs` shows why."""
    head = "Job entrypoint command failed with exit code 2, last available logs (truncated to 20,000 chars):\n"
    ours = head + "2026-12-03 [info] ledger_joined\npunchline: error: store /x is inside this Ray job's working dir\n"
    assert shorten(ours) == "exit 2: error: store /x is inside this Ray job's working dir"
    python = head + 'Traceback (most recent call last):\n  File "<frozen runpy>", line 198\n'
    python += "ModuleNotFoundError: No module named 'punchline'\n"
    assert shorten(python) == "exit 2: ModuleNotFoundError: No module named 'punchline'"


def test_a_wrong_password_given_as_a_query_parameter_is_one_line_and_never_shown(
    tmp_path: Path, make_config: Any, redis_server: Any, capsys: Any
) -> None:
    """`--redis-url redis://host:port/0?password=…` is the same ledger URL as `:…@`: checked at once, redacted."""
    host = redis_server.url.rsplit("@", 1)[1]  # 127.0.0.1:PORT/0
    url = f"redis://{host}?password=not-the-password-x9"
    code = main(["run", str(make_config()), "--runs-dir", str(tmp_path / "runs"), "--no-progress", "--redis-url", url])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "password" in err[0] and "not-the-password-x9" not in err[0] and redis_server.password not in err[0]
    assert not (tmp_path / "runs").exists()
