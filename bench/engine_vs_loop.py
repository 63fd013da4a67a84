"""Benchmark: the engine against a hand-written asyncio loop, at scale, under a rate limit, on a resume.

    .venv/bin/python bench/engine_vs_loop.py [--jokes 205] [--quick]

Every figure is measured in this run and printed beside its baseline or target:

* **throughput** at 0 ms and 200 ms provider latency: the Puns collect stage (jokes x 5 models x (greedy + 20
  samples)) through the engine with the demo's defaults and a run-wide max_concurrency of 16 (C = 16 calls in
  flight, however many workers), and the same requests through a bare asyncio loop (``openai.AsyncOpenAI``, a
  semaphore of 16). The fake provider runs in its own process (``punchline fake-provider``) and both rates are its
  own counts over the steady part of the run (10 % to 90 % of the calls). Targets: engine >= 0.8 of the loop at 0
  ms, >= 0.9 of C / latency at 200 ms.
* **rate limit**: five models on one provider limited to 600 requests/minute (the fake enforces it with
  GCRA): achieved rate, 429s, failed units. Target: within 5 % of 600/min, < 1 % 429s, no failed unit.
* **resume to first call**: a run stopped by its budget, resumed: seconds until the first new call.
* **claim cost**: mean ``claim`` latency with 100, 10,000 and 100,000 shards queued. Target: 100k <= 2x 100.
* **rate limit over a window**: the same against a provider that counts a sliding 60 s window
  (``--rate-window-s``; the fake's ``rate_limit_window_s``), over more than two windows
  (``--window-jokes``). Target: >= 0.97 of the limit, < 0.5 % 429s.
* **first call**: in each throughput run, seconds from ``run()`` to the provider's first call (Ray
  already started by the bench).
* **memory** at 1x / 10x / 100x synthetic jokes (each scale in its own driver process): driver and worker
  peak RSS, Redis bytes kept per unit after the run, AOF bytes per unit, and the store's bytes per unit
  on disk (allocated blocks) for the response cache and the plan pages; the ``lease_lost``,
  ``shard_lease_lost`` and ``lease_lost_at_commit`` warnings in the run's ``log.jsonl``, and the requests
  the provider saw more than once (a lost lease that was real). Targets: driver at 100x <= 1.5x of 10x;
  Redis <= 100 B per unit; cache <= 1 KB per unit at 100x, plan pages no larger than the answers; 0
  spurious ``lease_lost`` at 100x.

Pieces: ``--only throughput --latencies 200``, ``--only rate --rate-window-s 60``, ``--only memory
--scales 1,10``.

``--quick`` skips the 100x memory run (about ten minutes on two cores).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODELS = {
    "3b": "meta-llama/Llama-3.2-3B-Instruct-Turbo",
    "8b": "meta-llama/Meta-Llama-3.1-8B-Instruct-Turbo",
    "70b": "meta-llama/Meta-Llama-3.1-70B-Instruct-Turbo",
    "3.3-70b": "meta-llama/Llama-3.3-70B-Instruct-Turbo",
    "405b": "meta-llama/Meta-Llama-3.1-405B-Instruct-Turbo",
}
C = 16  # calls in flight: the provider's run-wide max_concurrency (schedulers/inflight.py), whatever the workers


# --- inputs -------------------------------------------------------------------------------------------


def synthetic_jokes(n: int) -> list[dict[str, Any]]:
    """``n`` distinct jokes built from the team's samples (each sentence gets a numbered subject)."""
    sample = json.loads((ROOT / "data" / "samples" / "puns_sample.json").read_text())
    jokes = []
    for i in range(n):
        base = dict(sample[i % len(sample)])
        round_ = i // len(sample)
        base["index"] = i
        base["id"] = 100_000 + i
        if round_:
            base["sentence"] = f"(Take {round_}) " + base["sentence"]
        jokes.append(base)
    return jokes


