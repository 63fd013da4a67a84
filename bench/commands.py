"""Benchmark: how long the everyday commands take to answer, and how soon a run makes its first call.

    .venv/bin/python bench/commands.py [--config configs/demo.toml] [--repeat 3]

Each command runs as a user runs it (``.venv/bin/punchline ...`` in a fresh process) against a
runs folder in a temporary directory:

* ``--help``: the baseline (Python and the CLI importing), every ratio is against it;
* ``run`` of the demo (``make run``: 63 jokes through collect, classify, rank, cloze, evaluate);
* ``run --run-id`` of that finished run (nothing to do), ``retry-failed`` with nothing to retry,
  ``runs``, ``status``, ``plan``;
* the first provider call: ``punchline run`` started -> the first completion request reaching a
  fake provider this process serves over HTTP (the demo config pointed at it), with the start-up phases
  the driver logs (``start_phases``) as seconds since the command started;
* the resume after ``kill -9``: another fresh run killed (SIGKILL) as soon as 50 of its calls are
  answered (its shards in flight hold their request leases for ``lease_ms``), then ``run --run-id`` ->
  its first call.

Targets (issue 22): the finished run, retry-failed, runs, status and plan under 3 s each; the demo
run under 15 s on an idle machine; (issue 20) the first call, and a resume's first call, within 5 s.
Prints one line per command (median of ``--repeat`` runs, and its ratio to the baseline), the load
average, and the start-up phases.
"""

from __future__ import annotations

import argparse
import json
import os
import re
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


PHASES = (  # the driver's `start_phases` event, in the order they happen
    ("driver_start", "CLI imported, `run` entered"),
    ("preflight_done", "whole-run preflight (config, inputs, store, keys)"),
    ("providers_checked", "simulator started, providers checked (over HTTP)"),
    ("ledger_up", "ledger (embedded Redis), run claim, store guard"),
    ("local_worker_started", "first stage planned and queued, the driver's own worker started"),
    ("ray_up", "local Ray joined (head up, ray.init on the main thread; - : not yet)"),
)


def _pointed_config(config: Path, runs: Path, fake: FakeProviderServer, lease_ms: int | None = None) -> Path:
    """The config with its (simulated) providers pointed at ``fake``, and its data paths made absolute;
    ``lease_ms``: the run's lease instead of the config's."""
    text = config.read_text().replace('"../data/', f'"{config.parent.parent}/data/')  # paths beside the config
    if lease_ms is not None:
        text, found = re.subn(r"(?m)^lease_ms = \d+$", f"lease_ms = {lease_ms}", text, count=1)
        if not found:
            raise SystemExit(f"{config}: no `lease_ms = ...` line to replace")
    # the demo's first provider is an OpenAI one, its second an Anthropic one
    text = text.replace('base_url = "simulated"', f'base_url = "{fake.openai_base_url}"', 1)
    text = text.replace('base_url = "simulated"', f'base_url = "{fake.anthropic_base_url}"', 1)
    pointed = runs.parent / "first_call.toml"
    pointed.write_text(text)
    return pointed


