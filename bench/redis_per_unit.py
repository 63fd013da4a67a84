"""Benchmark: Redis commands, Redis CPU and bytes sent to Redis per unit, measured from the server's side.

    .venv/bin/python bench/redis_per_unit.py [--rows 5000] [--shard-size 100] [--rpm 0] [--max-concurrency 0]

Starts its own ``valkey-server`` (the binary the project ships: ``services/redis_binary.py``; no password, no
persistence, so the run's client loads the engine's scripts itself), resets its statistics (``CONFIG
RESETSTAT``) and runs the ``prompts`` pipeline over ``--rows`` synthetic rows (one model, ``n`` = 1, no judge,
the offline simulated provider at 0 ms, ``shard_size`` ``--shard-size``) against it with ``--redis-url``. Then
prints, per unit (every unit is one provider call), each command's calls and microseconds from ``INFO
commandstats``, their totals, and the bytes the server read (``INFO stats`` ``total_net_input_bytes``).

Why from the server's side: it counts every client of the run (the driver's polling, every worker, the
heartbeats, the call figures), which no client-side count sees whole. Target (issue 42): at most 3 commands and
25 us of Redis CPU per unit at ``shard_size`` 100.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scratch_valkey import start_valkey  # noqa: E402  (the bench folder's own)

from punchline.schedulers.server.ledger_access import engine_scripts  # noqa: E402

CONFIG = """[run]
pipeline = "prompts"
name = "redis-per-unit"
shard_size = {shard_size}
lease_ms = 15000

[simulator]
seed = 1
latency_ms_min = 0
latency_ms_max = 0

[providers.sim]
kind = "openai"
base_url = "simulated"
api_key_env = "SIM_API_KEY"
{limits}
[providers.sim.models]
m = {{ id = "sim-model", input_usd_per_mtok = 0.1, output_usd_per_mtok = 0.1 }}

[prompts]
data = "rows.jsonl"
id_field = "id"
provider = "sim"
models = ["m"]
n = 1
max_tokens = 16
prompt = "Question {{{{ id }}}}: {{{{ question }}}}"
"""


class Monitor:
    """``MONITOR`` in a thread: the top-level commands by name, each ``EVALSHA`` by its script's name, and the
    commands scripts run (tagged ``lua``) by script. Slows the server down: for finding where commands go, not
    for the figures."""

    def __init__(self, port: int) -> None:
        self.names = {hashlib.sha1(t.encode()).hexdigest(): n for n, t in engine_scripts().items()}
        self.top: Counter[str] = Counter()
        self.lua: Counter[str] = Counter()
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.sendall(b"MONITOR\r\n")
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                chunk = self.sock.recv(1 << 16)
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            *lines, buf = buf.split(b"\r\n")
            for line in lines:
                m = re.match(rb'\+[\d.]+ \[\d+ ([^\]]+)\] "([^"]+)"(?: "([^"]*)")?', line)
                if not m:
                    continue
                where, cmd = m.group(1).decode(), m.group(2).decode().lower()
                arg = (m.group(3) or b"").decode()
                if where == "lua":
                    self.lua[cmd] += 1
                elif cmd == "evalsha":
                    self.top[f"evalsha {self.names.get(arg, arg[:8])}"] += 1
                else:
                    self.top[cmd] += 1

    def report(self, units: int) -> None:
        time.sleep(0.5)
        self.sock.close()
        print("MONITOR, top-level (per unit):")
        for name, n in self.top.most_common():
            print(f"  {name:<36}{n:>8}{n / units:>9.3f}")
        print("MONITOR, inside scripts (per unit):")
        for name, n in self.lua.most_common():
            print(f"  {name:<36}{n:>8}{n / units:>9.3f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=5000)
    ap.add_argument("--shard-size", type=int, default=100)
    ap.add_argument("--rpm", type=float, default=0, help="the provider's requests_per_minute (0: none)")
    ap.add_argument("--max-concurrency", type=int, default=0, help="the provider's max_concurrency (0: none)")
    ap.add_argument("--max-cost-usd", type=float, default=None, help="a cost cap (the budget's holds)")
    ap.add_argument("--monitor", action="store_true", help="also: who sends what (MONITOR: scripts by name)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="redis-per-unit-") as tmp:
        folder = Path(tmp)
        limits = ""
        if args.rpm:
            limits += f"requests_per_minute = {args.rpm}\n"
        if args.max_concurrency:
            limits += f"max_concurrency = {args.max_concurrency}\n"
        (folder / "run.toml").write_text(CONFIG.format(shard_size=args.shard_size, limits=limits))
        with (folder / "rows.jsonl").open("w") as f:
            for i in range(args.rows):
                f.write(json.dumps({"id": f"r{i}", "question": f"What is {i} plus {i}?"}) + "\n")
        (folder / "home").mkdir()
        proc, port = start_valkey(folder)
        try:
            client = redis.Redis(port=port, decode_responses=True)
            client.config_resetstat()
            env = {**os.environ, "HOME": str(folder / "home"), "SIM_API_KEY": "x"}
            cmd = [str(Path(sys.executable).parent / "punchline"), "run", str(folder / "run.toml"),
                   "--redis-url", f"redis://127.0.0.1:{port}/0", "--runs-dir", str(folder / "runs"),
                   "--no-progress"]  # fmt: skip
            if args.max_cost_usd is not None:
                cmd += ["--max-cost-usd", str(args.max_cost_usd)]
            watcher = Monitor(port) if args.monitor else None
            started = time.monotonic()
            done = subprocess.run(cmd, env=env, cwd=folder, capture_output=True, text=True)
            elapsed = time.monotonic() - started
            if done.returncode != 0:
                print(done.stdout[-2000:], done.stderr[-4000:], sep="\n")
                raise SystemExit(f"the run failed (exit {done.returncode})")
            stats = client.info("commandstats")
            net = client.info("stats")
            if watcher is not None:
                watcher.report(args.rows)
        finally:
            proc.terminate()
            proc.wait(timeout=10)

    units = args.rows
    rows = []
    for name, s in stats.items():
        rows.append((name.removeprefix("cmdstat_"), int(s["calls"]), int(s["usec"])))
    rows.sort(key=lambda r: -r[1])
    total_calls = sum(r[1] for r in rows)
    total_usec = sum(r[2] for r in rows)
    limits = f"rpm {args.rpm or '-'}, max_concurrency {args.max_concurrency or '-'}, cap {args.max_cost_usd or '-'}"
    print(f"{units} units, shard_size {args.shard_size}, {limits}: run took {elapsed:.1f} s")
    print(f"{'command':<24}{'calls':>10}{'per unit':>10}{'usec':>12}{'us/unit':>10}{'us/call':>9}")
    for name, calls, usec in rows:
        print(f"{name:<24}{calls:>10}{calls / units:>10.3f}{usec:>12}{usec / units:>10.2f}{usec / calls:>9.2f}")
    print(f"{'total':<24}{total_calls:>10}{total_calls / units:>10.3f}{total_usec:>12}{total_usec / units:>10.2f}")
    bytes_in = int(net["total_net_input_bytes"])
    print(f"bytes in: {bytes_in} ({bytes_in / units:.0f} B/unit); bytes out: {int(net['total_net_output_bytes'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
