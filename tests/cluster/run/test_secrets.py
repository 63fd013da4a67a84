"""A recognisable API key never reaches anything a run writes or prints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from punchline.cluster.cli.main import main
from punchline.workers.fake.server import FakeProviderServer

pytestmark = pytest.mark.slow

SECRET = "sk-test-PUNCHLINE-4f9c2e7a1b"


def test_api_keys_never_reach_logs_status_records_or_checkpoints(
    tmp_path: Path, make_config, fake: FakeProviderServer, redis_url: str, ray_local: Any, monkeypatch, capsys
) -> None:
    key_file = tmp_path / "together.key"
    key_file.write_text(SECRET + "\n")
    cfg = make_config(jokes=2, models=("3b", "70b"), samples=2)
    text = cfg.read_text().replace('kind = "openai"\n', f'kind = "openai"\napi_key_file = "{key_file}"\n', 1)
    # the ledger's URL with its password in the config itself: run.json keeps the config, never the password
    text = text.replace("[run]\n", f'[run]\nredis_url = "{redis_url}"\n', 1)
    cfg.write_text(text)
    redis_password = urlsplit(redis_url).password
    assert redis_password
    # the 70b model rejects the key: error messages and failure reasons get written too
    fake.configure(status_for_model={"sim/llama-70b": 401})
    runs = str(tmp_path / "runs")
    code = main(
        [
            "run",
            str(cfg),
            "--run-id",
            "s1",
            "--runs-dir",
            runs,
            "--store",
            str(tmp_path / "store"),
            "--no-progress",
        ]
    )
    assert code == 1
    assert main(["status", "s1", "--runs-dir", runs]) == 0
    assert main(["status", "s1", "--json", "--runs-dir", runs]) == 0
    printed = capsys.readouterr()
    assert "401" in printed.out
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p != key_file]
    assert any(p.name == "log.jsonl" for p in written) and any(p.suffix == ".msgpack" for p in written)
    for path in written:
        data = path.read_bytes()
        assert SECRET[8:].encode() not in data, f"the API key leaked into {path}"
        if path != cfg:
            assert redis_password.encode() not in data, f"the Redis password leaked into {path}"
    assert SECRET[8:] not in printed.out + printed.err
    assert redis_password not in printed.out + printed.err
    assert ":***@" in json.loads((tmp_path / "runs" / "s1" / "run.json").read_text())["config_toml"]


def test_a_key_missing_on_the_workers_fails_the_run_with_the_reason(
    tmp_path: Path, make_config, fake: FakeProviderServer, redis_url: str, ray_local: Any, monkeypatch
) -> None:
    """The driver has the variable but the (already running) workers do not: no endless restarts."""
    from punchline.cluster.run.driver import RunOptions, run
    from punchline.data.errors import InfraError

    monkeypatch.setenv("PUNCHLINE_TEST_ONLY_IN_DRIVER", SECRET)
    cfg = make_config(jokes=1, models=("3b",), samples=2)
    text = cfg.read_text().replace(
        'kind = "openai"\n', 'kind = "openai"\napi_key_env = "PUNCHLINE_TEST_ONLY_IN_DRIVER"\n', 1
    )
    cfg.write_text(text)
    with pytest.raises(InfraError, match="PUNCHLINE_TEST_ONLY_IN_DRIVER is not set") as info:
        run(
            str(cfg),
            RunOptions(
                run_id="nokey", runs_dir=str(tmp_path / "runs"), redis_url=redis_url, store=str(tmp_path / "store")
            ),
        )
    assert SECRET[8:] not in str(info.value)
    assert fake.stats().total_calls == 0


def _scan(paths: list[Path], needles: dict[str, bytes]) -> list[str]:
    """Every (file, secret name) where a secret's bytes appear."""
    found = []
    for path in paths:
        try:
            if not path.is_file() or path.stat().st_size > 200 * 1024 * 1024:
                continue
            data = path.read_bytes()
        except OSError:  # sockets, files removed while we look
            continue
        found += [f"{path}: {name}" for name, needle in needles.items() if needle in data]
    return found


def test_a_default_run_keeps_every_credential_in_its_process(
    tmp_path: Path, make_config, fake: FakeProviderServer, ray_local: Any, monkeypatch, capsys
) -> None:
    """The embedded ledger's password and a provider key, scanned for in everything a run writes: the
    runs folder (records, logs, the ledger's AOF, log and config), the store, Ray's session folder
    (every process's logs), the GCS's job and actor tables, and the workers' constructor arguments."""
    import ray
    from ray._private import state

    from punchline.cluster.run.executors import shards

    key_file = tmp_path / "keys" / "together.key"
    key_file.parent.mkdir()
    key_file.write_text(SECRET + "\n")
    fake.configure(require_api_key=SECRET)  # every call needs the key: the workers must have read it
    cfg = make_config(jokes=2, models=("3b",), samples=2)
    cfg.write_text(cfg.read_text().replace('kind = "openai"\n', f'kind = "openai"\napi_key_file = "{key_file}"\n', 1))
    cfg.write_text(
        cfg.read_text().replace('kind = "anthropic"\n', f'kind = "anthropic"\napi_key_file = "{key_file}"\n')
    )
    actor_args: list[bytes] = []
    original = shards.WorkerPool.__init__

    def capture(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        actor_args.append(self.cfg_bytes)

    monkeypatch.setattr(shards.WorkerPool, "__init__", capture)
    runs = tmp_path / "runs"
    assert main(["run", str(cfg), "--run-id", "secrets", "--runs-dir", str(runs), "--no-progress"]) == 0
    assert main(["status", "secrets", "--json", "--runs-dir", str(runs)]) == 0
    printed = capsys.readouterr()
    # every call needs the key and the run finished: the workers read it (401s counted by the session's shared
    # fake may come from an earlier test's stragglers, so they are not this run's measure)
    assert fake.stats().ok > 0

    password_file = runs / "_ledger" / "password"
    password = password_file.read_text().strip()
    assert len(password) >= 32
    needles = {"provider key": SECRET[8:].encode(), "redis password": password.encode()}
    written = [p for p in tmp_path.rglob("*") if p not in (key_file, password_file)]
    assert any("appendonly" in p.name for p in written), "the ledger's AOF is part of the scan"
    assert any(p.name == "log.jsonl" for p in written) and any(p.name == "run.json" for p in written)
    assert _scan(written, needles) == []
    session = Path(ray._private.worker._global_node.get_session_dir_path())
    assert _scan(list(session.rglob("*")), needles) == []
    gcs = repr(state.jobs()) + repr(state.actors())
    assert all(n.decode() not in gcs for n in needles.values())
    assert actor_args and all(n not in blob for blob in actor_args for n in needles.values())
    assert all(n.decode() not in printed.out + printed.err for n in needles.values())
    record = (runs / "secrets" / "run.json").read_text()
    assert ":***@127.0.0.1:" in record  # the ledger is named, its password is not
