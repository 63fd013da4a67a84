"""Replay: upstream checkpoints imported into the cache drive an offline run that calls nothing and
reproduces upstream's completions; an offline cache miss fails the unit and names the request."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from punchline.cluster.cli.main import main
from punchline.cluster.run.driver import RunOptions, run
from punchline.data.storage.jsonio import decode_file
from punchline.pipelines.puns.data.schemas import RawCompletions
from punchline.pipelines.puns.legacy import UPSTREAM_MODELS
from punchline.workers.fake.server import FakeProviderServer

pytestmark = pytest.mark.slow

JOKES = 12


def _config(tmp: Path, fake: FakeProviderServer, shared_puns: Path, models: dict[str, str]) -> Path:
    jokes = json.loads((shared_puns / "puns_205.json").read_text())[:JOKES]
    (tmp / "jokes.json").write_text(json.dumps(jokes, indent=2))
    rows = "\n".join(f'"{nick}" = {{ id = "{mid}" }}' for nick, mid in models.items())
    path = tmp / "replay.toml"
    path.write_text(f"""
[run]
pipeline = "puns"
shard_size = 10
offline = true

[providers.together]
kind = "openai"
base_url = "{fake.openai_base_url}"

[providers.together.models]
{rows}

[puns]
jokes = "{tmp / "jokes.json"}"
collect = {{ provider = "together", models = {json.dumps(list(models))}, samples = 20 }}
""")
    return path


def test_offline_replay_of_upstream_checkpoints_calls_nothing_and_reproduces_them(
    tmp_path: Path, shared_puns: Path, fake: FakeProviderServer, redis_url: str, ray_local: Any
) -> None:
    upstream = json.loads((shared_puns / "raw_completions.json").read_text())
    head = {k: upstream[k] for k in list(upstream)[:JOKES]}
    (tmp_path / "raw.json").write_text(json.dumps(head, indent=2))
    store = tmp_path / "store"
    assert main(["import-legacy", "--raw", str(tmp_path / "raw.json"), "--store", str(store)]) == 0

    cfg = _config(tmp_path, fake, shared_puns, UPSTREAM_MODELS)
    rec = run(
        str(cfg), RunOptions(run_id="replay", runs_dir=str(tmp_path / "runs"), redis_url=redis_url, store=str(store))
    )
    assert rec.state == "finished", rec.failures
    assert fake.stats().total_calls == 0
    assert rec.counters["collect"].cache_hits == JOKES * 5 * 2
    ours: RawCompletions = decode_file(store / "replay" / "artifacts" / "raw_completions.json", RawCompletions)
    theirs: RawCompletions = decode_file(tmp_path / "raw.json", RawCompletions)
    for key, entry in theirs.items():
        # word lists were extended upstream after collection; what the models said is identical
        assert ours[key].prompt == entry.prompt
        assert ours[key].models == entry.models
        assert ours[key].aggregated == entry.aggregated


def test_offline_cache_miss_fails_the_unit_and_names_the_request(
    tmp_path: Path, shared_puns: Path, fake: FakeProviderServer, redis_url: str, ray_local: Any
) -> None:
    cfg = _config(tmp_path, fake, shared_puns, {"tiny": "never/imported-1b"})
    rec = run(
        str(cfg),
        RunOptions(run_id="miss", runs_dir=str(tmp_path / "runs"), redis_url=redis_url, store=str(tmp_path / "store")),
    )
    assert rec.state == "failed"
    assert fake.stats().total_calls == 0
    reasons = rec.failures["collect"]
    assert len(reasons) == JOKES * 2
    reason = reasons["collect/00000/tiny/samples"]
    assert "CacheMiss" in reason and "never/imported-1b" in reason and "n=20" in reason
