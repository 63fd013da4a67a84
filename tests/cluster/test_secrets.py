"""A recognisable API key never reaches anything a run writes or prints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from punchline.cluster.cli import main
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
    cfg.write_text(text)
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
            "--redis-url",
            redis_url,
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
    assert SECRET[8:] not in printed.out + printed.err


def test_a_key_missing_on_the_workers_fails_the_run_with_the_reason(
    tmp_path: Path, make_config, fake: FakeProviderServer, redis_url: str, ray_local: Any, monkeypatch
) -> None:
    """The driver has the variable but the (already running) workers do not: no endless restarts."""
    from punchline.cluster.driver import RunOptions, run
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