def write_config(
    tmp: Path, name: str, base_url: str, jokes: Path, *, rpm: float | None = None, max_cost: float | None = None
) -> Path:
    rows = "\n".join(
        f'"{k}" = {{ id = "{v}", input_usd_per_mtok = 0.2, output_usd_per_mtok = 0.2 }}' for k, v in MODELS.items()
    )
    limit = f"requests_per_minute = {rpm}\n" if rpm else ""
    cap = f"max_cost_usd = {max_cost}\n" if max_cost is not None else ""
    path = tmp / f"{name}.toml"
    path.write_text(f"""
[run]
pipeline = "puns"
{cap}
[providers.together]
kind = "openai"
base_url = "{base_url}"
max_concurrency = 16
timeout_s = 30
{limit}
[providers.together.models]
{rows}

[puns]
jokes = "{jokes}"
collect = {{ provider = "together", models = {json.dumps(list(MODELS))}, samples = 20 }}
""")
    return path


# --- the fake provider, in its own process ------------------------------------------------------------


class Fake:
    def __init__(self, tmp: Path, jokes: Path, **knobs: Any) -> None:
        cfg = tmp / f"fake-{time.monotonic_ns()}.toml"
        cfg.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in knobs.items()))
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "punchline",
                "fake-provider",
                "--port",
                "0",
                "--config",
                str(cfg),
                "--answer-key",
                f"puns={jokes}",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        self.url = line.rsplit(" ", 1)[1].strip()
        self.base_url = f"{self.url}/v1"

    def stats(self, *, brief: bool = False) -> Any:
        from punchline.workers.fake.server import fetch_stats

        return fetch_stats(self.url, brief=brief)

    def reset(self) -> None:
        """Zero its counters (the calls, the peak in flight) between two measured runs."""
        from punchline.workers.fake.server import reset_remote

        reset_remote(self.url)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:  # a bench started in the background (``&``) passes SIGINT on ignored: then it is killed
            self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate(timeout=30)


