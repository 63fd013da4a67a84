"""Benchmark: how long the everyday commands take to answer, and how soon a run makes its first call.

    .venv/bin/python bench/commands.py [--config configs/demo.toml] [--repeat 3]

Each command runs as a user runs it (``.venv/bin/punchline ...`` in a fresh process) against a
runs folder in a temporary directory:

* ``--help``: the baseline (Python and the CLI importing), every ratio is against it;
* ``run`` of the demo (``make run``: 63 jokes through collect, classify, rank, cloze, evaluate);
* ``run --run-id`` of that finished run (nothing to do), ``retry-failed`` with nothing to retry,
  ``runs``, ``status``, ``plan``;
* the first provider call: ``punchline run`` started -> the first completion request reaching a
  fake provider this process serves over HTTP (the demo config pointed at it).

Targets (issue 22): the finished run, retry-failed, runs, status and plan under 3 s each; the demo
run under 15 s on an idle machine; the first call within 5 s. Prints one line per command (median
of ``--repeat`` runs, and its ratio to the baseline).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from punchline.workers.fake.server import FakeConfig, FakeProviderServer  # noqa: E402

CLI = str(Path(sys.executable).with_name("punchline"))


def timed(argv: list[str], env: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    done = subprocess.run([CLI, *argv], capture_output=True, text=True, env=env, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return elapsed


def median(argv: list[str], repeat: int) -> float:
    return statistics.median(timed(argv) for _ in range(repeat))


def first_call_s(config: Path, runs: Path) -> float:
    """``punchline run`` started -> the fake provider's first completion request."""
    text = config.read_text().replace('"../data/', f'"{config.parent.parent}/data/')  # paths beside the config
    with FakeProviderServer(FakeConfig(seed=7, latency_ms_min=5, latency_ms_max=40)) as fake:
        # the demo's first provider is an OpenAI one, its second an Anthropic one
        text = text.replace('base_url = "simulated"', f'base_url = "{fake.openai_base_url}"', 1)
        text = text.replace('base_url = "simulated"', f'base_url = "{fake.anthropic_base_url}"', 1)
        pointed = runs.parent / "first_call.toml"
        pointed.write_text(text)
        env = {**os.environ, "TOGETHER_API_KEY": "sk-bench", "ANTHROPIC_API_KEY": "sk-bench"}
        start = time.perf_counter()
        errors = runs.parent / "first_call.err"
        with errors.open("w") as err:
            proc = subprocess.Popen(
                [CLI, "run", str(pointed), "--runs-dir", str(runs), "--no-progress"],
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=env,
            )
        try:
            while fake.stats().total_calls == 0:
                if proc.poll() is not None:
                    tail = errors.read_text().strip()[-600:]
                    raise SystemExit(f"the run ended ({proc.returncode}) before any provider call: {tail}")
                time.sleep(0.01)
            return time.perf_counter() - start
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(ROOT / "configs" / "demo.toml"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--first-call-only", action="store_true", help="only the time to the first provider call")
    args = ap.parse_args()
    config = Path(args.config).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        if args.first_call_only:
            print(f"first provider call: {first_call_s(config, Path(tmp) / 'runs2'):.2f} s")
            return
        runs = Path(tmp) / "runs"
        base = median(["--help"], args.repeat)
        rows: list[tuple[str, float]] = [("--help (baseline)", base)]
        rows.append(("run demo (make run)", timed(["run", str(config), "--runs-dir", str(runs), "--no-progress"])))
        run_id = next(p.name for p in runs.iterdir() if (p / "run.json").is_file())
        again = ["run", str(config), "--run-id", run_id, "--runs-dir", str(runs), "--no-progress"]
        rows.append(("run, finished run resumed", median(again, args.repeat)))
        retry = ["retry-failed", run_id, "--runs-dir", str(runs), "--no-progress"]
        rows.append(("retry-failed, nothing to retry", median(retry, args.repeat)))
        rows.append(("runs", median(["runs", "--runs-dir", str(runs)], args.repeat)))
        rows.append(("status", median(["status", run_id, "--runs-dir", str(runs)], args.repeat)))
        rows.append(("plan", median(["plan", str(config)], args.repeat)))
        rows.append(("first provider call", first_call_s(config, Path(tmp) / "runs2")))
    print(f"{'command':<34} {'seconds':>8} {'x baseline':>10}")
    for name, seconds in rows:
        print(f"{name:<34} {seconds:>8.2f} {seconds / base:>10.1f}")


if __name__ == "__main__":
    main()
