"""The curate pipeline end to end: real Redis, real Ray, the fake provider over HTTP."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from punchline.cluster.run.driver import RunOptions, RunRecord, run
from punchline.pipelines.curate.curation import load_candidates
from punchline.pipelines.puns.data.puns_io import load_puns
from punchline.workers.fake.server import FakeProviderServer

CANDIDATES = Path(__file__).resolve().parents[3] / "data" / "samples" / "candidate_jokes.json"
TOP = 20
BATCH = 10


def curate_config(tmp: Path, fake: FakeProviderServer) -> Path:
    text = f"""
[run]
pipeline = "curate"
name = "t"
shard_size = 4
lease_ms = 3000
workers_per_node = 2

[providers.gem]
kind = "openai"
base_url = "{fake.openai_base_url}"
timeout_s = 5
max_retries = 8
max_malformed_retries = 4

[providers.gem.models]
flash = {{ id = "gemini-sim", input_usd_per_mtok = 0.3, output_usd_per_mtok = 2.5 }}

[providers.claude]
kind = "anthropic"
base_url = "{fake.anthropic_base_url}"
timeout_s = 5
max_retries = 8
max_malformed_retries = 4

[providers.claude.models]
sonnet = {{ id = "claude-sonnet-sim", input_usd_per_mtok = 3.0, output_usd_per_mtok = 15.0 }}
opus = {{ id = "claude-opus-sim", input_usd_per_mtok = 15.0, output_usd_per_mtok = 75.0 }}

[curate]
jokes = "{CANDIDATES}"
top = {TOP}
batch_size = {BATCH}
repair = {{ provider = "claude", model = "sonnet" }}

