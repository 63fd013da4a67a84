"""``plan`` times a real endpoint's calls by the latencies this runs folder measured for that kind, ``base_url`` and
model (earlier runs' finished stages, any pipeline), else by its kind's default; the simulated provider by its
knobs."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from punchline.cluster.cli.main import main
from punchline.cluster.config import RunConfig, load_config
from punchline.cluster.estimate import latencies as lat
from punchline.cluster.estimate.call_time import DEFAULT_CALL_S
from punchline.cluster.estimate.wall_estimate import estimate_wall
from punchline.cluster.records.run_record import RunRecord, Services
from punchline.cluster.run.planner import plan_run
from punchline.data.storage.run_layout import RunLayout
from punchline.data.units import LATENCY_BUCKETS_S, ModelUsage, ShardUsage, StageManifest
from punchline.workers.fake.server import FakeProviderServer

REPO = Path(__file__).resolve().parents[3]
URL = "http://127.0.0.1:9/v1"
TOGETHER_8B = "meta-llama/Meta-Llama-3.1-8B-Instruct-Turbo"
TOGETHER_70B = "meta-llama/Meta-Llama-3.1-70B-Instruct-Turbo"
PROVIDERS = f"""
[providers.p]
kind = "openai"
base_url = "{URL}"
[providers.p.models]
m = {{ id = "model-a", input_usd_per_mtok = 1, output_usd_per_mtok = 1 }}
few = {{ id = "model-few", input_usd_per_mtok = 1, output_usd_per_mtok = 1 }}

[providers.other]
kind = "openai"
base_url = "https://api.example.com/v1/"
[providers.other.models]
m = {{ id = "model-a", input_usd_per_mtok = 1, output_usd_per_mtok = 1 }}

[providers.sim]
kind = "openai"
base_url = "simulated"
[providers.sim.models]
s = {{ id = "sim-model", input_usd_per_mtok = 0, output_usd_per_mtok = 0 }}
"""


def _usage(seconds: float, units: int) -> ModelUsage:
    counts = [0] * (len(LATENCY_BUCKETS_S) + 1)
    counts[3] = units
    return ModelUsage(calls=units, latency_sum_s=seconds, latency_counts=counts)


def _run(runs: Path, run_id: str, created_at: float, models: dict[str, ModelUsage], config: str = PROVIDERS) -> None:
    """A run of this runs folder (its store there too) whose one stage finished with these models' usage."""
    layout = RunLayout(run_id)
    record = RunRecord(
        run_id=run_id,
        pipeline="prompts",
        config_path="c.toml",
        config_toml=config,
        created_at=created_at,
        services=Services(redis_url="redis://x", store_url=str(runs)),
        stages=["generate", "judge"],  # judge never finished: no manifest
    )
    layout.local(runs).folder.mkdir(parents=True)
    layout.local(runs).record.write_bytes(msgspec.json.encode(record))
    manifest = runs / layout.manifest("generate")
    manifest.parent.mkdir(parents=True)
    usage = ShardUsage(models=models)
    manifest.write_bytes(
        msgspec.json.encode(StageManifest(stage="generate", units=9, shards=1, failed=0, artifacts=[], usage=usage))
    )


def test_the_latest_runs_pool_each_endpoints_mean_seconds_per_answered_unit(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    _run(runs, "older", 100.0, {"model-a": _usage(2.0, 10), "sim-model": _usage(9.0, 10)})
    _run(runs, "newer", 200.0, {"model-a": _usage(4.0, 10), "model-few": _usage(1.0, lat.MIN_UNITS - 1)})
    _run(runs, "unreadable", 300.0, {"model-a": _usage(99.0, 10)}, config="not = [toml")
    measured = lat.measured_latencies(runs)
    here = lat.Latency(unit_s=6.0 / 20, units=20, run_id="newer")
    # the same model behind another base_url is another endpoint (the trailing slash aside); the simulated
    # provider's is its knobs', not measured; a mean of too few units is not taken
    assert measured == {("openai", URL, "model-a"): here, ("openai", "https://api.example.com/v1", "model-a"): here}
    assert lat.measured_latencies(tmp_path / "nothing here") == {}


def _demo(tmp_path: Path) -> RunConfig:
    """The prompts demo against real endpoints: its calls can no longer be timed by the [simulator] knobs."""
    text = (REPO / "configs" / "prompts_demo.toml").read_text().replace('"../data/', f'"{REPO}/data/')
    text = text.replace('kind = "openai"\nbase_url = "simulated"', f'kind = "openai"\nbase_url = "{URL}"')
    text = text.replace(
        'kind = "anthropic"\nbase_url = "simulated"', 'kind = "anthropic"\nbase_url = "http://127.0.0.1:9"'
    )
    assert '"simulated"' not in text
    path = tmp_path / "real.toml"
    path.write_text(text)
    return load_config(path)


def test_plan_times_a_real_endpoint_by_its_kinds_default_then_by_what_was_measured(tmp_path: Path) -> None:
    cfg = _demo(tmp_path)
    generate, judge = plan_run(cfg)
    # 36 rows x 2 models, one request each (n in one call), over the provider's 8 calls in flight
    assert generate.requests == 72 and generate.timed_by == ["default"]
    assert generate.calls_s == pytest.approx(72 * DEFAULT_CALL_S["openai"] / 8)
    assert judge.calls_s == pytest.approx(judge.requests * DEFAULT_CALL_S["anthropic"] / 4)
    wall = estimate_wall(cfg, [generate, judge], tmp_path / "runs")
    assert "default latency" in wall.describe()

    measured = {
        ("openai", URL, TOGETHER_8B): lat.Latency(unit_s=0.1, units=50, run_id="r"),
        ("openai", URL, TOGETHER_70B): lat.Latency(unit_s=0.3, units=50, run_id="r"),
        ("openai", "http://elsewhere/v1", TOGETHER_70B): lat.Latency(unit_s=60.0, units=50, run_id="r"),
    }
    generate, judge = plan_run(cfg, latencies=measured)
    assert generate.timed_by == ["measured"] and judge.timed_by == ["default"]
    assert generate.calls_s == pytest.approx((36 * 0.1 + 36 * 0.3) / 8)
    assert "none measured here yet" in estimate_wall(cfg, [generate, judge], tmp_path / "runs").describe()
    generate_only = estimate_wall(cfg, [generate], tmp_path / "runs").describe()
    assert "latencies earlier runs here measured" in generate_only


def test_a_run_against_an_http_endpoint_gives_plan_its_latency(
    tmp_path: Path, fake: FakeProviderServer, make_config, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.configure(latency_ms_min=30, latency_ms_max=30)
    cfg_path: Path = make_config(jokes=6, models=("3b",), samples=2)
    runs = tmp_path / "runs"
    assert main(["plan", str(cfg_path), "--runs-dir", str(runs)]) == 0
    assert "default latency" in capsys.readouterr().out
    assert main(["run", str(cfg_path), "--runs-dir", str(runs), "--no-progress"]) == 0
    ((key, latency),) = lat.measured_latencies(runs).items()
    assert key == ("openai", fake.openai_base_url.rstrip("/"), "sim/llama-3b")
    assert latency.units == 6 * 2 and 0.03 <= latency.unit_s < 5.0
    capsys.readouterr()
    assert main(["plan", str(cfg_path), "--runs-dir", str(runs)]) == 0
    assert "latencies earlier runs here measured" in capsys.readouterr().out