class CallClock:
    """Polls the provider's call count; the steady rate is taken between 10 % and 90 % of ``total``."""

    def __init__(self, fake: Fake) -> None:
        self.fake = fake
        self.samples: list[tuple[float, int]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(OSError):  # a busy server dropped the poll: the next one counts
                self.samples.append((time.monotonic(), self.fake.stats(brief=True).total_calls))
            time.sleep(0.05)

    def finish(self) -> None:
        self.stop.set()
        self.thread.join()
        self.samples.append((time.monotonic(), self.fake.stats(brief=True).total_calls))

    def first_call_at(self, baseline: int = 0) -> float:
        return next(t for t, n in self.samples if n > baseline)

    def steady_rate(self) -> float:
        start = self.samples[0][1]
        total = self.samples[-1][1] - start
        lo = next(s for s in self.samples if s[1] - start >= 0.1 * total)
        hi = next(s for s in self.samples if s[1] - start >= 0.9 * total)
        return (hi[1] - lo[1]) / max(hi[0] - lo[0], 1e-9)


class CpuMeter:
    """CPU seconds spent by processes whose command line contains ``marker`` (Ray workers come and go,
    so they are polled and their last reading kept; Ray titles a worker ``ray::ShardWorker.work``), plus
    this process (the driver or the loop). A worker alive before the meter started counts from then."""

    def __init__(self, marker: str, services: dict[str, int]) -> None:
        import psutil

        self.psutil = psutil
        self.marker = marker
        self.services = services
        self.seen: dict[int, float] = {}
        self.before: dict[int, float] = {}
        if marker:
            for proc in psutil.Process().children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if marker in " ".join(proc.cmdline()):
                        self.before[proc.pid] = self._cpu(proc.pid)
        self.base = {name: self._cpu(pid) for name, pid in services.items()}
        self.self_start = self._self()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _cpu(self, pid: int) -> float:
        try:
            t = self.psutil.Process(pid).cpu_times()
            return float(t.user + t.system)
        except self.psutil.Error:
            return 0.0

    @staticmethod
    def _self() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    def _poll(self) -> None:
        """Known workers are read every 0.2 s (one /proc read each); the process list is walked once a
        second for new ones, so the meter costs the engine next to nothing on two shared cores."""
        walked = 0.0
        while not self.stop.is_set():
            if self.marker:
                if time.monotonic() - walked >= 1.0:
                    walked = time.monotonic()
                    for proc in self.psutil.Process().children(recursive=True):  # this run's Ray only
                        with contextlib.suppress(self.psutil.Error):
                            if self.marker in " ".join(proc.cmdline()):
                                self.seen.setdefault(proc.pid, 0.0)
                for pid in list(self.seen):
                    self.seen[pid] = max(self.seen[pid], self._cpu(pid))
            time.sleep(0.2)

    def finish(self) -> dict[str, float]:
        self.stop.set()
        self.thread.join()
        workers = sum(cpu - self.before.get(pid, 0.0) for pid, cpu in self.seen.items())
        out = {"self": self._self() - self.self_start, "workers": workers}
        out.update({name: self._cpu(pid) - self.base[name] for name, pid in self.services.items()})
        return out


# --- the two contenders -------------------------------------------------------------------------------


def plan_requests(config: Path) -> list[Any]:
    from punchline.cluster.config import load_config
    from punchline.cluster.pipeline import StageContext
    from punchline.data.stores.local import LocalStore
    from punchline.pipelines.puns.pipeline import CollectStage

    cfg = load_config(config)
    with tempfile.TemporaryDirectory() as tmp:
        return [u.request for u in CollectStage().plan(StageContext(cfg, "plan", LocalStore(tmp)))]


async def bare_loop(base_url: str, requests: list[Any]) -> None:
    """What a researcher would write by hand: one client, a semaphore of C, gather."""
    import openai

    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=3, timeout=30)
    slots = asyncio.Semaphore(C)

    async def one(req: Any) -> list[str]:
        async with slots:
            resp = await client.chat.completions.create(
                model=req.model,
                messages=[{"role": m.role, "content": m.content} for m in req.messages],
                temperature=req.temperature,
                max_tokens=req.max_tokens,
                n=req.n,
                **({"stop": list(req.stop)} if req.stop else {}),
                **({"seed": req.seed} if req.seed is not None else {}),
            )
            return [c.message.content or "" for c in resp.choices]

    await asyncio.gather(*(one(r) for r in requests))
    await client.close()


def engine_run(config: Path, tmp: Path, redis_url: str, run_id: str, store: Path, **opts: Any) -> Any:
    from punchline.cluster.run.driver import RunOptions, run

    return run(
        str(config),
        RunOptions(run_id=run_id, runs_dir=str(tmp / "runs"), redis_url=redis_url, store=str(store), **opts),
    )


# --- the measurements ---------------------------------------------------------------------------------


