"""Benchmark: the prompts pipeline over 10^4, 10^5 (and, with ``--million``, 10^6) units on this machine.

    .venv/bin/python bench/scale.py [--units 10000 100000] [--million] [--out FILE] [--keep DIR]

Each size: a rows file of N rows (one short question each) and a config of one model, n = 1, ``shard_size = 100``,
the offline simulated provider at 0 ms, defaults otherwise; ``punchline run`` in a runs folder of its own, against
a ``valkey-server`` this script starts (the binary the project ships, ``services/redis_binary.py``; no persistence,
as the embedded ledger) with ``--redis-url``, so the server's ``INFO`` is this run's alone. Measured:

- wall time of the run, per unit;
- every process's RSS, sampled from /proc (psutil) every 0.25 s and grouped by role: the driver, its own worker
  (a fork of it), Ray's shard workers (``ray::ShardWorker``), Ray's other processes, the keepers, the ledger
  server. A process is the run's when it carries the run's marker in its environment (every process the driver
  starts inherits it) or is the ledger server. Per role: the peak of the role's sum and of its largest process;
  the driver's RSS at its first and last sample, and the growth per unit;
- the ledger: commands per unit (``INFO commandstats``, reset before the run), CPU µs per unit (``INFO cpu``,
  user + sys, before and after) and its memory (``used_memory_peak``, ``used_memory`` at the end);
- the store: files and bytes per unit (the run's folder);
- then, on the finished run: ``punchline status``, ``punchline plan`` (the config), the viewer's first answers page
  (``punchline view``, GET ``/run/<id>/samples``, the server's first request), and a resume (``punchline run`` again
  with the same run id: every stage done).

Prints a table; ``--out`` appends each size's figures as a JSON line as soon as they are measured (a 10^6 run in the
background leaves them there).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import redis
from scratch_valkey import start_valkey  # the bench folder's own

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / ".venv" / "bin"
MARK = "PUNCHLINE_SCALE_BENCH"  # set in the driver's environment: its processes (and Ray's it starts) inherit it
SAMPLE_S = 0.25
RUN_ID = "scale"
CONFIG = """[run]
pipeline = "prompts"
shard_size = 100

[simulator]
latency_ms_min = 0
latency_ms_max = 0

[providers.sim]
kind = "openai"
base_url = "simulated"

[providers.sim.models]
small = {{ id = "sim-small", input_usd_per_mtok = 0.1, output_usd_per_mtok = 0.1 }}

[prompts]
data = "{data}"
id_field = "id"
provider = "sim"
models = ["small"]
n = 1
max_tokens = 16
prompt = "Question {{{{ id }}}}: {{{{ question }}}}"
"""


def write_inputs(folder: Path, units: int) -> Path:
    rows = folder / "rows.jsonl"
    with rows.open("w") as f:
        for i in range(units):
            f.write(json.dumps({"id": f"q{i:07d}", "question": f"What is {i} plus {i % 97}?"}) + "\n")
    config = folder / "scale.toml"
    config.write_text(CONFIG.format(data=rows))
    return config


def role(proc: psutil.Process, driver: int, ledger: int) -> str:
    if proc.pid == driver:
        return "driver"
    if proc.pid == ledger:
        return "ledger server"
    cmd = " ".join(proc.cmdline())
    if cmd.startswith("ray::ShardWorker"):
        return "ray shard workers"
    if "keeper" in cmd:
        return "keepers"
    if proc.ppid() == driver and "punchline" in cmd and "ray" not in cmd.split()[0]:
        return "driver's own worker"
    if "ray" in cmd or "raylet" in cmd or "gcs_server" in cmd:
        return "ray (head, raylet, gcs, agents)"
    if "valkey" in cmd or "redis-server" in cmd:
        return "ledger server"
    return "other"


class Sampler(threading.Thread):
    """RSS of the run's processes every ``SAMPLE_S``, by role."""

    def __init__(self, token: str, driver: int, ledger: int) -> None:
        super().__init__(daemon=True)
        self.token, self.driver, self.ledger = token, driver, ledger
        self.known: dict[tuple[int, float], str | None] = {}  # (pid, create time) -> role, None: not the run's
        self.peak_sum: dict[str, int] = {}
        self.peak_one: dict[str, int] = {}
        self.count: dict[str, set[int]] = {}
        self.peak_total = 0
        self.driver_rss: list[int] = []
        self.halt = threading.Event()

    def classify(self, proc: psutil.Process) -> str | None:
        key = (proc.pid, proc.create_time())
        if key not in self.known:
            mine = proc.pid in (self.driver, self.ledger)
            if not mine:
                try:
                    mine = proc.environ().get(MARK) == self.token
                except (psutil.AccessDenied, psutil.ZombieProcess):
                    mine = False
            self.known[key] = role(proc, self.driver, self.ledger) if mine else None
        return self.known[key]

    def sample(self) -> None:
        sums: dict[str, int] = {}
        for proc in psutil.process_iter():
            try:
                r = self.classify(proc)
                if r is None:
                    continue
                rss = proc.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            sums[r] = sums.get(r, 0) + rss
            self.peak_one[r] = max(self.peak_one.get(r, 0), rss)
            self.count.setdefault(r, set()).add(proc.pid)
            if proc.pid == self.driver:
                self.driver_rss.append(rss)
        for r, v in sums.items():
            self.peak_sum[r] = max(self.peak_sum.get(r, 0), v)
        self.peak_total = max(self.peak_total, sum(sums.values()))

    def run(self) -> None:
        while not self.halt.is_set():
            started = time.monotonic()
            self.sample()
            self.halt.wait(max(0.0, SAMPLE_S - (time.monotonic() - started)))


