"""Helpers for engine tests: small Puns configs pointed at the session's fake provider."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from punchline.workers.fake.server import FakeProviderServer
from tests.conftest import SHARED_PUNS

SAMPLE = SHARED_PUNS / "puns_205.json"


# A joke the fake provider has never seen: it answers generic words, which the classify stage must send
# to the LLM (so a run with this joke always has at least one classification batch).
UNSEEN = {
    "index": 9000,
    "id": 9000,
    "sentence": "The lighthouse keeper retired because the job was no longer a ___",
    "straight": ["challenge", "priority"],
    "punny": ["beacon"],
    "explanation": "written for the tests",
}


def driver_argv(cfg: Path, run_id: str, tmp_path: Path, *services: str) -> list[str]:
    """``punchline run`` as a separate driver process (one the fault tests can kill -9), on the test's
    store and runs folder; ``services`` adds e.g. ``--redis-url``/``--ray-address``."""
    return [
        sys.executable,
        "-m",
        "punchline.cluster.cli.main",
        "run",
        str(cfg),
        "--run-id",
        run_id,
        "--store",
        str(tmp_path / "store"),
        "--runs-dir",
        str(tmp_path / "runs"),
        *services,
        "--no-progress",
    ]


def write_jokes(path: Path, n: int, *, unseen: bool = False) -> Path:
    jokes = json.loads(SAMPLE.read_text())[:n]
    if unseen:
        jokes.append(UNSEEN)
    path.write_text(json.dumps(jokes, indent=2))
    return path


def engine_config(
    tmp: Path,
    fake: FakeProviderServer,
    *,
    jokes: int = 6,
    models: tuple[str, ...] = ("3b", "70b"),
    samples: int = 4,
    shard_size: int = 2,
    lease_ms: int = 3000,
    workers_per_node: int = 2,
    classify: bool = False,
    unseen: bool = False,
    units_in_flight: int = 4,
    name: str = "cfg.toml",
) -> Path:
    """A collect(-and-classify) config; lease_ms is short so takeovers happen within the test."""
    jokes_path = write_jokes(tmp / "jokes.json", jokes, unseen=unseen)
    model_rows = "\n".join(
        f'"{m}" = {{ id = "sim/llama-{m}", input_usd_per_mtok = 1.0, output_usd_per_mtok = 2.0 }}' for m in models
    )
    text = f"""
[run]
pipeline = "puns"
name = "t"
shard_size = {shard_size}
lease_ms = {lease_ms}
workers_per_node = {workers_per_node}
units_in_flight = {units_in_flight}

[providers.sim]
kind = "openai"
base_url = "{fake.openai_base_url}"
max_concurrency = 4
timeout_s = 5
max_retries = 8
max_malformed_retries = 4

[providers.sim.models]
{model_rows}

[providers.claude]
kind = "anthropic"
base_url = "{fake.anthropic_base_url}"
timeout_s = 5

[providers.claude.models]
sonnet = {{ id = "claude-sonnet-sim" }}

[puns]
jokes = "{jokes_path}"
collect = {{ provider = "sim", models = {json.dumps(list(models))}, samples = {samples} }}
"""
    if classify:
        text += 'classify = { provider = "claude", model = "sonnet", batch_size = 10 }\n'
    path = tmp / name
    path.write_text(text)
    return path


@pytest.fixture
def make_config(tmp_path: Path, fake: FakeProviderServer):
    def make(**kw: object) -> Path:
        return engine_config(tmp_path, fake, **kw)  # type: ignore[arg-type]

    return make
