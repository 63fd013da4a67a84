"""Benchmark: ``punchline plan``'s wall-time estimate against the run it estimates, quiet and beside busy loops.

    .venv/bin/python bench/plan_estimate.py [--busy 0,2,4] [--configs prompts_demo,demo]

For each number of busy loops (``python -c "while True: pass"``, started beside and stopped after) and each demo
config: a fresh folder (its own ``HOME``, ``punchline init``), then ``punchline plan`` and ``punchline run`` (a
fresh run: every request called), then both again (every answer cached). Prints planned and measured wall time,
their ratio, and the load factor ``plan`` said (``cluster/estimate/machine_load.py``). The issue's target: within ±30 %.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PUNCHLINE = str(Path(sys.executable).with_name("punchline"))
WALL = re.compile(r"^wall time: about ([0-9.]+) s", re.M)
LOAD = re.compile(r"x[0-9.]+ for the machine's load now \([^)]*\)")


def busy_loops(n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def plan_and_run(folder: Path, config: str, env: dict[str, str]) -> tuple[float, float, str]:
    out = subprocess.run(
        [PUNCHLINE, "plan", f"configs/{config}.toml"], cwd=folder, env=env, capture_output=True, text=True, check=True
    ).stdout
    found = WALL.search(out)
    if found is None:
        raise SystemExit(f"no wall-time line in plan's output:\n{out}")
    started = time.monotonic()
    subprocess.run([PUNCHLINE, "run", f"configs/{config}.toml", "--no-progress"], cwd=folder, env=env,
                   capture_output=True, check=True)  # fmt: skip
    said = LOAD.search(out)
    return float(found.group(1)), time.monotonic() - started, said.group(0) if said else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--busy", default="0,2,4", help="busy loops beside the runs, one count per round")
    ap.add_argument("--configs", default="prompts_demo,demo")
    args = ap.parse_args()
    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
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
