"""Benchmark: the peers' job (issue 32) through punchline and through a hand-written asyncio loop, side by side.

    .venv/bin/python bench/peers.py [--prompts 2000] [--rounds 2] [--latencies 0,200] [--quick] [--by-process]

The job: ``--prompts`` distinct prompts (2,000), one model, n = 1, 16 calls in flight, against the fake
provider (``punchline fake-provider``, its own process) at each latency. Each contender runs as the user
would run it, in its own process tree:

* **punchline**: ``punchline run config.toml`` (the prompts pipeline, ``max_concurrency = 16``: the run-wide
  bound), with no services configured, so the run starts its own ledger and Ray; a fresh runs folder per run;
* **loop**: a child ``python bench/peers.py --loop-child``: one ``openai.AsyncOpenAI`` client, a semaphore of
  16, ``gather`` (what a researcher writes by hand).

Rounds are interleaved (loop, punchline at each latency, then again), every round with prompts of its own
(nothing is cached anywhere). Printed per contender, and punchline's ratio to the loop:

* **CPU ms per call** of the whole process tree (every process descended from the run, read from /proc by
  psutil while it runs, plus what ended children left in ``RUSAGE_CHILDREN``); the fake provider's own CPU
  is not counted;
* **steady calls/s** (the provider's own count, between 10 % and 90 % of the calls);
* **whole-run calls/s** (first call to last, the ramp included), and at > 0 ms its ratio to C / latency;
* **peak RSS** of the whole tree (the most, summed over its processes at one sampling, every 0.25 s), and the
  same in **PSS** (a page shared by n processes counts 1/n in each: a forked worker's pages that it still shares
  with the driver count once, as in the machine's memory; RSS counts them in both);
* the most calls the provider held at once (the bound: 16), and the wall time of the process.

curator and inspect_ai are run only when importable (they are not dependencies of punchline); a line says
they were skipped. ``--quick``: 300 prompts, one round (a smoke run, a minute or two). ``--by-process``: after
each run, every process's own CPU ms per call (its polled CPU; a reaped child's last 0.25 s may be missing).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from engine_vs_loop import CallClock, Fake  # the bench folder's own helpers (the script's folder is on sys.path)

ROOT = Path(__file__).resolve().parents[1]
C = 16
MODEL = "meta-llama/Meta-Llama-3.1-8B-Instruct-Turbo"
PEERS = ("bespokelabs.curator", "inspect_ai")


# --- the job ------------------------------------------------------------------------------------------------


def write_rows(path: Path, n: int, tag: str) -> list[str]:
    """``n`` distinct prompts (a round's ``tag`` in each, so no round finds another's answers)."""
    prompts = [f"Tell me a short pun about the number {i} ({tag})." for i in range(n)]
    with path.open("w") as f:
        for i, p in enumerate(prompts):
            f.write(json.dumps({"id": f"r{i}", "question": p}) + "\n")
    return prompts


def write_config(path: Path, rows: Path, base_url: str) -> None:
    path.write_text(f"""
[run]
pipeline = "prompts"
shard_size = 20

[providers.fake]
kind = "openai"
base_url = "{base_url}"
max_concurrency = {C}
timeout_s = 30

[providers.fake.models]
m = {{ id = "{MODEL}", input_usd_per_mtok = 0.2, output_usd_per_mtok = 0.2 }}

