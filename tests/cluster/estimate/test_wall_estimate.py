"""``punchline plan``'s wall-time estimate: calls (rate limits, latency over concurrency, the cache) and fixed
costs, from an earlier run's log in the runs folder or from the defaults."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest

from punchline.cluster.cli.main import main
from punchline.cluster.config import RunConfig, load_config
from punchline.cluster.estimate import wall_estimate as w
from punchline.cluster.estimate.machine_load import MAX_SLOWDOWN, runnable_others, sample_runnable, slowdown
from punchline.cluster.pipeline import StageContext
from punchline.cluster.records.run_record import RunRecord, Services
from punchline.cluster.registry import pipeline_of
from punchline.cluster.run.planner import plan_run
from punchline.data.requests import ProviderResponse
from punchline.data.storage.response_cache import ResponseCache
from punchline.data.storage.run_layout import RunLayout
from punchline.data.stores.local import LocalStore
from punchline.schedulers.ledger import StageCounters

REPO = Path(__file__).resolve().parents[3]
DEMO = REPO / "configs" / "demo.toml"


def _demo(tmp_path: Path, replace: dict[str, str] | None = None, config: Path = DEMO) -> RunConfig:
    """The demo's config (or another of configs/), its sample path made absolute, with some text replaced."""
    text = config.read_text().replace('"../data/', f'"{REPO}/data/')
    for old, new in (replace or {}).items():
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / "demo.toml"
    path.write_text(text)
    return load_config(path)


def test_the_defaults_add_the_fixed_costs_to_the_calls(tmp_path: Path) -> None:
    cfg = _demo(tmp_path)
    estimates = plan_run(cfg)
    collect = next(e for e in estimates if e.stage == "collect")
    # 630 requests at 6,000 a minute: the rate limits bind (22.5 ms each over 8 slots would take 1.8 s)
    assert collect.calls_s == pytest.approx(630 / 6000 * 60) == collect.min_wall_s
    wall = w.estimate_wall(cfg, estimates, tmp_path / "runs")  # no runs folder yet
    assert wall.measured_in == "" and "defaults" in wall.describe()
    calls = sum(e.calls_s for e in estimates)
    # collect, classify, evaluate call; rank and cloze only reduce; classify's fork comes after the warm-up
    fixed = w.START_S + w.FIRST_WORKER_S + 3 * w.STAGE_S + 2 * w.PLAIN_STAGE_S + w.PROCESS_S
    assert wall.calls_s == pytest.approx(calls)
    assert wall.fixed_s == pytest.approx(fixed)
    assert wall.total_s == pytest.approx(calls + fixed) and wall.total_s > wall.least_s


def test_latency_over_the_concurrency_bounds_a_stage_without_rate_limits(tmp_path: Path) -> None:
    cfg = _demo(
        tmp_path,
        {
            "latency_ms_min = 5\nlatency_ms_max = 40\nerror_503_rate = 0.02": "latency_ms_min = 900\n"
            "latency_ms_max = 1100",
            "requests_per_minute = 6000\nmax_concurrency = 8": "max_concurrency = 3",
        },
    )
    collect = next(e for e in plan_run(cfg) if e.stage == "collect")
    assert collect.min_wall_s == 0  # no rate limit: the old estimate said nothing
    assert collect.calls_s == pytest.approx(630 * 1.0 / 3)


def test_requests_the_cache_answers_are_not_called(tmp_path: Path) -> None:
    cfg = _demo(tmp_path)
    cached = plan_run(cfg, cached=lambda request, key: True)
    assert all(e.cached_requests == e.requests and e.calls_s == 0 for e in cached)
    half = {
        e.stage: e for e in plan_run(cfg, cached=lambda request, key: request.model.endswith("405B-Instruct-Turbo"))
    }
    collect = half["collect"]
    assert collect.cached_requests == 630 // 5 and collect.calls_s == pytest.approx(504 / 100)
    # an upper-bound stage takes the cached share of the exact ones before it
    assert half["evaluate"].cached_requests == round(90 / 5)
    assert half["evaluate"].calls_s == pytest.approx(half["evaluate"].all_calls_s * 4 / 5)


