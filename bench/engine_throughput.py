"""Benchmark: engine throughput against a provider with fixed latency, and the cost of a replay.

    .venv/bin/python bench/engine_throughput.py [--jokes 40] [--latency-ms 80]

One local Ray, one embedded redis-server, the fake provider answering after ``--latency-ms``. Runs the
Puns collect stage (jokes x 5 models x (greedy + 20 samples)) three times, each in a fresh store:
  baseline   1 worker per node, 1 unit at a time per shard (shard_size 1)
  engine     the demo's settings (2 workers per node, shards of 8 units run concurrently)
and then the engine run again on the same store (every answer a cache hit). Prints wall times and the
ratios against the baseline measured in the same process. Ray start-up is excluded (Ray is started once).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from punchline.cluster.driver import RunOptions, run  # noqa: E402
from punchline.cluster.ray_runtime import RaySettings, ensure_ray, shutdown_ray  # noqa: E402
from punchline.cluster.redis_server import EmbeddedRedis  # noqa: E402
from punchline.workers.fake.server import FakeConfig, FakeProviderServer  # noqa: E402

MODELS = {
    "3b": "meta-llama/Llama-3.2-3B-Instruct-Turbo",
    "8b": "meta-llama/Meta-Llama-3.1-8B-Instruct-Turbo",
    "70b": "meta-llama/Meta-Llama-3.1-70B-Instruct-Turbo",
    "3.3-70b": "meta-llama/Llama-3.3-70B-Instruct-Turbo",
    "405b": "meta-llama/Meta-Llama-3.1-405B-Instruct-Turbo",
}


def config(tmp: Path, base_url: str, jokes: Path, *, shard_size: int, workers: int, name: str) -> Path:
    rows = "\n".join(f'"{k}" = {{ id = "{v}" }}' for k, v in MODELS.items())
    path = tmp / f"{name}.toml"
    path.write_text(f"""
[run]
pipeline = "puns"
shard_size = {shard_size}
workers_per_node = {workers}

[providers.together]
kind = "openai"
base_url = "{base_url}"
max_concurrency = 16

[providers.together.models]
{rows}

[puns]
jokes = "{jokes}"
collect = {{ provider = "together", models = {json.dumps(list(MODELS))}, samples = 20 }}
""")
    return path


def timed(cfg: Path, tmp: Path, redis_url: str, store: str, run_id: str) -> float:
    t0 = time.perf_counter()
    rec = run(str(cfg), RunOptions(run_id=run_id, runs_dir=str(tmp / "runs"), redis_url=redis_url, store=store))
    elapsed = time.perf_counter() - t0
    assert rec.state == "finished", rec.failures
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jokes", type=int, default=40)
    ap.add_argument("--latency-ms", type=float, default=80.0)
    args = ap.parse_args()
    sample = json.loads((ROOT / "data" / "samples" / "puns_sample.json").read_text())[: args.jokes]
    units = len(sample) * len(MODELS) * 2
    with tempfile.TemporaryDirectory() as tmp_s, EmbeddedRedis(Path(tmp_s) / "redis") as redis_server:
        tmp = Path(tmp_s)
        jokes = tmp / "jokes.json"
        jokes.write_text(json.dumps(sample))
        ensure_ray(RaySettings(num_cpus=2))
        fake = FakeProviderServer(FakeConfig(latency_ms_min=args.latency_ms, latency_ms_max=args.latency_ms))
        fake.start()
        try:
            base_cfg = config(tmp, fake.openai_base_url, jokes, shard_size=1, workers=1, name="baseline")
            eng_cfg = config(tmp, fake.openai_base_url, jokes, shard_size=8, workers=2, name="engine")
            t_base = timed(base_cfg, tmp, redis_server.url, str(tmp / "s-base"), "baseline")
            t_eng = timed(eng_cfg, tmp, redis_server.url, str(tmp / "s-eng"), "engine")
            calls = fake.stats().total_calls
            t_replay = timed(eng_cfg, tmp, redis_server.url, str(tmp / "s-eng"), "replay")
            assert fake.stats().total_calls == calls, "the replay called the provider"
        finally:
            fake.stop()
            shutdown_ray()
    print(f"units per run: {units} ({args.jokes} jokes x {len(MODELS)} models x 2), latency {args.latency_ms:.0f} ms")
    print(f"baseline (1 worker, 1 unit at a time): {t_base:6.2f} s  {units / t_base:7.1f} units/s")
    print(
        f"engine   (2 workers, shards of 8)    : {t_eng:6.2f} s  {units / t_eng:7.1f} units/s"
        f"  speed-up x{t_base / t_eng:.1f}"
    )
    print(
        f"replay   (same store, all cached)    : {t_replay:6.2f} s  {units / t_replay:7.1f} units/s"
        f"  x{t_base / t_replay:.1f} vs baseline, 0 provider calls"
    )


if __name__ == "__main__":
    main()