def throughput(tmp: Path, jokes: Path, redis_pid: int, redis_url: str, latency_ms: float) -> dict[str, float]:
    fake = Fake(tmp, jokes, latency_ms_min=latency_ms, latency_ms_max=latency_ms)
    try:
        config = write_config(tmp, f"tp{latency_ms:.0f}", fake.base_url, jokes)
        requests = plan_requests(config)
        clock = CallClock(fake)
        cpu = CpuMeter("", {"fake": fake.proc.pid})
        asyncio.run(bare_loop(fake.base_url, requests))
        clock.finish()
        loop_cpu = cpu.finish()
        loop_rate = clock.steady_rate()
        loop_peak = fake.stats(brief=True).peak_in_flight
        fake.reset()
        run_id = f"tp{latency_ms:.0f}"
        clock = CallClock(fake)
        cpu = CpuMeter("ray::ShardWorker", {"fake": fake.proc.pid, "redis": redis_pid})
        started = time.monotonic()
        rec = engine_run(config, tmp, redis_url, run_id, tmp / f"store-tp{latency_ms:.0f}")
        clock.finish()
        first_call_s = clock.first_call_at(clock.samples[0][1]) - started
        engine_cpu = cpu.finish()
        assert rec.state == "finished", rec.failures
        n = len(requests) / 1000  # CPU ms per request
        return {
            "loop_peak": loop_peak,
            "engine_peak": fake.stats(brief=True).peak_in_flight,
            "requests": len(requests),
            "loop": loop_rate,
            "engine": clock.steady_rate(),
            "first_call_s": first_call_s,
            "loop_cpu_ms": loop_cpu["self"] / n,
            "engine_cpu_ms": (engine_cpu["self"] + engine_cpu["workers"]) / n,
            "engine_workers_ms": engine_cpu["workers"] / n,
            "engine_driver_ms": engine_cpu["self"] / n,
            "redis_ms": engine_cpu["redis"] / n,
            "fake_loop_ms": loop_cpu["fake"] / n,
            "fake_engine_ms": engine_cpu["fake"] / n,
        }
    finally:
        fake.stop()


def rate_limited(tmp: Path, jokes: Path, redis_url: str, rpm: float, window_s: float = 0.0) -> dict[str, float]:
    """``window_s`` > 0: the fake counts a sliding window of that many seconds instead of GCRA."""
    knobs: dict[str, Any] = {"rate_limit_window_s": window_s} if window_s else {}
    fake = Fake(tmp, jokes, latency_ms_min=5, latency_ms_max=40, requests_per_minute=rpm, **knobs)
    name = f"rl{window_s:.0f}"
    try:
        config = write_config(tmp, name, fake.base_url, jokes, rpm=rpm)
        clock = CallClock(fake)
        rec = engine_run(config, tmp, redis_url, name, tmp / f"store-{name}")
        clock.finish()
        stats = fake.stats()
        failed = sum(len(f) for f in rec.failures.values()) if rec.failures else 0
        return {
            "rate_per_min": clock.steady_rate() * 60,
            "calls": stats.total_calls,
            "throttled": stats.faults.get("rate_limited", 0),
            "failed_units": failed,
        }
    finally:
        fake.stop()


def resume_to_first_call(tmp: Path, jokes: Path, redis_url: str) -> float:
    fake = Fake(tmp, jokes, latency_ms_min=20, latency_ms_max=20)
    try:
        full = write_config(tmp, "resume", fake.base_url, jokes)
        from punchline.data.errors import BudgetExceeded

        try:  # the same config, stopped early by a budget given on the command line
            engine_run(full, tmp, redis_url, "resume", tmp / "store-resume", max_cost_usd=0.0005)
            raise AssertionError("the budget should have stopped the first run")
        except BudgetExceeded:
            pass
        before = fake.stats().total_calls
        clock = CallClock(fake)
        started = time.monotonic()
        rec = engine_run(full, tmp, redis_url, "resume", tmp / "store-resume")
        clock.finish()
        assert rec.state == "finished", rec.failures
        return clock.first_call_at(before) - started
    finally:
        fake.stop()


def claim_cost(redis_url: str) -> dict[int, float]:
    import redis as redis_sync
    import redis.asyncio

    from punchline.schedulers.leases import BudgetTerms, Leases
    from punchline.schedulers.ledger import Ledger, StageKeys

    out = {}
    for shards in (100, 10_000, 100_000):
        Ledger(redis_sync.Redis.from_url(redis_url)).init_stage(
            "claims", f"s{shards}", pending=range(shards), shards_total=shards, units_total=shards, shards_done=0
        )

        async def go(n: int = shards) -> float:
            client = redis.asyncio.Redis.from_url(redis_url)
            leases = Leases(client, budget=BudgetTerms(run_id="claims"))
            keys = StageKeys("pl", "claims", f"s{n}")
            await leases.claim(keys, "warm", 60_000)
            count = min(n - 1, 500)
            t0 = time.perf_counter()
            for _ in range(count):
                await leases.claim(keys, "w", 60_000)
            elapsed = time.perf_counter() - t0
            await client.aclose()
            return elapsed / count * 1000

        out[shards] = asyncio.run(go())
    return out