[prompts]
data = "{rows}"
id_field = "id"
provider = "fake"
models = ["m"]
n = 1
temperature = 0.0
max_tokens = 16
prompt = "{{{{ question }}}}"
""")


async def loop_child(base_url: str, prompts_file: Path) -> None:
    """The hand-written loop: one client, a semaphore of C, gather."""
    import openai  # lazy: only the loop's own process needs the SDK

    prompts = [json.loads(line)["question"] for line in prompts_file.read_text().splitlines()]
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=3, timeout=30)
    slots = asyncio.Semaphore(C)

    async def one(prompt: str) -> str:
        async with slots:
            resp = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": prompt}], temperature=0.0, max_tokens=16, n=1
            )
            return resp.choices[0].message.content or ""

    await asyncio.gather(*(one(p) for p in prompts))
    await client.close()


class PeerFake(Fake):
    """The fake provider in its own process, answering any prompt (no answer key: the peers' job is no pipeline's)."""

    def __init__(self, tmp: Path, **knobs: Any) -> None:
        cfg = tmp / f"fake-{time.monotonic_ns()}.toml"
        cfg.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in knobs.items()))
        cmd = [sys.executable, "-m", "punchline", "fake-provider", "--port", "0", "--config", str(cfg)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        self.url = line.rsplit(" ", 1)[1].strip()
        self.base_url = f"{self.url}/v1"


# --- the whole process tree ---------------------------------------------------------------------------------


class TreeMeter:
    """CPU and RSS of a process and everything it starts (Ray's daemons and workers, the ledger), read every
    0.25 s from /proc. A process seen once is followed by pid (with its start time) until it ends, also once
    it is no longer a descendant (a daemon that detached); the CPU of one that ended since its last reading is
    lost (at most 0.25 s of it), except what a waited child leaves in ``RUSAGE_CHILDREN``.

    ``RUSAGE_CHILDREN`` holds the root *and* every descendant reaped down the chain (the driver waits for its
    forked worker): those processes are counted once, as the larger of that figure and their polled sum (it
    used to be added to their polled CPU, counting punchline's worker twice)."""

    def __init__(self, root: int, exclude: set[int]) -> None:
        import psutil  # lazy: a bench dependency only

        self.psutil = psutil
        self.root = root
        self.exclude = exclude
        self.cpu: dict[tuple[int, float], float] = {}
        self.parent: dict[tuple[int, float], int] = {}  # each process's parent pid when first seen
        self.name: dict[tuple[int, float], str] = {}  # each process's command line, shortened (--by-process)
        self.peak_rss = 0
        self.peak_pss = 0  # the same sum in PSS: a page shared by n processes counts 1/n in each (a fork's pages)
        self.rss_of: dict[tuple[int, float], int] = {}  # each process's own peak RSS (--by-process)
        self.children_before = self._children_cpu()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    @staticmethod
    def _children_cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime

    def _procs(self) -> list[Any]:
        ps = self.psutil
        out = []
        with contextlib.suppress(ps.Error):
            root = ps.Process(self.root)
            out = [root, *root.children(recursive=True)]
        known = {p.pid for p in out}
        for pid, _created in list(self.cpu):
            if pid not in known:
                with contextlib.suppress(ps.Error):
                    out.append(ps.Process(pid))
        return [p for p in out if p.pid not in self.exclude]

    def _poll(self) -> None:
        ps = self.psutil
        while True:
            rss = pss = 0
            for p in self._procs():
                with contextlib.suppress(ps.Error):
                    key = (p.pid, p.create_time())
                    t = p.cpu_times()
                    self.cpu[key] = max(self.cpu.get(key, 0.0), t.user + t.system)
                    self.parent.setdefault(key, p.ppid())
                    if key not in self.name:
                        self.name[key] = short_cmdline(p.cmdline())
                    mem = p.memory_full_info()  # smaps_rollup: its PSS too
                    rss += mem.rss
                    pss += mem.pss
                    self.rss_of[key] = max(self.rss_of.get(key, 0), mem.rss)
            self.peak_rss = max(self.peak_rss, rss)
            self.peak_pss = max(self.peak_pss, pss)
            if self.stop.wait(0.25):
                return

    def finish(self) -> tuple[float, float]:
        """(CPU seconds, peak RSS in MB) of the tree since the meter started."""
        self.stop.set()
        self.thread.join()
        waited = self._children_cpu() - self.children_before
        # the reaped chain: the root, then each ended process whose parent is in it (its parent waited for it)
        reaped = {k for k in self.cpu if k[0] == self.root}
        grew = True
        while grew:
            pids = {k[0] for k in reaped}
            more = {k for k in self.cpu if k not in reaped and self.parent.get(k) in pids and not self._alive(k)}
            reaped |= more
            grew = bool(more)
        polled_reaped = sum(self.cpu[k] for k in reaped)
        others = sum(v for k, v in self.cpu.items() if k not in reaped)
        return others + max(polled_reaped, waited), self.peak_rss / 2**20

    def _alive(self, key: tuple[int, float]) -> bool:
        with contextlib.suppress(self.psutil.Error):
            p = self.psutil.Process(key[0])
            return bool(p.create_time() == key[1] and p.status() != self.psutil.STATUS_ZOMBIE)
        return False


def short_cmdline(argv: list[str]) -> str:
    """A process's command line as a reader knows it: the program's file name and its module or first arguments."""
    if not argv:
        return "?"
    words = [Path(argv[0]).name, *(Path(a).name if "/" in a else a for a in argv[1:4])]
    return " ".join(words)[:60]


def by_process(meter: TreeMeter, calls: int) -> list[str]:
    """Where the tree's CPU went: each process's CPU ms per call, largest first (what ``--by-process`` prints)."""
    rows = sorted(meter.cpu.items(), key=lambda kv: -kv[1])
    return [
        f"      {v * 1000 / calls:6.3f} ms/call  {meter.rss_of.get(k, 0) / 2**20:5.0f} MB RSS  "
        f"{meter.name.get(k, '?')} (pid {k[0]})"
        for k, v in rows
        if v > 0
    ]


def leftovers(meter: TreeMeter) -> None:
    """End what a run left running (its ledger or Ray, if they outlive it), by pid: the next run starts cold."""
    ps = meter.psutil
    for pid, created in list(meter.cpu):
        with contextlib.suppress(ps.Error):
            p = ps.Process(pid)
            if p.create_time() == created and p.is_running():
                p.terminate()
    time.sleep(1.0)
    for pid, created in list(meter.cpu):
        with contextlib.suppress(ps.Error):
            p = ps.Process(pid)
            if p.create_time() == created and p.is_running():
                p.kill()


# --- one measured run ---------------------------------------------------------------------------------------


def measure(
    name: str, cmd: list[str], fake: Fake, calls: int, latency_ms: float, cwd: Path, show_processes: bool = False
) -> dict[str, float]:
    fake.reset()
    clock = CallClock(fake)
    started = time.monotonic()
    env = {**os.environ, "PUNCHLINE_LOG_LEVEL": "warning"}
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    meter = TreeMeter(proc.pid, exclude={fake.proc.pid})
    out, err = proc.communicate()
    wall_s = time.monotonic() - started
    clock.finish()
    cpu_s, rss_mb = meter.finish()
    pss_mb = meter.peak_pss / 2**20
    leftovers(meter)
    if show_processes:
        print("\n".join(by_process(meter, calls)), flush=True)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed ({proc.returncode}):\n{out.decode()[-2000:]}\n{err.decode()[-3000:]}")
    stats = fake.stats(brief=True)
    if stats.total_calls < calls:
        raise SystemExit(f"{name}: the provider saw {stats.total_calls} calls of {calls}")
    base = clock.samples[0][1]
    first = clock.first_call_at(base)
    last = next(t for t, n in clock.samples if n - base >= calls)
    whole = calls / max(last - first, 1e-9)
    return {
        "cpu_ms": cpu_s * 1000 / calls,
        "steady": clock.steady_rate(),
        "whole": whole,
        "vs_ceiling": whole / (C / (latency_ms / 1000)) if latency_ms else 0.0,
        "rss_mb": rss_mb,
        "pss_mb": pss_mb,
        "peak": float(stats.peak_in_flight),
        "wall_s": wall_s,
        "calls": float(stats.total_calls),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--latencies", default="0,200", help="provider latencies, ms")
    ap.add_argument("--quick", action="store_true", help="300 prompts, one round")
    ap.add_argument("--by-process", action="store_true", help="print each process's CPU ms per call after each run")
    ap.add_argument("--loop-child", nargs=2, metavar=("BASE_URL", "PROMPTS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.loop_child:
        asyncio.run(loop_child(args.loop_child[0], Path(args.loop_child[1])))
        return
    if args.quick:
        args.prompts, args.rounds = 300, 1
    latencies = [float(x) for x in args.latencies.split(",") if x.strip()]
    for peer in PEERS:
        if importlib.util.find_spec(peer.split(".")[0]) is None:
            print(f"{peer}: not installed, skipped")
        else:
            print(f"{peer}: installed, but this bench has no runner for it yet: skipped")
    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; {args.prompts} prompts, 1 model, n = 1, C = {C}\n")
    results: dict[tuple[str, float], list[dict[str, float]]] = {}
    punchline = str(Path(sys.executable).with_name("punchline"))
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        for latency in latencies:
            fake = PeerFake(tmp, latency_ms_min=latency, latency_ms_max=latency)
            try:
                for r in range(args.rounds):
                    for name in ("loop", "punchline"):
                        tag = uuid.uuid4().hex[:8]
                        rows = tmp / f"rows-{tag}.jsonl"
                        write_rows(rows, args.prompts, tag)
                        if name == "loop":
                            cmd = [sys.executable, __file__, "--loop-child", fake.base_url, str(rows)]
                        else:
                            config = tmp / f"run-{tag}.toml"
                            write_config(config, rows, fake.base_url)
                            runs = tmp / f"runs-{tag}"
                            cmd = [punchline, "run", str(config), "--runs-dir", str(runs), "--no-progress"]
                            cmd += ["--store", str(tmp / f"store-{tag}")]
                        m = measure(name, cmd, fake, args.prompts, latency, tmp, args.by_process)
                        results.setdefault((name, latency), []).append(m)
                        print(
                            f"round {r + 1} {latency:4.0f} ms {name:9}: {m['cpu_ms']:6.2f} CPU ms/call, steady "
                            f"{m['steady']:6.1f} calls/s, whole run {m['whole']:6.1f} calls/s"
                            + (f" ({m['vs_ceiling']:.2f} of C/latency)" if latency else "")
                            + f", peak RSS {m['rss_mb']:6.0f} MB (PSS {m['pss_mb']:4.0f}), "
                            f"most in flight {m['peak']:.0f}, "
                            f"wall {m['wall_s']:5.1f} s",
                            flush=True,
                        )
            finally:
                fake.stop()
    print()
    for latency in latencies:
        mean = {
            name: {k: statistics.mean(m[k] for m in results[(name, latency)]) for k in results[(name, latency)][0]}
            for name in ("loop", "punchline")
        }
        loop, ours = mean["loop"], mean["punchline"]
        line = (
            f"{latency:4.0f} ms, punchline / loop: CPU per call {ours['cpu_ms'] / loop['cpu_ms']:.2f} "
            f"({ours['cpu_ms']:.2f} vs {loop['cpu_ms']:.2f} ms), steady rate {ours['steady'] / loop['steady']:.2f} "
            f"({ours['steady']:.1f} vs {loop['steady']:.1f}/s), whole-run rate {ours['whole'] / loop['whole']:.2f}, "
            f"peak RSS {ours['rss_mb']:.0f} vs {loop['rss_mb']:.0f} MB (PSS {ours['pss_mb']:.0f} vs "
            f"{loop['pss_mb']:.0f}), most in flight {ours['peak']:.0f} vs "
            f"{loop['peak']:.0f}"
        )
        if latency:
            line += f"; whole run vs C/latency: punchline {ours['vs_ceiling']:.2f}, loop {loop['vs_ceiling']:.2f}"
        print(line)


if __name__ == "__main__":
    main()