def _ts(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def _recorded_run(runs: Path, run_id: str, units: dict[str, tuple[int, int]], events: list[tuple]) -> None:
    """A finished demo run in ``runs``: its record (units and cache hits per stage) and its log."""
    folder = RunLayout(run_id).local(runs)
    folder.folder.mkdir(parents=True)
    record = RunRecord(
        run_id=run_id,
        pipeline="puns",
        config_path="demo.toml",
        config_toml="",
        created_at=100.0,
        finished_at=200.0,
        state="finished",
        services=Services(redis_url="redis://x", store_url=str(runs)),
        stages=["collect", "classify", "rank", "cloze", "evaluate"],
        counters={s: StageCounters(units_total=n, units_done=n, cache_hits=hits) for s, (n, hits) in units.items()},
    )
    folder.record.write_bytes(msgspec.json.encode(record))
    lines = [{"event": "run_start", "timestamp": _ts(100.0)}]
    for t, event, stage, *more in events:
        lines.append({"event": event, "stage": stage, "timestamp": _ts(t), **(more[0] if more else {})})
    lines.append({"event": "shard_done", "stage": "collect", "timestamp": _ts(101.0), "elapsed_s": 0.2})
    lines.append({"event": "run_end", "state": "finished", "timestamp": _ts(113.6)})
    folder.log.write_text("".join(msgspec.json.encode(x).decode() + "\n" for x in lines))
    for stage, artifacts in {"rank": ["puns_ranked.json", "tiers.png"], "collect": ["raw_completions.json"]}.items():
        manifest = runs / RunLayout(run_id).manifest(stage)
        manifest.parent.mkdir(parents=True)
        manifest.write_bytes(msgspec.json.encode({"stage": stage, "artifacts": artifacts}))


EVENTS = [
    (100.1, "plan_start", "collect"),
    (100.6, "local_worker_ready", "collect"),
    (100.6, "start_phases", "", {"driver_start": 99.5}),
    (100.7, "stage_start", "collect"),
    (108.7, "reduce_start", "collect"),
    (108.8, "reduce_done", "collect"),
    (108.9, "plan_start", "classify"),
    (109.0, "fork_warmup_settling", "classify"),  # its fork waited 0.5 s for the warm-up: not its own cost
    (109.5, "local_worker_starting", "classify"),
    (109.7, "stage_start", "classify"),
    (110.0, "reduce_start", "classify"),
    (110.05, "reduce_done", "classify"),
    (110.1, "plan_start", "rank"),
    (110.1, "stage_start", "rank"),
    (110.1, "reduce_start", "rank"),
    (110.4, "reduce_done", "rank"),  # its figures: drawn in 0.3 s
    (110.5, "plan_start", "evaluate"),
    (110.6, "stage_start", "evaluate"),
    (111.6, "reduce_start", "evaluate"),
    (113.1, "reduce_done", "evaluate"),
]


def test_an_earlier_run_in_the_runs_folder_times_the_fixed_costs_and_the_calls(tmp_path: Path) -> None:
    cfg = _demo(tmp_path)
    runs = tmp_path / "runs"
    _recorded_run(runs, "demo-1", {"collect": (630, 0), "classify": (1, 0), "evaluate": (90, 0)}, EVENTS)
    estimates = {e.stage: e for e in plan_run(cfg)}
    measured = w.measure(runs, "puns")
    assert measured is not None and measured.run_id == "demo-1"
    assert measured.start_s == pytest.approx(0.6)  # the driver's start to collect's plan
    # plan to calls, and reduce's end to the next plan; the reduces apart
    assert measured.stages_s["collect"] == pytest.approx(0.7)
    assert measured.stages_s["classify"] == pytest.approx(0.35 + 0.3)  # its one call's 0.3 s too (no pace)
    assert measured.stages_s["rank"] == pytest.approx(0.1)
    assert measured.stages_s["evaluate"] == pytest.approx(0.6)
    assert measured.reduces_s == pytest.approx({"collect": 0.1, "classify": 0.05, "rank": 0.3, "evaluate": 1.5})
    assert measured.cached_reduces_s == {}  # no run that called nothing
    assert measured.figure_stages == ["rank"]  # its manifest lists a figure
    assert measured.paces_s == pytest.approx({"collect": 8.0 / 630, "evaluate": 1.0 / 90})
    assert measured.warmup_s == pytest.approx(109.5 - 100.6)

    wall = w.estimate_wall(cfg, list(estimates.values()), runs)
    assert wall.measured_in == "demo-1" and "demo-1" in wall.describe()
    # collect kept 8 s for its 630 units (slower than its rate limits' 6.3 s); cloze was not in that run's log
    calls = 8.0 + estimates["classify"].calls_s + max(1.0, estimates["evaluate"].calls_s)
    warmup_wait = (109.5 - 100.6) - 8.0  # classify's fork waits for the warm-up the first worker started
    fixed = 0.6 + 0.8 + warmup_wait + 0.7 + 0.4 + w.PLAIN_STAGE_S + 2.1 + w.PROCESS_S
    assert wall.calls_s == pytest.approx(calls)
    assert wall.total_s == pytest.approx(calls + fixed)

    # everything cached: no calls, no warm-up (no worker calls); rank's reduce copies its figure, the others redo
    cached = w.estimate_wall(cfg, plan_run(cfg, cached=lambda request, key: True), runs)
    assert cached.calls_s == 0 and cached.cached_requests == cached.requests > 0
    own = 0.6 + 0.7 + 0.65 + 0.1 + w.PLAIN_STAGE_S + 0.6 + w.PROCESS_S
    assert cached.total_s == pytest.approx(own + 0.1 + 0.05 + w.CACHED_REDUCE_S + 1.5)


def test_the_latest_run_gives_the_fixed_costs_an_earlier_one_the_paces(tmp_path: Path) -> None:
    cfg = _demo(tmp_path)
    runs = tmp_path / "runs"
    _recorded_run(runs, "demo-1", {"collect": (630, 0), "classify": (1, 0), "evaluate": (90, 0)}, EVENTS)
    _recorded_run(runs, "demo-2", {"collect": (630, 630), "classify": (1, 1), "evaluate": (90, 90)}, EVENTS)
    record = RunLayout("demo-2").local(runs).record
    rec = msgspec.json.decode(record.read_bytes(), type=RunRecord)
    record.write_bytes(msgspec.json.encode(msgspec.structs.replace(rec, finished_at=300.0)))
    measured = w.measure(runs, "puns", rerun=True)
    assert measured is not None and measured.run_id == "demo-2" and measured.runs == 1
    # demo-2 found every answer cached: its calls' spans are its own costs, its reduces a rerun's; the paces
    # and a fresh run's reduces are demo-1's
    assert measured.stages_s["collect"] == pytest.approx(0.7 + 8.0)
    assert measured.paces_s["collect"] == pytest.approx(8.0 / 630)
    assert measured.cached_reduces_s["evaluate"] == pytest.approx(1.5) == measured.reduces_s["evaluate"]
    rerun = w.estimate_wall(cfg, plan_run(cfg, cached=lambda request, key: True), runs)
    fresh = w.estimate_wall(cfg, plan_run(cfg), runs)
    assert rerun.measured_in == "demo-2" and fresh.measured_in == "demo-1"  # each from the runs like it
    own = 0.6 + (0.7 + 8.0) + (0.35 + 0.3) + 0.1 + w.PLAIN_STAGE_S + (0.6 + 1.0) + w.PROCESS_S
    assert rerun.total_s == pytest.approx(own + 0.1 + 0.05 + 0.3 + 1.5)  # demo-2's own reduces
    # a third run, fresh, started 0.4 s slower: a fresh run's start is the median of the two fresh runs'
    _recorded_run(runs, "demo-3", {"collect": (630, 0), "classify": (1, 0), "evaluate": (90, 0)}, EVENTS)
    log = RunLayout("demo-3").local(runs).log
    log.write_text(log.read_text().replace('"driver_start":99.5', '"driver_start":99.1'))
    both = w.measure(runs, "puns")
    assert both is not None and both.run_id == "demo-3" and both.runs == 2
    assert both.start_s == pytest.approx((0.6 + 1.0) / 2)
    assert "medians of 2 runs here" in w.estimate_wall(cfg, plan_run(cfg), runs).describe()
    # another pipeline's runs are not measured; an unreadable record hides none of the others
    assert w.measure(runs, "prompts") is None
    (runs / "junk").mkdir()
    (runs / "junk" / "run.json").write_text("{")
    assert w.measure(runs, "puns") is not None


def test_plan_prints_the_estimate_with_its_parts(tmp_path: Path, capsys) -> None:
    _demo(tmp_path)
    assert main(["plan", str(tmp_path / "demo.toml"), "--runs-dir", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert "wall time: about" in out and "calls" in out and "defaults, no earlier run here" in out


def test_a_stage_long_enough_for_ray_adds_its_start_when_the_worker_needs_help(tmp_path: Path) -> None:
    quick = _demo(tmp_path)
    assert w.estimate_wall(quick, plan_run(quick), tmp_path / "runs").ray_s == 0
    # collect held 63 s by its rate limit: more workers would only wait with the driver's (no Ray)
    held = _demo(tmp_path, {"requests_per_minute = 6000": "requests_per_minute = 600"})
    assert w.estimate_wall(held, plan_run(held), tmp_path / "runs").ray_s == 0
    # 64 s long at 0.8 s a call over its provider's 8 call places: the worker's window holds them all (no Ray) ...
    slow = {"latency_ms_min = 5\nlatency_ms_max = 40\n": "latency_ms_min = 800\nlatency_ms_max = 800\n"}
    one = _demo(tmp_path, {**slow, "requests_per_minute = 6000\n": ""})
    assert w.estimate_wall(one, plan_run(one), tmp_path / "runs").ray_s == 0
    # ... but a stage that calls two providers needs more places than one worker's window
    two_providers = {
        "latency_ms_min = 5\nlatency_ms_max = 40\n": "latency_ms_min = 2000\nlatency_ms_max = 2000\n",
        "requests_per_minute = 6000\n": "",
        '["8b", "70b"]': '["8b", "70b", "anthropic:sonnet"]',
    }
    two = _demo(tmp_path, two_providers, REPO / "configs" / "prompts_demo.toml")
    estimates = plan_run(two)
    generate = next(e for e in estimates if e.stage == "generate")
    assert generate.providers == 2 and generate.calls_s >= 10
    wall = w.estimate_wall(two, estimates, tmp_path / "runs")
    assert wall.ray_s == w.RAY_S and "Ray's start" in wall.describe()
    assert wall.total_s == pytest.approx(wall.calls_s + wall.fixed_s)


def test_the_cache_lookup_reads_the_runs_folders_packs(tmp_path: Path, capsys) -> None:
    cfg = _demo(tmp_path)
    runs = tmp_path / "runs"
    assert w.cache_lookup(str(runs)) is None  # no cache yet: nothing looked up
    collect = pipeline_of(cfg).stages(cfg)[0]
    requests = [u.request for u in collect.plan(StageContext(cfg, "plan", LocalStore(tmp_path / "scratch")))]
    ResponseCache(LocalStore(runs)).put(requests[0], ProviderResponse(texts=["a pun"]))
    cached = w.cache_lookup(w.store_of(cfg, str(runs)))
    assert cached is not None and cached(requests[0], requests[0].key()) and not cached(requests[1], requests[1].key())
    assert main(["plan", str(tmp_path / "demo.toml"), "--runs-dir", str(runs)]) == 0
    out = capsys.readouterr().out
    assert "1 cached" in out and f"1 of {sum(e.requests for e in plan_run(cfg))} requests answered" in out
    assert w.cache_lookup("s3://bucket/prefix") is None  # a remote store's packs are not listed


def test_the_fixed_costs_stretch_with_the_machines_load_against_their_runs(tmp_path: Path) -> None:
    """A busy machine stretches the run's CPU time (its fixed costs), not its provider's latency; a run measured on a
    busy machine is taken back to a quiet one's first (machine_load.py)."""
    cfg = _demo(tmp_path)
    estimates = plan_run(cfg)
    quiet = w.estimate_wall(cfg, estimates, tmp_path / "none", runnable_now=0.0)
    unknown = w.estimate_wall(cfg, estimates, tmp_path / "none")
    assert quiet.total_s == pytest.approx(unknown.total_s) and quiet.load_factor == 1.0
    assert "load now" not in quiet.describe()
    busy = w.estimate_wall(cfg, estimates, tmp_path / "none", runnable_now=4.0)
    factor = slowdown(4.0) / slowdown(0.0)
    assert factor > 1.0 and busy.load_factor == pytest.approx(factor)
    assert busy.calls_s == pytest.approx(quiet.calls_s)  # latency and rate limits do not care
    assert busy.fixed_s == pytest.approx(quiet.fixed_s * factor)
    assert f"x{factor:.1f} for the machine's load now (4 tasks runnable besides)" in busy.describe()

    runs = tmp_path / "runs"  # an earlier run, measured while 4 other tasks were runnable
    busy_start = (100.6, "start_phases", "", {"driver_start": 99.5, "runnable_others": 4.0})
    events = [busy_start if event[1] == "start_phases" else event for event in EVENTS]
    _recorded_run(runs, "demo-busy", {"collect": (630, 0), "classify": (1, 0), "evaluate": (90, 0)}, events)
    measured = w.measure(runs, "puns")
    assert measured is not None and measured.runnable == 4.0
    same = w.estimate_wall(cfg, estimates, runs, runnable_now=4.0)
    calmer = w.estimate_wall(cfg, estimates, runs, runnable_now=0.0)
    assert same.load_factor == pytest.approx(1.0)
    assert calmer.fixed_s == pytest.approx(same.fixed_s / factor)


def test_the_machines_runnable_tasks_are_read_from_the_kernel(tmp_path: Path) -> None:
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("0.52 0.58 0.59 3/226 12345\n")
    assert runnable_others(loadavg) == 2.0  # the reader itself is not the machine's other work
    assert sample_runnable(samples=3, gap_s=0.0, loadavg=loadavg) == 2.0
    loadavg.write_text("garbage\n")
    assert runnable_others(loadavg) is None and sample_runnable(loadavg=loadavg) is None
    assert runnable_others(tmp_path / "missing") is None
    assert runnable_others() is not None  # Linux: the real one answers
    assert slowdown(None) == 1.0 and slowdown(0.0, cores=2) == 1.0
    assert slowdown(2.0, cores=2) == pytest.approx(1.5) and slowdown(1000.0, cores=2) == MAX_SLOWDOWN
