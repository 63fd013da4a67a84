"""End-to-end engine behaviour with real Redis, real Ray and the fake provider over HTTP."""

from __future__ import annotations

from pathlib import Path

import pytest

from punchline.cluster.run.driver import RunOptions, run
from punchline.data.stores import open_store
from punchline.workers.fake.server import FakeProviderServer


def artifact(store_dir: Path, run_id: str, name: str) -> bytes:
    return (store_dir / run_id / "artifacts" / name).read_bytes()


def opts(tmp_path: Path, redis_url: str, run_id: str, store: Path | None = None) -> RunOptions:
    return RunOptions(
        run_id=run_id, runs_dir=str(tmp_path / "runs"), redis_url=redis_url, store=str(store or tmp_path / "store")
    )


@pytest.mark.slow
def test_collect_and_classify_call_each_request_once_and_cache_across_runs(
    tmp_path: Path, make_config, fake: FakeProviderServer, redis_url: str, ray_local
) -> None:
    cfg = make_config(jokes=5, classify=True, unseen=True)
    rec = run(str(cfg), opts(tmp_path, redis_url, "r1"))
    assert rec.state == "finished", rec.failures
    stats = fake.stats()
    # 6 jokes x 2 models x (greedy + samples) + 1 classification batch (the unseen joke's generic words)
    assert rec.counters["classify"].units_total == 1
    assert len(stats.calls) == 6 * 2 * 2 + 1
    assert set(stats.calls.values()) == {1}
    raw = artifact(tmp_path / "store", "r1", "raw_completions.json")
    assert b'"total_samples"' in raw
    assert (tmp_path / "store" / "r1" / "artifacts" / "classified_completions.json").exists()
    assert rec.counters["collect"].units_done == 24 and rec.counters["collect"].provider_requests == 24

    # A second run of the same config (new id, same store) pays for nothing and writes the same bytes.
    fake.reset()
    rec2 = run(str(cfg), opts(tmp_path, redis_url, "r2"))
    assert rec2.state == "finished"
    assert fake.stats().total_calls == 0
    assert rec2.counters["collect"].cache_hits == 24
    assert artifact(tmp_path / "store", "r2", "raw_completions.json") == raw


@pytest.mark.slow
def test_retried_faults_give_the_same_artifacts(
    tmp_path: Path, make_config, fake: FakeProviderServer, redis_url: str, ray_local
) -> None:
    cfg = make_config(jokes=4)
    clean = run(str(cfg), opts(tmp_path, redis_url, "clean", tmp_path / "s1"))
    assert clean.state == "finished"
    fake.reset()
    fake.configure(error_503_rate=0.2, error_500_rate=0.05, malformed_rate=0.05, truncated_body_rate=0.05)
    faulty = run(str(cfg), opts(tmp_path, redis_url, "faulty", tmp_path / "s2"))
    assert faulty.state == "finished", faulty.failures
    assert sum(fake.stats().faults.values()) > 0
    assert artifact(tmp_path / "s1", "clean", "raw_completions.json") == artifact(
        tmp_path / "s2", "faulty", "raw_completions.json"
    )


@pytest.mark.slow
def test_fatal_errors_fail_units_and_the_run_goes_on(
    tmp_path: Path, make_config, fake: FakeProviderServer, redis_url: str, ray_local
) -> None:
    cfg = make_config(jokes=3)
    fake.configure(status_for_model={"sim/llama-70b": 404})
    rec = run(str(cfg), opts(tmp_path, redis_url, "fatal"))
    assert rec.state == "failed"
    failed = rec.failures["collect"]
    assert len(failed) == 3 * 2 and all("/70b/" in uid for uid in failed)
    assert all("404" in reason for reason in failed.values())
    # every 404 was tried exactly once
    assert all(n == 1 for n in fake.stats().calls.values())
    assert (tmp_path / "store" / "fatal" / "artifacts" / "raw_completions.json").exists()
    store = open_store(str(tmp_path / "store"))
    assert not store.exists("fatal/stages/collect/manifest.json")  # the stage is retried on resume


@pytest.mark.slow
def test_a_run_on_the_s3_store_matches_the_local_store(
    tmp_path: Path, make_config, fake: FakeProviderServer, redis_url: str, s3_url: str, ray_local
) -> None:
    """Workers read and write shards, cache and artifacts over HTTP (moto's server); same bytes as local."""
    cfg = make_config(jokes=4, classify=True, unseen=True)
    local = run(str(cfg), opts(tmp_path, redis_url, "on-disk", tmp_path / "local"))
    fake.reset()
    remote = run(
        str(cfg), RunOptions(run_id="on-s3", runs_dir=str(tmp_path / "runs"), redis_url=redis_url, store=s3_url)
    )
    assert local.state == remote.state == "finished"
    assert fake.stats().total_calls == len(fake.stats().calls)  # separate caches: each request once more
    s3 = open_store(s3_url)
    for name in ("raw_completions.json", "classified_completions.json"):
        assert s3.get(f"on-s3/artifacts/{name}") == artifact(tmp_path / "local", "on-disk", name)
    assert s3.exists("on-s3/stages/collect/manifest.json")
    assert any(k.startswith("_cache/") for k in s3.list("_cache/"))


@pytest.mark.slow
def test_units_in_flight_across_shards_give_the_same_bytes(
    tmp_path: Path, make_config, fake: FakeProviderServer, redis_url: str, ray_local
) -> None:
    one = make_config(jokes=5, name="one.toml")
    many = make_config(jokes=5, units_in_flight=7, workers_per_node=1, name="many.toml")
    a = run(str(one), opts(tmp_path, redis_url, "one", tmp_path / "s1"))
    fake.reset()
    b = run(str(many), opts(tmp_path, redis_url, "many", tmp_path / "s2"))
    assert a.state == b.state == "finished"
    assert set(fake.stats().calls.values()) == {1} and len(fake.stats().calls) == 5 * 2 * 2
    assert artifact(tmp_path / "s1", "one", "raw_completions.json") == artifact(
        tmp_path / "s2", "many", "raw_completions.json"
    )


@pytest.mark.slow
def test_split_n_requests_count_every_http_call(
    tmp_path: Path, make_config, fake: FakeProviderServer, redis_url: str, ray_local
) -> None:
    """Anthropic has no ``n``: a 4-sample unit is 4 HTTP calls, and status counts all of them."""
    cfg = make_config(jokes=3, samples=4)
    text = cfg.read_text().replace(
        'collect = { provider = "sim", models = ["3b", "70b"], samples = 4 }',
        'collect = { provider = "claude", models = ["sonnet"], samples = 4 }',
    )
    assert text != cfg.read_text()
    cfg.write_text(text)
    rec = run(str(cfg), opts(tmp_path, redis_url, "split"))
    assert rec.state == "finished", rec.failures
    assert rec.counters["collect"].units_done == 3 * 2
    assert fake.stats().total_calls == 3 * (1 + 4)
    assert rec.counters["collect"].provider_requests == 3 * (1 + 4)
