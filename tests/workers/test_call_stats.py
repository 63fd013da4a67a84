"""What a worker records per unit and publishes per model: each unit's latency and retries in its shard file,
the 429s per model in the shard's usage, and the calls in flight and 429s the driver's /metrics reads live."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import msgspec
import redis

from punchline.data.units import LATENCY_BUCKETS_S, ModelUsage, ShardOutput, ShardUsage, UnitSpec, shard_key
from punchline.pipelines.puns.data.completions import greedy_request
from punchline.schedulers import keys
from punchline.workers.calls import call_stats
from punchline.workers.calls.call_stats import CallStats
from punchline.workers.fake.server import FakeProviderServer
from tests.workers.test_shard_worker import _run


def _run_id(calls_key: str) -> str:
    """The run id in a run's call-figures key (``keys.calls``: the run's hash tag holds it)."""
    return calls_key.split("{run:", 1)[1].split("}", 1)[0]


def test_units_record_latency_and_retries_and_the_worker_publishes_429s_and_calls_in_flight(
    tmp_path: Path, redis_client: redis.Redis, fake: FakeProviderServer
) -> None:
    """Every key's first attempt is a 429 and each call takes 0.6 s: each unit records one retry and a latency
    of at least the call; the shard's usage counts the 429s per model; the worker's published figures say how
    many calls were in flight while they ran (at most its window of 2) and, at the end, 4 429s, none in flight."""
    fake.configure(latency_ms_for_model={"slow": 600.0}, fail_first_attempts=1, fail_status=429)
    units = [UnitSpec(unit_id=f"u{i:03d}", request=greedy_request("p", "slow", f"Q {i} ___")) for i in range(4)]
    in_flight: list[int] = []
    run_ids: list[str] = []

    def sample() -> None:
        if not run_ids:  # the run id is the one the plan's pages were written under
            run_ids.extend(_run_id(k.decode()) for k in redis_client.scan_iter(match=keys.calls("pl", "w-*")))
        if run_ids:
            in_flight.append(sum(r.in_flight for r in call_stats.read(redis_client, "pl", run_ids[0])))

    plan, store, _seen = _run(tmp_path, redis_client, fake, units, window=2, on_tick=sample)
    decoder = msgspec.msgpack.Decoder(ShardOutput)
    outputs = [decoder.decode(store.get(shard_key(plan.run_id, "s", i)) or b"") for i in range(plan.shards_total)]
    results = [r for o in outputs for r in o.results]
    assert [r.retries for r in results] == [1, 1, 1, 1]
    assert all(r.latency_s is not None and r.latency_s >= 0.6 for r in results), [r.latency_s for r in results]
    usage = ShardUsage()
    for o in outputs:
        assert o.usage is not None
        usage.add(o.usage)
    slow = usage.models["slow"]
    assert (slow.calls, slow.rate_limited, slow.retries) == (4, 4, 4)
    assert sum(slow.latency_counts) == 4 and slow.latency_sum_s >= 2.4
    assert usage.provider_retries == 4 and usage.provider_requests == 8
    rows = call_stats.read(redis_client, "pl", plan.run_id)
    assert [(r.stage, r.provider, r.model, r.rate_limited, r.in_flight) for r in rows] == [("s", "p", "slow", 4, 0)]
    assert (rows[0].calls, rows[0].retries, sum(rows[0].latency_counts)) == (4, 4, 4)
    assert 1 <= max(in_flight, default=0) <= 2, in_flight


def test_a_worker_gone_quiet_counts_no_calls_in_flight_but_keeps_its_429s(redis_client: redis.Redis) -> None:
    stats = CallStats()
    scope = ("judge", "openai", "gpt")
    ctx = stats.calling(scope)
    ctx.__enter__()
    stats.throttled(scope)
    worker = keys.worker_calls("pl", "r-quiet", "w9")
    redis_client.set(worker, stats.blob(time.time()))
    redis_client.zadd(keys.calls("pl", "r-quiet"), {worker: 1.0})
    now = time.time()
    assert [(r.in_flight, r.rate_limited) for r in call_stats.read(redis_client, "pl", "r-quiet", now)] == [(1, 1)]
    later = now + call_stats.STALE_S + 1
    assert [(r.in_flight, r.rate_limited) for r in call_stats.read(redis_client, "pl", "r-quiet", later)] == [(0, 1)]
    ctx.__exit__(None, None, None)
    assert (stats.rows[scope].in_flight, stats.rows[scope].calls) == (0, 1)


def test_model_usage_merges_latency_buckets_and_old_records_still_load() -> None:
    a, b = ModelUsage(), ModelUsage()
    a.add_latency(0.07)
    b.add_latency(0.07)
    b.add_latency(1000.0)
    a.add(b)
    assert len(a.latency_counts) == len(LATENCY_BUCKETS_S) + 1
    assert a.latency_counts[1] == 2 and a.latency_counts[-1] == 1 and sum(a.latency_counts) == 3
    old = msgspec.msgpack.encode({"stage": "s", "shard": 0, "results": [{"unit_id": "u", "key": "k"}]})
    result = msgspec.msgpack.decode(old, type=ShardOutput).results[0]
    assert (result.latency_s, result.retries) == (None, 0)


def test_publishing_ends_when_its_cancellation_is_lost_inside_a_publish() -> None:
    """A cancellation that lands inside the Redis client's call can be swallowed there; before, the figures
    task then slept and published forever, its work call never ended and a killed driver's worker never left.
    It ends now (and publishes its last figures once more on its way out)."""

    class LosesCancel(CallStats):
        publishes = 0

        async def publish(self, r: object, namespace: str, run_id: str, worker_id: str) -> None:  # type: ignore[override]
            self.publishes += 1
            with contextlib.suppress(asyncio.CancelledError):  # what the client did with it
                await asyncio.sleep(0.3)

    async def main() -> tuple[bool, int]:
        stats = LosesCancel()
        task = asyncio.create_task(stats.publish_every(None, "pl", "r", "w", period_s=0.01))  # type: ignore[arg-type]
        await asyncio.sleep(0.1)  # inside its first publish
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=3.0)
        if not done:
            task.cancel()
        return bool(done), stats.publishes

    ended, publishes = asyncio.run(main())
    assert ended and publishes == 2  # the one the cancellation hit, and the last one
