"""Benchmark: N worker processes share the Redis rate limiter against a rate-limited fake provider.

    .venv/bin/python bench/rate_limit.py [--duration-s 75] [--workers 8] [--rpm 600] [--client-rpm R]
                                         [--redis-url URL]

Starts the fake provider (GCRA limit ``--rpm``, one second of burst, or with ``--window-s`` a sliding window
of that many seconds; 5-40 ms latency) and, unless
``--redis-url`` is given, an embedded redis-server; then ``--workers`` processes, each with its own
provider client and limiter, send requests as fast as the limiter lets them for ``--duration-s``.
Prints the achieved rate against the limit and the share of calls answered 429.
Target: >= 0.97 of the limit (never above it) and under 0.5 % of 429s.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from punchline.data.errors import ProviderError  # noqa: E402
from punchline.data.provider_settings import ProviderSettings  # noqa: E402
from punchline.pipelines.puns.data.completions import greedy_request  # noqa: E402
from punchline.schedulers.rate_limit import RedisRateLimiter  # noqa: E402
from punchline.schedulers.server.redis_client import connect  # noqa: E402
from punchline.services.redis_server import EmbeddedRedis  # noqa: E402
from punchline.workers.calls.retry import AttemptEvent, RetryPolicy, call_with_retries  # noqa: E402
from punchline.workers.fake.server import FakeConfig, FakeProviderServer  # noqa: E402
from punchline.workers.providers import make_provider  # noqa: E402

MODEL = "meta-llama/Meta-Llama-3.1-8B-Instruct-Turbo"


async def _worker_loop(
    index: int, base_url: str, redis_url: str, rpm: float, duration_s: float, ready: mp.Queue, go: Any
) -> tuple[int, int]:
    settings = ProviderSettings(kind="openai", base_url=base_url, timeout_s=10, requests_per_minute=rpm)
    provider = make_provider("bench", settings)
    limiter = RedisRateLimiter(connect(redis_url), {"bench": settings})
    ready.put(index)
    await asyncio.to_thread(go.wait)
    deadline = time.time() + duration_s
    policy = RetryPolicy(max_retries=5, base_delay_s=0.05, max_delay_s=1.0)
    throttled = 0
    ok = 0

    def seen(event: AttemptEvent) -> None:
        nonlocal throttled
        throttled += event.status == 429

    i = 0
    try:
        while time.time() < deadline:
            request = greedy_request("bench", MODEL, f"Worker {index} request {i} is about the")
            i += 1
            try:
                await call_with_retries(provider, request, policy, rate_limiter=limiter, on_attempt=seen)
                ok += 1
            except ProviderError:
                pass
    finally:
        await provider.aclose()
    return ok, throttled


def _worker(
    index: int, base_url: str, redis_url: str, rpm: float, duration_s: float, ready: mp.Queue, go: Any, out: mp.Queue
) -> None:
    out.put(asyncio.run(_worker_loop(index, base_url, redis_url, rpm, duration_s, ready, go)))


def run(
    duration_s: float,
    workers: int,
    rpm: float,
    redis_url: str | None,
    client_rpm: float | None = None,
    window_s: float = 0.0,
) -> dict[str, float]:
    """``client_rpm`` (default ``rpm``) is the limit the workers are configured with: set it above
    ``rpm`` to see the limiter find the provider's real limit. ``window_s`` > 0: the provider counts a
    sliding window of that many seconds instead of GCRA."""
    client_rpm = client_rpm or rpm
    with tempfile.TemporaryDirectory() as tmp:
        embedded = None
        if redis_url is None:
            embedded = EmbeddedRedis(Path(tmp) / "redis", wipe_commands=True)
            embedded.start()
            redis_url = embedded.url
        server = FakeProviderServer(
            FakeConfig(requests_per_minute=rpm, latency_ms_min=5, latency_ms_max=40, rate_limit_window_s=window_s)
        )
        server.start()
        try:
            ctx = mp.get_context("spawn")
            out: mp.Queue = ctx.Queue()
            ready: mp.Queue = ctx.Queue()
            go = ctx.Event()
            procs = [
                ctx.Process(
                    target=_worker, args=(i, server.openai_base_url, redis_url, client_rpm, duration_s, ready, go, out)
                )
                for i in range(workers)
            ]
            for p in procs:
                p.start()
            for _ in procs:  # every process has imported and connected: start the clock together
                ready.get(timeout=120)
            server.reset()
            start = time.time()
            go.set()
            time.sleep(duration_s)
            stats = server.stats()  # the window's figures; calls still in flight are not counted
            elapsed = time.time() - start
            results = [out.get(timeout=60) for _ in procs]
            for p in procs:
                p.join(timeout=10)
        finally:
            server.stop()
            if embedded is not None:
                embedded.stop()
    achieved_rpm = stats.ok / elapsed * 60
    return {
        "duration_s": round(elapsed, 1),
        "workers": workers,
        "limit_rpm": rpm,
        "client_rpm": client_rpm,
        "window_s": window_s,
        "achieved_rpm": round(achieved_rpm, 1),
        "ratio": round(achieved_rpm / rpm, 4),
        "calls": stats.total_calls,
        "ok": stats.ok,
        "http_429": stats.faults["rate_limited"],
        "pct_429": round(100 * stats.faults["rate_limited"] / max(1, stats.total_calls), 3),
        "client_seen_429": sum(r[1] for r in results),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration-s", type=float, default=75.0)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--rpm", type=float, default=600.0)
    parser.add_argument("--client-rpm", type=float, default=None, help="limit the workers believe (default --rpm)")
    parser.add_argument("--redis-url", default=None)
    parser.add_argument("--window-s", type=float, default=0.0, help="the provider counts a sliding window (0: GCRA)")
    args = parser.parse_args(argv)
    figures = run(args.duration_s, args.workers, args.rpm, args.redis_url, args.client_rpm, args.window_s)
    for k, v in figures.items():
        print(f"{k:>16}: {v}")
    ok = 0.97 <= figures["ratio"] <= 1.0 + 1e-3 and figures["pct_429"] < 0.5
    print("target met" if ok else "TARGET MISSED (>= 0.97 of the limit, < 0.5 % 429s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
