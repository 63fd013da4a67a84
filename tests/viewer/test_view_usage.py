"""The models page's figures per stage and model come from the stage's sum (its manifest, or the viewer's kept sum),
not from its shard files: proven by corrupting every shard file once the sum exists. A stage without a sum is read
in steps ("partial: N of M shards read") and kept once whole."""

from __future__ import annotations

import http.client
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from bench.view import MODELS, generate
from punchline.data.storage.run_layout import RunLayout
from punchline.data.stores.local import LocalStore
from punchline.data.units import ShardUsage, StageManifest
from punchline.viewer.server import ViewServer, ViewSettings
from punchline.viewer.usage import RunUsage, shard_usage

RUN = "usage-run"
ROOT = Path(__file__).resolve().parents[2]


def _sum_of_shards(store: LocalStore, run_id: str, stage: str) -> ShardUsage:
    total = ShardUsage()
    for key in sorted(store.list(RunLayout(run_id).shards(stage))):
        total.add(shard_usage(store, key))
    return total


def _corrupt_shards(root: Path, run_id: str) -> int:
    files = list((root / run_id / "stages").glob("*/shards/*"))
    for f in files:
        f.write_bytes(b"\x00not a shard")
    return len(files)


def _models_page(runs: Path, run_id: str) -> str:
    server = ViewServer(ViewSettings(runs_dir=str(runs))).start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        conn.request("GET", f"/run/{run_id}/models")
        resp = conn.getresponse()
        body = resp.read().decode()
        assert resp.status == 200, body[:500]
        return body
    finally:
        server.close()


def _calls_on(page: str) -> dict[tuple[str, str], tuple[int, int, int]]:
    """(stage, model) -> (calls, retries, answered) as the page shows them."""
    rows = re.findall(
        r"<tr data-model='([^']+)' data-stage='([^']+)'><td>[^<]*</td><td>[^<]*</td><td>(\d+)</td>"
        r"<td class='retries'>(\d+)</td><td class='rate-limited'>\d+</td><td>(\d+)</td>",
        page,
    )
    return {(stage, model): (int(c), int(r), int(a)) for model, stage, c, r, a in rows}


def _expected(usage: ShardUsage, stage: str) -> dict[tuple[str, str], tuple[int, int, int]]:
    return {(stage, m): (u.calls, u.retries, sum(u.latency_counts)) for m, u in usage.models.items()}


def _wait(cond: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.05)


def test_the_models_page_shows_the_manifests_sum_with_every_shard_file_corrupt(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    generate(runs, RUN, 600, 20)  # a finished stage: its manifest carries the sum, as the coordinator writes it
    store = LocalStore(runs)
    whole = _sum_of_shards(store, RUN, "generate")
    manifest = msgspec.json.decode((runs / RUN / "stages/generate/manifest.json").read_bytes(), type=StageManifest)
    assert manifest.usage == whole
    expected = _expected(whole, "generate")
    assert set(expected) == {("generate", m) for m in MODELS} and all(c > 250 for c, _, _ in expected.values())
    assert _corrupt_shards(runs, RUN) == 30
    page = _models_page(runs, RUN)
    assert _calls_on(page) == expected
    assert "partial" not in page


def test_a_stage_without_a_sum_is_read_in_steps_then_kept_and_a_removed_shard_starts_it_over(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    generate(runs, RUN, 600, 20)
    store = LocalStore(runs)
    whole = _sum_of_shards(store, RUN, "generate")
    manifest_path = runs / RUN / "stages/generate/manifest.json"
    old = msgspec.json.decode(manifest_path.read_bytes(), type=StageManifest)
    manifest_path.write_bytes(msgspec.json.encode(msgspec.structs.replace(old, usage=None)))  # an older punchline's
    cache = runs / "_view" / RUN

    usage = RunUsage(store, RUN, cache_dir=cache, scan_s=0.0)  # a view reads nothing itself: the background does
    first = usage.read(["generate"])
    assert first.notes == ["generate: partial: 0 of 30 shards read (the rest are being read: reload)"]
    _wait(lambda: not usage.read(["generate"]).notes)
    assert usage.read(["generate"]).models["generate"] == whole.models
    assert (cache / "generate.usage").is_file()  # kept for the finished stage, under its manifest's digest

    _corrupt_shards(runs, RUN)
    again = RunUsage(store, RUN, cache_dir=cache, scan_s=0.0)  # the next start of the viewer
    kept = again.read(["generate"])
    assert kept.models["generate"] == whole.models and kept.notes == []
    assert _calls_on(_models_page(runs, RUN)) == _expected(whole, "generate")


def test_a_live_stage_counts_new_shards_and_starts_over_when_one_is_dropped(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    generate(runs, RUN, 600, 20)
    (runs / RUN / "stages/generate/manifest.json").unlink()  # not finished: no sum anywhere but the shards
    store = LocalStore(runs)
    shards = sorted((runs / RUN / "stages/generate/shards").iterdir())
    held = {p: p.read_bytes() for p in shards[20:]}
    for p in held:
        p.unlink()  # 20 of 30 shards committed so far
    usage = RunUsage(store, RUN, cache_dir=None)
    assert usage.read(["generate"], whole=True).models["generate"] == _sum_of_shards(store, RUN, "generate").models
    for p, raw in held.items():
        p.write_bytes(raw)  # the rest committed
    all_in = usage.read(["generate"], whole=True).models["generate"]
    assert all_in == _sum_of_shards(store, RUN, "generate").models
    shards[3].unlink()  # retry-failed dropped a shard: the sum is made again from what is there
    now = usage.read(["generate"], whole=True).models["generate"]
    assert now == _sum_of_shards(store, RUN, "generate").models
    assert sum(u.calls for u in now.values()) < sum(u.calls for u in all_in.values())


@pytest.mark.slow
def test_a_real_runs_manifests_carry_their_shards_usage(tmp_path: Path) -> None:
    """The coordinator writes each finished stage's sum into its manifest: the demo run, then its models page with
    every shard file corrupt."""
    runs, store_dir = tmp_path / "runs", tmp_path / "store"
    env = {**os.environ, "HOME": str(tmp_path / "home")}
    done = subprocess.run(
        [sys.executable, "-m", "punchline.cluster.cli.main", "run", "configs/demo.toml", "--run-id", "demo-usage",
         "--runs-dir", str(runs), "--store", str(store_dir), "--no-progress"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    store = LocalStore(store_dir)
    expected: dict[tuple[str, str], tuple[int, int, int]] = {}
    manifests = sorted((store_dir / "demo-usage" / "stages").glob("*/manifest.json"))
    assert manifests
    for path in manifests:
        manifest = msgspec.json.decode(path.read_bytes(), type=StageManifest)
        whole = _sum_of_shards(store, "demo-usage", manifest.stage)
        assert manifest.usage is not None and manifest.usage.models.keys() == whole.models.keys()
        for model, u in whole.models.items():
            got = manifest.usage.models[model]
            assert (got.calls, got.retries, got.latency_counts) == (u.calls, u.retries, u.latency_counts)
            assert got.cost_usd == pytest.approx(u.cost_usd)
        expected.update(_expected(whole, manifest.stage))
    assert any(calls for calls, _, _ in expected.values())
    _corrupt_shards(store_dir, "demo-usage")
    page = _models_page(runs, "demo-usage")
    assert {k: v for k, v in _calls_on(page).items() if k in expected} == expected
