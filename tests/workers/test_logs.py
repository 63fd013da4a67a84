"""JSON lines from many processes into one file, readable console lines, and no secrets anywhere."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
import ray
import structlog

from punchline.services.ray_settings import RaySettings
from punchline.workers.logs import (
    MAX_LINE_BYTES,
    configure_logging,
    get_logger,
    read_log,
    redact_text,
    reset_logging,
)


@pytest.fixture(autouse=True)
def _reset_logging() -> Iterator[None]:
    yield
    reset_logging()
    structlog.contextvars.clear_contextvars()
    assert not any(type(h).__name__ == "_StdlibBridge" for h in logging.getLogger().handlers)


def test_json_lines_and_console(tmp_path: Path) -> None:
    console = io.StringIO()
    path = configure_logging(tmp_path / "runs" / "r1", console=True, level="INFO", console_stream=console)
    assert path == tmp_path / "runs" / "r1" / "log.jsonl"
    log = get_logger("punchline.test", run_id="r1", stage="collect")
    log.info("shard_done", shard=3, units=8)
    log.debug("too_chatty")  # below INFO: dropped
    structlog.contextvars.bind_contextvars(attempt=2)
    log.warning("retrying", delay_s=0.5)

    events = list(read_log(path))
    assert [e["event"] for e in events] == ["shard_done", "retrying"]
    first = events[0]
    assert first["run_id"] == "r1" and first["stage"] == "collect" and first["shard"] == 3
    assert first["level"] == "info" and first["logger"] == "punchline.test"
    assert datetime.fromisoformat(first["timestamp"].replace("Z", "+00:00")).tzinfo is not None
    assert isinstance(first["pid"], int) and first["host"]
    assert events[1]["attempt"] == 2 and events[1]["level"] == "warning"

    text = console.getvalue()
    assert "shard_done" in text and "shard=3" in text and "too_chatty" not in text
    assert not text.lstrip().startswith("{")  # human format, not JSON


def test_secrets_are_redacted_everywhere(tmp_path: Path) -> None:
    console = io.StringIO()
    path = configure_logging(tmp_path, console=True, console_stream=console)
    openai_key = "sk-proj-" + "A1b2C3d4" * 5
    anthropic_key = "sk-ant-api03-" + "x9Y8z7W6" * 5
    log = get_logger()
    log.info(
        f"calling with {openai_key}",
        api_key="plain-looking-value",
        OPENAI_API_KEY="whatever",
        aws_secret_access_key="abc/def",
        password="hunter2",
        auth_token="t0k",
        headers={"Authorization": "Bearer abcdefghijklmnop", "x-api-key": anthropic_key},
        url="redis://:s3cr3tpw@db:6379/0",
        note=f"key is {anthropic_key}",
        aws_id="AKIAABCDEFGHIJKLMNOP",
        key="shards/0001.json",  # a store key: fine to log
        cache_key="ab12",
        batch_key="0f3a9c",  # a hash of a batch's request keys: what a reader greps the log for
        request_key="9e1d",
    )
    try:
        raise RuntimeError(f"provider said no to {openai_key}")
    except RuntimeError:
        log.exception("call_failed")

    raw = path.read_text() if path else ""
    for secret in [
        openai_key,
        anthropic_key,
        "plain-looking-value",
        "whatever",
        "abc/def",
        "hunter2",
        "t0k",
        "abcdefghijklmnop",
        "s3cr3tpw",
        "AKIAABCDEFGHIJKLMNOP",
    ]:
        assert secret not in raw, secret
        assert secret not in console.getvalue(), secret
    event = next(iter(read_log(path or "")))
    assert event["key"] == "shards/0001.json" and event["cache_key"] == "ab12"
    assert event["batch_key"] == "0f3a9c" and event["request_key"] == "9e1d"
    assert event["password"] == "***" and event["url"] == "redis://:***@db:6379/0"
    failed = list(read_log(path or ""))[1]
    assert "RuntimeError" in failed["exception"] and "***" in failed["exception"]


def test_redact_text_leaves_ordinary_text() -> None:
    assert redact_text("the sk-ier the better; task-12 done") == "the sk-ier the better; task-12 done"


def test_long_lines_are_capped(tmp_path: Path) -> None:
    path = configure_logging(tmp_path, console=False)
    get_logger().info("big", blob="x" * 20_000, tail="the end")
    line = (tmp_path / "log.jsonl").read_bytes().splitlines()[0]
    assert len(line) <= MAX_LINE_BYTES
    event = json.loads(line)
    assert event["truncated"] is True and event["tail"] == "the end" and event["event"] == "big"
    assert path is not None


def test_stdlib_warnings_pass_through(tmp_path: Path) -> None:
    path = configure_logging(tmp_path, console=False, stdlib=True)
    logging.getLogger("botocore.test").warning("retrying %s with token=%s", "PutObject", "sk-" + "q" * 30)
    events = [e for e in read_log(path or "") if e.get("logger") == "botocore.test"]
    assert len(events) == 1 and events[0]["level"] == "warning"
    assert "q" * 30 not in events[0]["event"]


_CHILD = """
import sys
from punchline.workers.logs import configure_logging, get_logger
configure_logging(None, console=False, json_path=sys.argv[1])
log = get_logger(worker=int(sys.argv[2]))
for i in range(300):
    log.info("tick", i=i, payload="p" * (100 + 37 * (i % 50)))
"""


@pytest.mark.slow  # Ray or several processes: not in `make test-fast`
def test_many_processes_append_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD, str(path), str(w)]) for w in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    lines = path.read_text().splitlines()
    assert len(lines) == 1200
    events = [json.loads(line) for line in lines]  # every line is whole JSON
    for w in range(4):
        mine = [e["i"] for e in events if e["worker"] == w]
        assert mine == list(range(300))  # each writer's lines in its own order


@ray.remote
class _LoggingActor:
    def __init__(self, path: str) -> None:
        configure_logging(None, console=False, json_path=path)
        self.log = get_logger("punchline.actor", actor=True)

    def work(self, n: int) -> int:
        for i in range(n):
            self.log.info("actor_tick", i=i, secret="nope")
        return n


@pytest.mark.slow  # Ray or several processes: not in `make test-fast`
def test_ray_actors_log_to_the_run_file(tmp_path: Path, ray_local: RaySettings) -> None:
    path = tmp_path / "log.jsonl"
    configure_logging(None, console=False, json_path=path)
    get_logger("punchline.driver").info("driver_start")
    actors = [_LoggingActor.remote(str(path)) for _ in range(2)]  # type: ignore[attr-defined]
    assert ray.get([a.work.remote(50) for a in actors], timeout=120) == [50, 50]
    events = list(read_log(path))
    ticks = [e for e in events if e["event"] == "actor_tick"]
    assert len(ticks) == 100 and all(e["secret"] == "***" for e in ticks)
    assert len({e["pid"] for e in ticks}) == 2
    assert events[0]["event"] == "driver_start"
    for a in actors:
        ray.kill(a)
