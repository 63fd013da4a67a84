"""Benchmark: what a ``kill -9`` of the driver costs, and how long its workers take to drain (issue 34 item 3).

    .venv/bin/python bench/drain_after_kill.py [--repeat 3] [--jokes 63] [--models 6] [--latency-ms 800 1200]

Each round runs ``punchline run`` (a fresh process, in a temporary runs folder, so its own embedded ledger
and its own local Ray head) of a puns collect stage against a fake provider this process serves over HTTP,
slow enough (``--latency-ms``) that the driver's own worker and the Ray workers both have calls in flight,
kills the driver with SIGKILL once ``--kill-at`` of the calls were made, and then reports:

* ``in flight``: calls the provider was answering at the kill (sent before it: these are paid whatever happens);
* ``after 0.8 s / 5 s / 20 s``: calls that *reached* the provider after the kill (new calls: the bound is about
  these), counted at those times;
* ``drained``: seconds from the kill until no worker of the killed driver is left (its own worker process, the
  Ray ``ShardWorker`` actors), found by a tag in their environment;
* ``asked twice``: requests the resume (``run --run-id``, same command) asked the provider for again.

Prints one line per round and the worst of each column. Runs with the caller's HOME (the local Ray head).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from punchline.workers.fake.server import FakeConfig, FakeProviderServer  # noqa: E402

CLI = str(Path(sys.executable).with_name("punchline"))
TAG = "PUNCHLINE_BENCH_DRAIN_TAG"  # not a PUNCHLINE_* setting of the engine: only marks this bench's processes


def config(folder: Path, fake: FakeProviderServer, jokes: int, units_in_flight: int, models: int = 2) -> Path:
    sample = json.loads((ROOT / "data" / "samples" / "puns_sample.json").read_text())[:jokes]
    data = folder / "jokes.json"
    data.write_text(json.dumps(sample))
    names = [f"m{i}" for i in range(models)]
    table = "".join(
        f'"{n}" = {{ id = "sim/llama-{n}", input_usd_per_mtok = 1.0, output_usd_per_mtok = 2.0 }}\n' for n in names
    )
    path = folder / "drain.toml"
    path.write_text(
        f"""[run]
pipeline = "puns"
name = "drain"
shard_size = 4
lease_ms = 15000
workers_per_node = 2
units_in_flight = {units_in_flight}

[providers.sim]
kind = "openai"
base_url = "{fake.openai_base_url}"
max_concurrency = {4 * units_in_flight}  # run-wide: above what the workers hold, so each worker runs its window
timeout_s = 30

[providers.sim.models]
{table}
[puns]
jokes = "{data}"
collect = {{ provider = "sim", models = {json.dumps(names)}, samples = 4 }}
"""
    )
    return path


def tagged_workers(tag: str) -> list[psutil.Process]:
    """This round's worker processes still alive: the driver's own worker (forked: the driver's command line;
    spawned: ``local_process``) and the Ray ``ShardWorker`` actors (their process title)."""
    out = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            if not any(s in cmd for s in ("ShardWorker", "local_process", "punchline.cluster.cli.main run", " run ")):
                continue
            if proc.environ().get(TAG) == tag:
                out.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def one_round(fake: FakeProviderServer, cfg: Path, folder: Path, kill_at: float, units: int) -> dict[str, float]:
    tag = uuid.uuid4().hex
    env = dict(os.environ, **{TAG: tag})
    run_id = f"drain-{tag[:8]}"
    argv = [CLI, "run", str(cfg), "--run-id", run_id, "--runs-dir", str(folder / "runs")]
    argv += ["--store", str(folder / "store"), "--no-progress"]
    fake.reset()
    driver = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 600
    while fake.stats().total_calls < units * kill_at:
        if driver.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the driver ended before the kill: {driver.stderr.read().decode()[-1500:]}")  # type: ignore[union-attr]
        time.sleep(0.005)
    in_flight = fake._state.in_flight  # the bench reads the fake's own counter: calls being answered now
    at_kill = fake.stats().total_calls
    killed = time.monotonic()
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    after: dict[float, int] = {}
    drained = -1.0
    for mark in (0.8, 5.0, 20.0):
        while time.monotonic() - killed < mark:
            if drained < 0 and not tagged_workers(tag):
                drained = time.monotonic() - killed
            time.sleep(0.05)
        after[mark] = fake.stats().total_calls - at_kill
    while drained < 0 and time.monotonic() - killed < 300:
        if not tagged_workers(tag):
            drained = time.monotonic() - killed
        time.sleep(0.2)
    before_resume = fake.stats().calls
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"the resume failed ({done.returncode}): {done.stderr[-1500:]}")
    calls = fake.stats().calls
    twice = sum(1 for k, n in calls.items() if n > 1)
    asked_again = sum(1 for k in before_resume if calls[k] > before_resume[k])
    return {
        "in_flight": in_flight,
        "after_0.8s": after[0.8],
        "after_5s": after[5.0],
        "after_20s": after[20.0],
        "drained_s": round(drained, 2),
        "asked_twice": twice,
        "resume_asked_again": asked_again,
        "requests": len(calls),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--jokes", type=int, default=63)
    ap.add_argument("--units-in-flight", type=int, default=8)
    ap.add_argument("--models", type=int, default=6, help="models collected from (2 units per joke each)")
    ap.add_argument("--latency-ms", type=float, nargs=2, default=(800.0, 1200.0))
    ap.add_argument("--kill-at", type=float, default=0.3, help="fraction of the calls made when the driver is killed")
    args = ap.parse_args()
    fake = FakeProviderServer(FakeConfig(latency_ms_min=args.latency_ms[0], latency_ms_max=args.latency_ms[1]))
    fake.start()
    units = args.jokes * args.models * 2  # greedy + samples per joke and model
    rows = []
    try:
        for i in range(args.repeat):
            with tempfile.TemporaryDirectory(prefix="punchline-drain-") as tmp:
                folder = Path(tmp)
                cfg = config(folder, fake, args.jokes, args.units_in_flight, args.models)
                row = one_round(fake, cfg, folder, args.kill_at, units)
                rows.append(row)
                print(f"round {i + 1}: " + ", ".join(f"{k} {v}" for k, v in row.items()), flush=True)
    finally:
        fake.stop()
    worst = {k: max(r[k] for r in rows) for k in rows[0]}
    print("worst: " + ", ".join(f"{k} {v}" for k, v in worst.items()))
    print(f"load average: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