[curate.raters]
gemini = {{ provider = "gem", model = "flash" }}
anthropic = {{ provider = "claude", model = "sonnet" }}
claudecode = {{ provider = "claude", model = "opus" }}
"""
    path = tmp / "curate.toml"
    path.write_text(text)
    return path


def opts(tmp_path: Path, redis_url: str, run_id: str) -> RunOptions:
    return RunOptions(
        run_id=run_id, runs_dir=str(tmp_path / "runs"), redis_url=redis_url, store=str(tmp_path / "store")
    )


def artifact(tmp_path: Path, run_id: str, name: str) -> bytes:
    return (tmp_path / "store" / run_id / "artifacts" / name).read_bytes()


class Clean(NamedTuple):
    """The module's one clean curate run (run id ``c1`` in ``tmp``'s store): each test compares against it."""

    tmp: Path
    record: RunRecord
    calls: dict[str, int]  # what the provider was asked, request key -> times


@pytest.fixture(scope="module")
def clean(
    tmp_path_factory: pytest.TempPathFactory, fake_provider: FakeProviderServer, redis_url: str, ray_local: Any
) -> Clean:
    """One clean run for the module (a curate run is four stages: running it once instead of three times
    keeps the suite short)."""
    tmp = tmp_path_factory.mktemp("curate-clean")
    fake_provider.restore_defaults()
    fake_provider.reset()
    record = run(str(curate_config(tmp, fake_provider)), opts(tmp, redis_url, "c1"))
    calls = dict(fake_provider.stats().calls)
    fake_provider.reset()
    return Clean(tmp, record, calls)


@pytest.mark.slow
def test_curate_rates_repairs_and_builds_the_top_jokes_once(
    clean: Clean, fake: FakeProviderServer, redis_url: str, ray_local
) -> None:
    tmp_path, rec, calls = clean
    assert rec.state == "finished", rec.failures
    assert set(calls.values()) == {1}

    records = json.loads(artifact(tmp_path, "c1", "ratings.json"))
    candidates = load_candidates(CANDIDATES)
    assert [r["id"] for r in records] == [c.id for c in candidates]
    repaired = [r for r in records if r["repaired"]]
    weak = [r for r in records if sum(r["first"].values()) / 3 < 7.0]
    assert repaired and len(repaired) == len(weak)  # the simulator's repairs are always usable
    assert all(r["rerated"] is not None and r["final"] == r["rerated"] for r in repaired)
    batches = math.ceil(len(candidates) / BATCH)
    assert rec.counters["rate"].units_total == 3 * batches
    assert rec.counters["repair"].units_total == len(weak)
    assert rec.counters["rerate"].units_total == 3 * math.ceil(len(weak) / BATCH)
    assert len(calls) == 3 * batches + len(weak) + 3 * math.ceil(len(weak) / BATCH)

    # Stage 2 recomputed from ratings.json
    def key(r: dict) -> tuple:
        f = r["final"]
        return (-(f["gemini"] + f["claudecode"]), -f["anthropic"], -len(r["sentence"]), r["id"])

    expected = sorted(records, key=key)[:TOP]
    assert len({key(r)[0] for r in expected}) < TOP  # equal consensus scores: the tie-breaks matter
    curated_path = tmp_path / "store" / "c1" / "artifacts" / "puns_curated.json"
    curated = load_puns(curated_path)  # passes the puns_205 validation
    assert len(curated) == TOP
    assert [p.index for p in curated] == list(range(TOP))
    assert [(p.id, p.sentence) for p in curated] == [(r["id"], r["sentence"]) for r in expected]
    for p, r in zip(curated, expected, strict=True):
        f = r["final"]
        assert (p.gemini_rating, p.anthropic_rating, p.claudecode_rating) == (
            f["gemini"],
            f["anthropic"],
            f["claudecode"],
        )
        assert p.consensus_score == f["gemini"] + f["claudecode"]

    # a rerun with a new id on the same store pays for nothing and writes the same bytes
    fake.reset()
    rec2 = run(str(curate_config(tmp_path, fake)), opts(tmp_path, redis_url, "c2"))
    assert rec2.state == "finished", rec2.failures
    assert fake.stats().total_calls == 0
    for name in ("ratings.json", "puns_curated.json"):
        assert artifact(tmp_path, "c2", name) == artifact(tmp_path, "c1", name)


@pytest.mark.slow
def test_curate_with_provider_faults_writes_the_same_bytes(
    tmp_path: Path, clean: Clean, fake: FakeProviderServer, redis_url: str, ray_local
) -> None:
    cfg = curate_config(tmp_path, fake)
    fake.configure(error_503_rate=0.1, malformed_rate=0.05, truncated_body_rate=0.05)
    faulty = run(
        str(cfg),
        RunOptions(run_id="faulty", runs_dir=str(tmp_path / "runs"), redis_url=redis_url, store=str(tmp_path / "s2")),
    )
    assert clean.record.state == faulty.state == "finished", faulty.failures
    assert sum(fake.stats().faults.values()) > 0
    for name in ("ratings.json", "puns_curated.json"):
        b = tmp_path / "s2" / "faulty" / "artifacts" / name
        assert artifact(clean.tmp, "c1", name) == b.read_bytes()


@pytest.mark.slow
def test_retry_failed_after_a_rater_outage_replans_the_later_stages(
    tmp_path: Path, clean: Clean, fake: FakeProviderServer, redis_url: str, ray_local
) -> None:
    """A rater that failed leaves jokes unrated, so fewer are repaired; retry-failed re-rates them, the
    repair plan changes, and the stale repair/rerate shards are dropped instead of breaking the run."""
    from punchline.cluster.cli.main import main

    cfg = curate_config(tmp_path, fake)
    assert clean.record.state == "finished"
    fake.configure(status_for_model={"gemini-sim": 403})
    first = run(str(cfg), opts(tmp_path, redis_url, "outage"))
    assert first.state == "failed" and "rate" in first.failures
    assert all(uid.startswith("rate/gemini/") for uid in first.failures["rate"])
    fake.restore_defaults()
    assert main(["retry-failed", "outage", "--runs-dir", str(tmp_path / "runs"), "--no-progress"]) == 0
    ours = (tmp_path / "store" / "outage" / "artifacts" / "puns_curated.json").read_bytes()
    assert ours == artifact(clean.tmp, "c1", "puns_curated.json")