def info(client: redis.Redis) -> dict[str, Any]:
    cpu = client.info("cpu")
    stats = client.info("commandstats")
    memory = client.info("memory")
    return {
        "cpu_s": float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
        "calls": sum(int(v["calls"]) for v in stats.values()),
        "by_command": {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()},
        "used_memory": int(memory["used_memory"]),
        "used_memory_peak": int(memory["used_memory_peak"]),
    }


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    started = time.monotonic()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    took = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {done.returncode}\n{done.stderr[-3000:]}")
    return took


def first_answers_page(runs: Path, env: dict[str, str]) -> float:
    proc = subprocess.Popen(
        [str(BIN / "punchline"), "view", "--runs-dir", str(runs), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        found = re.search(r"http://127\.0\.0\.1:(\d+)", proc.stdout.readline())
        if not found:
            raise SystemExit("no URL from punchline view")
        started = time.monotonic()
        with urllib.request.urlopen(f"http://127.0.0.1:{found.group(1)}/run/{RUN_ID}/samples", timeout=600) as resp:
            resp.read()
        return time.monotonic() - started
    finally:
        proc.terminate()
        proc.wait(30)


def store_size(folder: Path) -> tuple[int, int]:
    files = size = 0
    for p in folder.rglob("*"):
        if p.is_file():
            files += 1
            size += p.stat().st_size
    return files, size


def measure(units: int, work: Path) -> dict[str, Any]:
    folder = work / f"n{units}"
    folder.mkdir()
    config = write_inputs(folder, units)
    runs = folder / "runs"
    home = folder / "home"
    home.mkdir()
    token = os.urandom(6).hex()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PUNCHLINE_", "RAY_"))}
    env.update(HOME=str(home), PATH=f"{BIN}:{env.get('PATH', '')}", **{MARK: token})
    ledger, port = start_valkey(folder, "--protected-mode", "no")
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    try:
        client.config_resetstat()
        before = info(client)
        argv = [str(BIN / "punchline"), "run", str(config), "--runs-dir", str(runs), "--run-id", RUN_ID]
        argv += ["--no-progress", "--redis-url", url]
        started = time.monotonic()
        driver = subprocess.Popen(argv, env=env, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        sampler = Sampler(token, driver.pid, ledger.pid)
        sampler.start()
        _, err = driver.communicate()
        wall = time.monotonic() - started
        sampler.halt.set()
        sampler.join()
        if driver.returncode != 0:
            raise SystemExit(f"run of {units}: exit {driver.returncode}\n{err[-3000:]}")
        after = info(client)
        files, size = store_size(runs / RUN_ID)
        env_cmd = {k: v for k, v in env.items() if k != MARK}
        status_s = timed([str(BIN / "punchline"), "status", RUN_ID, "--runs-dir", str(runs)], env_cmd, folder)
        plan_s = timed(
            [str(BIN / "punchline"), "plan", str(config), "--runs-dir", str(runs), "--redis-url", url], env_cmd, folder
        )
        page_s = first_answers_page(runs, env_cmd)
        resume_s = timed(argv, env_cmd, folder)
    finally:
        ledger.terminate()
        ledger.wait(30)
    calls = after["calls"]  # reset before the run: the run's own (the bench's INFO calls are not counted there)
    top = sorted(after["by_command"].items(), key=lambda kv: -kv[1])[:8]
    return {
        "units": units,
        "wall_s": round(wall, 2),
        "units_per_s": round(units / wall, 1),
        "ms_per_unit": round(1000 * wall / units, 3),
        "rss_peak_sum_mb": {r: round(v / 2**20, 1) for r, v in sorted(sampler.peak_sum.items())},
        "rss_peak_one_mb": {r: round(v / 2**20, 1) for r, v in sorted(sampler.peak_one.items())},
        "processes": {r: len(p) for r, p in sorted(sampler.count.items())},
        "rss_peak_total_mb": round(sampler.peak_total / 2**20, 1),
        "driver_rss_first_last_mb": [
            round(sampler.driver_rss[0] / 2**20, 1) if sampler.driver_rss else None,
            round(sampler.driver_rss[-1] / 2**20, 1) if sampler.driver_rss else None,
        ],
        "redis_commands_per_unit": round(calls / units, 2),
        "redis_top_commands_per_unit": {k: round(v / units, 2) for k, v in top},
        "redis_cpu_us_per_unit": round(1e6 * (after["cpu_s"] - before["cpu_s"]) / units, 1),
        "redis_used_memory_peak_mb": round(after["used_memory_peak"] / 2**20, 1),
        "redis_used_memory_end_mb": round(after["used_memory"] / 2**20, 1),
        "store_files_per_unit": round(files / units, 4),
        "store_bytes_per_unit": round(size / units, 1),
        "status_s": round(status_s, 2),
        "plan_s": round(plan_s, 2),
        "view_first_answers_page_s": round(page_s, 2),
        "resume_s": round(resume_s, 2),
        "load_avg_1m": round(os.getloadavg()[0], 1),
    }


def table(results: list[dict[str, Any]]) -> str:
    cols = [str(r["units"]) for r in results]
    lines = ["| figure | " + " | ".join(cols) + " |", "| --- |" + " --- |" * len(cols)]

    def row(name: str, values: list[Any]) -> None:
        lines.append(f"| {name} | " + " | ".join("" if v is None else str(v) for v in values) + " |")

    for key in ("wall_s", "units_per_s", "ms_per_unit", "rss_peak_total_mb"):
        row(key, [r[key] for r in results])
    roles = sorted({k for r in results for k in r["rss_peak_sum_mb"]})
    for name in roles:
        row(f"peak RSS MB, {name} (sum; largest one; processes)", [
            f"{r['rss_peak_sum_mb'].get(name)}; {r['rss_peak_one_mb'].get(name)}; {r['processes'].get(name)}"
            for r in results
        ])  # fmt: skip
    row("driver RSS MB first -> last", [" -> ".join(map(str, r["driver_rss_first_last_mb"])) for r in results])
    for key in (
        "redis_commands_per_unit",
        "redis_cpu_us_per_unit",
        "redis_used_memory_peak_mb",
        "redis_used_memory_end_mb",
        "store_files_per_unit",
        "store_bytes_per_unit",
        "status_s",
        "plan_s",
        "view_first_answers_page_s",
        "resume_s",
        "load_avg_1m",
    ):
        row(key, [r[key] for r in results])
    row("top Redis commands per unit", [
        ", ".join(f"{k} {v}" for k, v in r["redis_top_commands_per_unit"].items()) for r in results
    ])  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--units", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--million", action="store_true", help="also 10^6 units (about 40 minutes on 2 cores)")
    parser.add_argument("--out", type=Path, help="append each size's figures here as a JSON line")
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it (default: a temporary one)")
    args = parser.parse_args()
    sizes = args.units + ([1_000_000] if args.million else [])
    work = args.keep or Path(tempfile.mkdtemp(prefix="punchline-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    results = []
    try:
        for units in sizes:
            result = measure(units, work)
            results.append(result)
            print(json.dumps(result), flush=True)
            if args.out:
                with args.out.open("a") as f:
                    f.write(json.dumps(result) + "\n")
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    print(table(results))


if __name__ == "__main__":
    main()