def _start_phases(runs: Path, started_unix: float, wait_s: float) -> dict[str, float]:
    """Seconds from ``started_unix`` to each phase of the run's latest ``start_phases`` log event ({} if
    none): the driver logs one when its own worker starts and one more when it joins the local Ray."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        found: dict[str, float] = {}
        for log in runs.glob("*/log.jsonl"):
            for line in log.read_text().splitlines():
                event = json.loads(line) if '"start_phases"' in line else None
                if event is not None and event.get("event") == "start_phases" and event["driver_start"] >= started_unix:
                    found = {k: event[k] - started_unix for k, _ in PHASES if k in event}
        if found:
            return found
        time.sleep(0.1)
    return {}


class FirstCall:
    """``punchline run`` started -> the fake provider's first completion request, on a fresh run and on a
    resume after ``kill -9`` (seconds), and the start-up phases of the fresh run."""

    def __init__(self, first_s: float, phases: dict[str, float], resume_s: float, resume_phases: dict[str, float]):
        self.first_s, self.phases = first_s, phases
        self.resume_s, self.resume_phases = resume_s, resume_phases


def _until_calls(fake: FakeProviderServer, proc: subprocess.Popen[bytes], errors: Path, at_least: int) -> None:
    while fake.stats().total_calls < at_least:
        if proc.poll() is not None:
            tail = errors.read_text().strip()[-600:]
            raise SystemExit(f"the run ended ({proc.returncode}) before {at_least} provider calls: {tail}")
        time.sleep(0.01)


def _settled_calls(fake: FakeProviderServer, quiet_s: float = 2.0) -> int:
    """The fake's call count once no call has come for ``quiet_s`` (a killed run's calls in flight ended)."""
    count, since = fake.stats().total_calls, time.monotonic()
    while time.monotonic() - since < quiet_s:
        time.sleep(0.1)
        now = fake.stats().total_calls
        if now != count:
            count, since = now, time.monotonic()
    return count


def _started(argv: list[str], env: dict[str, str], errors: Path) -> subprocess.Popen[bytes]:
    with errors.open("w") as err:
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env=env)


def _stopped(proc: subprocess.Popen[bytes], *, kill: bool = True) -> None:
    if proc.poll() is None:
        if kill:
            proc.kill()
        else:
            proc.terminate()
        proc.wait(timeout=120)


def first_call(config: Path, runs: Path, *, kill_after_calls: int = 50, lease_ms: int | None = None) -> FirstCall:
    """The first call of a fresh run (with its start-up phases, logged once local Ray is up); then another
    fresh run killed with SIGKILL as soon as the fake has answered ``kill_after_calls`` of its calls (its
    shards in flight then hold their request leases for ``lease_ms``), and resumed (``--run-id``): the
    resume's first call. Each run has its own runs folder (its own ledger and response cache)."""
    with FakeProviderServer(FakeConfig(seed=7, latency_ms_min=5, latency_ms_max=40)) as fake:
        pointed = _pointed_config(config, runs, fake, lease_ms)
        env = {**os.environ, "TOGETHER_API_KEY": "sk-bench", "ANTHROPIC_API_KEY": "sk-bench"}
        errors = runs.parent / "first_call.err"
        fresh, killed = runs / "fresh", runs / "killed"
        argv = [CLI, "run", str(pointed), "--no-progress", "--runs-dir"]
        started_unix, start = time.time(), time.perf_counter()
        proc = _started([*argv, str(fresh)], env, errors)
        try:
            _until_calls(fake, proc, errors, 1)
            first_s = time.perf_counter() - start
            phases = _start_phases(fresh, started_unix, wait_s=180.0)
        finally:
            _stopped(proc)
        base = _settled_calls(fake)
        proc = _started([*argv, str(killed)], env, errors)
        try:
            _until_calls(fake, proc, errors, base + kill_after_calls)
        finally:
            _stopped(proc)  # kill -9 at once: no clean-up, leases left held
        run_id = next(p.name for p in killed.iterdir() if (p / "run.json").is_file())
        before = _settled_calls(fake)
        started_unix, start = time.time(), time.perf_counter()
        proc = _started([*argv, str(killed), "--run-id", run_id], env, errors)
        try:
            _until_calls(fake, proc, errors, before + 1)
            resume_s = time.perf_counter() - start
            resume_phases = _start_phases(killed, started_unix, wait_s=180.0)
        finally:
            _stopped(proc, kill=False)
    return FirstCall(first_s, phases, resume_s, resume_phases)


def print_first_call(found: FirstCall) -> None:
    print(f"{'phase: seconds since `punchline run` started':<72} {'fresh':>6} {'resume':>7}")
    for key, what in PHASES:
        fresh, resume = found.phases.get(key), found.resume_phases.get(key)
        print(f"  {what:<70} {_s(fresh):>6} {_s(resume):>7}")
    print(f"  {'first provider call':<70} {_s(found.first_s):>6} {_s(found.resume_s):>7}")
    print("(resume: another fresh run killed with SIGKILL at its 50th call, then `run --run-id`)")


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(ROOT / "configs" / "demo.toml"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--first-call-only", action="store_true", help="only the time to the first provider call")
    ap.add_argument(
        "--lease-ms",
        type=int,
        default=None,
        help="the first-call runs' lease_ms (default: the config's); a long one shows a resume waiting on the "
        "killed run's leases even when the machine is so loaded that a short one lapses before the resume is up",
    )
    args = ap.parse_args()
    config = Path(args.config).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        if args.first_call_only:
            before = os.getloadavg()[0]
            print_first_call(first_call(config, Path(tmp) / "runs2", lease_ms=args.lease_ms))
            after = os.getloadavg()[0]
            print(f"load average (1 min) before / after: {before:.1f} / {after:.1f} on {os.cpu_count()} cores")
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
        found = first_call(config, Path(tmp) / "runs2", lease_ms=args.lease_ms)
        rows.append(("first provider call", found.first_s))
        rows.append(("resume after kill -9: first call", found.resume_s))
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'command':<34} {'seconds':>8} {'x baseline':>10}")
    for name, seconds in rows:
        print(f"{name:<34} {seconds:>8.2f} {seconds / base:>10.1f}")
    print_first_call(found)


if __name__ == "__main__":
    main()
