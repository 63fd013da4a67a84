"""Benchmark: ``punchline plan``'s wall-time estimate against the run it estimates, quiet and beside busy loops.

    .venv/bin/python bench/plan_estimate.py [--busy 0,2,4] [--configs prompts_demo,demo]
    .venv/bin/python bench/plan_estimate.py --http-latency-ms 250 [--configs prompts_demo]

For each number of busy loops (``python -c "while True: pass"``, started beside and stopped after) and each demo
config: a fresh folder (its own ``HOME``, ``punchline init``), then ``punchline plan`` and ``punchline run`` (a
fresh run: every request called), then both again (every answer cached). Prints planned and measured wall time,
their ratio, and the load factor ``plan`` said (``cluster/estimate/machine_load.py``). The issue's target: within ±30 %.

``--http-latency-ms``: the same demo against a real HTTP endpoint instead of ``base_url = "simulated"``: the fake
provider served on 127.0.0.1 by this process, every answer ``N`` ms late, each provider's ``base_url`` pointed at it
(so ``plan`` cannot read the latency from ``[simulator]`` knobs). A fresh folder, then plan and run twice: first with
no earlier run (the calls timed at each provider kind's default, ``cluster/estimate/call_time.py``), then with the
config's ``[prompts] seed`` changed (new requests, every one called) after that run (the latencies it measured,
``cluster/estimate/latencies.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PUNCHLINE = str(Path(sys.executable).with_name("punchline"))
WALL = re.compile(r"^wall time: about ([0-9.]+) s", re.M)
PARTS = re.compile(r"^wall time: about [0-9.]+ s \(([0-9.]+ s) calls, ([0-9.]+ s) start", re.M)
TO_SEND = re.compile(r"; ([0-9]+) requests to send( at most)?")
LOAD = re.compile(r"x[0-9.]+ for the machine's load now \([^)]*\)")


def busy_loops(n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


SHOW_PLAN = False  # --show-plan: print each plan's table and line


def plan_and_run(folder: Path, config: str, env: dict[str, str]) -> tuple[float, float, str]:
    out = subprocess.run(
        [PUNCHLINE, "plan", f"configs/{config}.toml"], cwd=folder, env=env, capture_output=True, text=True, check=True
    ).stdout
    if SHOW_PLAN:
        print(out, flush=True)
    found = WALL.search(out)
    if found is None:
        raise SystemExit(f"no wall-time line in plan's output:\n{out}")
    started = time.monotonic()
    subprocess.run([PUNCHLINE, "run", f"configs/{config}.toml", "--no-progress"], cwd=folder, env=env,
                   capture_output=True, check=True)  # fmt: skip
    said = LOAD.search(out)
    parts = PARTS.search(out)
    to_send = TO_SEND.search(out)
    sent = (
        ""
        if to_send is None
        else f"[{(to_send.group(2) and '≤ ') or ''}{to_send.group(1)} to send, {sent_by_latest(folder)} sent]"
    )
    shown = " ".join(filter(None, [f"[{parts.group(1)} calls + {parts.group(2)} fixed]" if parts else "", sent,
                                   said.group(0) if said else ""]))  # fmt: skip
    return float(found.group(1)), time.monotonic() - started, shown


def sent_by_latest(folder: Path) -> int:
    """The requests the folder's latest run sent: its stages' units less those the cache (or another unit of the
    same key) answered, from its record."""
    records = [json.loads(path.read_bytes()) for path in (folder / "runs").glob("*/run.json")]
    latest = max(records, key=lambda rec: rec["created_at"])
    return sum(c["units_total"] - c["cache_hits"] for c in latest["counters"].values())


def http_rounds(config: str, latency_ms: float) -> list[float]:
    """Plan and run ``config`` against the fake provider over HTTP (``latency_ms`` per answer): no earlier run, then
    one; prints each and returns planned / measured - 1 of each."""
    from punchline.data.simulator import FakeConfig  # lazy: the busy-loop rounds need none of punchline
    from punchline.workers.fake.server import FakeProviderServer

    misses = []
    knobs = FakeConfig(latency_ms_min=latency_ms, latency_ms_max=latency_ms)
    with FakeProviderServer(knobs) as fake, tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        env = {**os.environ, "HOME": str(folder / "home"), "TOGETHER_API_KEY": "k", "ANTHROPIC_API_KEY": "k"}
        env.pop("PUNCHLINE_RUNS_DIR", None)
        (folder / "home").mkdir()
        subprocess.run([PUNCHLINE, "init"], cwd=folder, env=env, capture_output=True, check=True)
        text = (folder / "configs" / f"{config}.toml").read_text()
        for kind, url in (("openai", fake.openai_base_url), ("anthropic", fake.anthropic_base_url)):
            text = re.sub(rf'(kind = "{kind}"\nbase_url = )"simulated"', rf'\1"{url}"', text)
        if '"simulated"' in text:
            raise SystemExit(f"configs/{config}.toml: a provider still simulated")
        for round_, seed in (("no earlier run", "1"), ("one earlier run", "2")):
            name = f"http_{config}_{seed}"
            (folder / "configs" / f"{name}.toml").write_text(re.sub(r"(?m)^seed = 1$", f"seed = {seed}", text))
            planned, measured, said = plan_and_run(folder, name, env)
            off = planned / measured - 1
            misses.append(off)
            print(f"http {latency_ms:g} ms, {config:12} {round_:15}: planned {planned:5.1f} s, measured "
                  f"{measured:5.2f} s (ratio {planned / measured:.2f}, {off:+.0%}) {said}", flush=True)  # fmt: skip
    return misses


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--busy", default="0,2,4", help="busy loops beside the runs, one count per round")
    ap.add_argument("--configs", default="prompts_demo,demo")
    ap.add_argument("--http-latency-ms", type=float, help="against the fake provider over HTTP, answers this late")
    ap.add_argument("--show-plan", action="store_true", help="print each plan's table (requests to send per stage)")
    args = ap.parse_args()
    global SHOW_PLAN
    SHOW_PLAN = args.show_plan
    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    if args.http_latency_ms is not None:
        misses = [m for config in args.configs.split(",") for m in http_rounds(config, args.http_latency_ms)]
        inside = sum(abs(m) <= 0.30 for m in misses)
        print(f"\n{inside} of {len(misses)} within ±30 % (from {min(misses):+.0%} to {max(misses):+.0%})")
        return
    misses = []
    for n in [int(x) for x in args.busy.split(",")]:
        loops = busy_loops(n)
        try:
            time.sleep(2)  # the loops running before plan reads the machine
            for config in args.configs.split(","):
                with tempfile.TemporaryDirectory() as tmp:
                    folder = Path(tmp)
                    env = {**os.environ, "HOME": str(folder / "home")}
                    (folder / "home").mkdir()
                    subprocess.run([PUNCHLINE, "init"], cwd=folder, env=env, capture_output=True, check=True)
                    for kind in ("fresh", "cached"):
                        planned, measured, said = plan_and_run(folder, config, env)
                        off = planned / measured - 1
                        misses.append(off)
                        print(f"{n} busy, {config:12} {kind:6}: planned {planned:5.1f} s, measured {measured:5.2f} s "
                              f"({off:+.0%}) {said}", flush=True)  # fmt: skip
        finally:
            for loop in loops:
                loop.kill()
                loop.wait()
    inside = sum(abs(m) <= 0.30 for m in misses)
    print(f"\n{inside} of {len(misses)} within ±30 % (from {min(misses):+.0%} to {max(misses):+.0%})")


if __name__ == "__main__":
    main()