def memory_child(scale: int, jokes_n: int, tmp: Path, redis_url: str) -> None:
    """One scale in this process (the driver): prints a JSON line with the figures."""
    import psutil
    import redis as redis_sync

    from punchline.cluster.ray_cluster.ray_runtime import ensure_ray, shutdown_ray
    from punchline.data.storage.response_cache import MARKER_MS
    from punchline.services.ray_settings import RaySettings

    jokes = tmp / f"jokes-{scale}.json"
    jokes.write_text(json.dumps(synthetic_jokes(jokes_n * scale)))
    fake = Fake(tmp, jokes)
    client = redis_sync.Redis.from_url(redis_url)
    client.flushall()
    before = int(client.info("memory")["used_memory"])
    aof_before = _aof_bytes(client)
    worker_peak = [0]
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            for proc in psutil.Process().children(recursive=True):  # this driver's Ray, not another's
                with contextlib.suppress(psutil.Error):
                    if "ShardWorker" in " ".join(proc.cmdline()):
                        worker_peak[0] = max(worker_peak[0], proc.memory_info().rss)
            time.sleep(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    try:
        ensure_ray(RaySettings(num_cpus=2))
        watcher.start()
        config = write_config(tmp, f"mem{scale}", fake.base_url, jokes)
        rec = engine_run(config, tmp, redis_url, f"mem{scale}", tmp / f"store-mem{scale}")
        assert rec.state == "finished", rec.failures
        units = rec.counters["collect"].units_total
        paid_twice = sum(n - 1 for n in fake.stats().calls.values() if n > 1)  # a request the provider saw again
    finally:
        stop.set()
        fake.stop()
        shutdown_ray()
    right_after = int(client.info("memory")["used_memory"])
    time.sleep(MARKER_MS / 1000 + 1)  # the last commits' done markers expire (they live 10 s, then nothing)
    after = int(client.info("memory")["used_memory"])
    store = tmp / f"store-mem{scale}"
    cache_bytes = _disk_bytes(store / "_cache")
    plan_bytes = sum(_disk_bytes(p) for p in store.glob("*/stages/*/plan"))
    print(
        json.dumps(
            {
                "scale": scale,
                "units": units,
                "driver_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "worker_peak_mb": worker_peak[0] / 2**20,
                "redis_bytes_per_unit": (after - before) / units,
                "redis_bytes_right_after": (right_after - before) / units,
                "aof_bytes_per_unit": (_aof_bytes(client) - aof_before) / units,
                "cache_disk_per_unit": cache_bytes / units,
                "plan_disk_per_unit": plan_bytes / units,
                "cache_files": sum(1 for p in (store / "_cache").rglob("*") if p.is_file()),
                **warnings(tmp / "runs" / f"mem{scale}" / "log.jsonl", LEASE_WARNINGS),
                "paid_twice": paid_twice,
            }
        )
    )


LEASE_WARNINGS = ("lease_lost", "shard_lease_lost", "lease_lost_at_commit")


def warnings(log: Path, events: tuple[str, ...]) -> dict[str, int]:
    """How many times each of ``events`` is in a run's ``log.jsonl`` (every process of the run writes there)."""
    counts = dict.fromkeys(events, 0)
    with log.open() as lines:
        for line in lines:
            if any(f'"{e}"' in line for e in events):  # cheap filter before parsing
                event = json.loads(line).get("event")
                if event in counts:
                    counts[event] += 1
    return counts


def _disk_bytes(folder: Path) -> int:
    """Bytes a folder's files take on disk (allocated blocks, as ``du`` counts them)."""
    return sum(p.stat().st_blocks * 512 for p in folder.rglob("*") if p.is_file())


def _aof_bytes(client: Any) -> int:
    info = client.info("persistence")
    return int(info.get("aof_current_size", 0) or 0)


def memory(tmp: Path, redis_url: str, jokes_n: int, scales: list[int]) -> list[dict[str, float]]:
    rows = []
    for scale in scales:
        done = subprocess.run(
            [
                sys.executable,
                __file__,
                "--memory-child",
                str(scale),
                "--jokes",
                str(jokes_n),
                "--tmp",
                str(tmp),
                "--redis-url",
                redis_url,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"memory run at {scale}x failed:\n{done.stderr[-3000:]}")
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jokes", type=int, default=205, help="jokes at 1x (the Puns study has 205)")
    ap.add_argument("--rate-jokes", type=int, default=40, help="jokes in the rate-limited run")
    ap.add_argument("--rpm", type=float, default=600.0)
    ap.add_argument("--rate-window-s", type=float, default=60.0, help="the windowed provider's window (0: skip)")
    ap.add_argument("--window-jokes", type=int, default=120, help="jokes in the windowed rate run (> one window)")
    ap.add_argument("--latencies", default="0,200", help="provider latencies (ms) of the throughput runs")
    ap.add_argument("--scales", default="", help="memory scales, e.g. 1,10,100 (default: 1,10,100; --quick 1,10)")
    ap.add_argument("--quick", action="store_true", help="memory at 1x and 10x only")
    ap.add_argument("--only", default="", help="comma list of: throughput,rate,resume,claims,memory")
    ap.add_argument("--memory-child", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--tmp", default="", help=argparse.SUPPRESS)
    ap.add_argument("--redis-url", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.environ.setdefault("PUNCHLINE_LOG_LEVEL", "warning")
    if args.memory_child:
        memory_child(args.memory_child, args.jokes, Path(args.tmp), args.redis_url)
        return
    only = set(filter(None, args.only.split(","))) or {"throughput", "rate", "resume", "claims", "memory"}

    from punchline.cluster.ray_cluster.ray_runtime import ensure_ray, shutdown_ray
    from punchline.services.ray_settings import RaySettings
    from punchline.services.redis_server import EmbeddedRedis

    with tempfile.TemporaryDirectory() as tmp_s, EmbeddedRedis(Path(tmp_s) / "redis", wipe_commands=True) as server:
        tmp = Path(tmp_s)
        jokes = tmp / "jokes.json"
        jokes.write_text(json.dumps(synthetic_jokes(args.jokes)))
        rate_jokes = tmp / "rate-jokes.json"
        rate_jokes.write_text(json.dumps(synthetic_jokes(args.rate_jokes)))
        window_jokes = tmp / "window-jokes.json"
        window_jokes.write_text(json.dumps(synthetic_jokes(args.window_jokes)))
        print(f"2 cores, C = {C} calls in flight, {len(MODELS)} models, 20 samples + greedy per joke and model\n")
        if only & {"throughput", "rate", "resume"}:
            ensure_ray(RaySettings(num_cpus=2))
        if "throughput" in only:
            for latency in [float(x) for x in args.latencies.split(",") if x.strip()]:
                r = throughput(tmp, jokes, server.pid or 0, server.url, latency)
                line = f"latency {latency:5.0f} ms, {r['requests']} requests: loop {r['loop']:6.1f} req/s, "
                line += f"engine {r['engine']:6.1f} req/s, engine/loop {r['engine'] / r['loop']:.2f}"
                if latency:
                    ceiling = C / (latency / 1000)
                    line += (
                        f", engine/(C/latency) {r['engine'] / ceiling:.2f}, loop/(C/latency) {r['loop'] / ceiling:.2f}"
                    )
                print(line, flush=True)
                print(f"    first provider call {r['first_call_s']:.2f} s after the run started (Ray up)", flush=True)
                print(
                    f"    most calls in flight at the provider: loop {r['loop_peak']}, engine {r['engine_peak']}",
                    flush=True,
                )
                print(
                    f"    CPU per request: loop {r['loop_cpu_ms']:.2f} ms; engine {r['engine_cpu_ms']:.2f} ms "
                    f"(workers {r['engine_workers_ms']:.2f}, driver {r['engine_driver_ms']:.2f}) + Redis "
                    f"{r['redis_ms']:.2f} ms; the fake provider {r['fake_loop_ms']:.2f} / {r['fake_engine_ms']:.2f} ms",
                    flush=True,
                )
        if "rate" in only:
            r = rate_limited(tmp, rate_jokes, server.url, args.rpm)
            print(
                f"rate limit {args.rpm:.0f}/min on the provider, 5 models: achieved {r['rate_per_min']:.1f}/min "
                f"(ratio {r['rate_per_min'] / args.rpm:.3f}), {r['throttled']} of {r['calls']} calls 429 "
                f"({100 * r['throttled'] / max(r['calls'], 1):.2f} %), {r['failed_units']} failed units",
                flush=True,
            )
            if args.rate_window_s:
                r = rate_limited(tmp, window_jokes, server.url, args.rpm, args.rate_window_s)
                print(
                    f"rate limit {args.rpm:.0f}/min over a sliding {args.rate_window_s:.0f} s window, 5 models: "
                    f"achieved {r['rate_per_min']:.1f}/min (ratio {r['rate_per_min'] / args.rpm:.3f}), "
                    f"{r['throttled']} of {r['calls']} calls 429 ({100 * r['throttled'] / max(r['calls'], 1):.2f} %), "
                    f"{r['failed_units']} failed units",
                    flush=True,
                )
        if "resume" in only:
            print(f"resume to first call: {resume_to_first_call(tmp, jokes, server.url):.2f} s", flush=True)
        if only & {"throughput", "rate", "resume"}:
            shutdown_ray()
        if "claims" in only:
            cost = claim_cost(server.url)
            cells = ", ".join(f"{n:,} shards {ms:.3f} ms" for n, ms in cost.items())
            print(f"claim cost: {cells}; 100k / 100 = {cost[100_000] / cost[100]:.2f}", flush=True)
        if "memory" in only:
            scales = [int(x) for x in args.scales.split(",") if x.strip()] or ([1, 10] if args.quick else [1, 10, 100])
            rows = memory(tmp, server.url, args.jokes, scales)
            for r in rows:
                print(
                    f"memory {r['scale']:>3}x ({r['units']:>7,} units): driver peak {r['driver_peak_mb']:7.1f} MB, "
                    f"worker peak {r['worker_peak_mb']:6.1f} MB, Redis {r['redis_bytes_per_unit']:7.1f} B/unit "
                    f"({r['redis_bytes_right_after']:.1f} before the done markers expired), "
                    f"AOF {r['aof_bytes_per_unit']:7.1f} B/unit; on disk: cache {r['cache_disk_per_unit']:6.1f} B/unit "
                    f"({r['cache_files']:,} files), plan pages {r['plan_disk_per_unit']:6.1f} B/unit; "
                    f"warnings: lease_lost {r['lease_lost']:,}, shard_lease_lost {r['shard_lease_lost']:,}, "
                    f"lease_lost_at_commit {r['lease_lost_at_commit']:,}; requests paid twice {r['paid_twice']:,}",
                    flush=True,
                )
            by = {r["scale"]: r for r in rows}
            if 100 in by and 10 in by:  # the ratio needs both (`--scales 100` alone prints the rows)
                print(f"driver peak 100x / 10x = {by[100]['driver_peak_mb'] / by[10]['driver_peak_mb']:.2f}")


if __name__ == "__main__":
    main()
