"""The run-wide bound on calls in flight (``max_concurrency`` of a provider, and of a model), held in Redis
across workers: two workers against one Redis and the fake provider over HTTP, whose own count of the calls it
held at once is the measure; and a crashed holder's places, which lapse with their ttl."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import msgspec
import pytest
import redis
import redis.asyncio

from punchline.data.provider_settings import ModelSettings, ProviderSettings
from punchline.data.stores.local import LocalStore
from punchline.data.units import ShardOutput, StagePlan, UnitSpec, cut, encode_page, plan_page_key, shard_key
from punchline.pipelines.puns.data.completions import greedy_request
from punchline.schedulers import keys
from punchline.schedulers.inflight import RunWideSlots, Ticket
from punchline.schedulers.leases import BudgetTerms, Leases
from punchline.schedulers.ledger import Ledger
from punchline.schedulers.rate_limit import RedisRateLimiter
from punchline.workers.fake.server import FakeProviderServer
from punchline.workers.providers import make_provider
from punchline.workers.shard_worker import ShardProcessor, WorkerConfig, WorkerReport
from tests.fixtures.redis import client_url


def _plan(store: LocalStore, run_id: str, units: list[UnitSpec]) -> StagePlan:
    def put(page: object) -> None:
        assert hasattr(page, "first_shard")
        store.put(plan_page_key(run_id, "s", page.first_shard // 4), encode_page(page))  # type: ignore[arg-type]

    shape = cut("s", units, 2, 4, on_page=put)
    return StagePlan(
        run_id=run_id,
        stage="s",
        shard_size=2,
        shards_per_page=4,
        units_total=shape.units_total,
        shards_total=shape.shards_total,
        digest=shape.digest,
    )


def _two_workers(
    tmp_path: Path, redis_client: redis.Redis, settings: ProviderSettings, units: list[UnitSpec], window: int
) -> tuple[StagePlan, LocalStore, list[WorkerReport]]:
    """Two workers, each with its own Redis client, store handle and provider, run one stage together."""
    run_id = f"b-{uuid.uuid4().hex[:8]}"
    store = LocalStore(tmp_path / "store")
    plan = _plan(store, run_id, units)
    Ledger(redis_client).init_stage(
        run_id,
        "s",
        pending=range(plan.shards_total),
        shards_total=plan.shards_total,
        units_total=len(units),
        shards_done=0,
    )
    url = client_url(redis_client)
    cfg = WorkerConfig(
        run_id=run_id, redis_url=url, store_url=store.url, providers={"p": settings}, max_in_flight=window
    )

    async def worker(name: str) -> WorkerReport:
        client = redis.asyncio.Redis.from_url(url)
        try:
            proc = ShardProcessor(
                cfg,
                name,
                leases=Leases(client, budget=BudgetTerms(run_id=run_id)),
                store=LocalStore(tmp_path / "store"),
                providers={"p": make_provider("p", settings)},
                limiter=RedisRateLimiter(redis_client, {"p": settings}),
            )
            return await proc.work(plan)
        finally:
            await client.aclose()

    async def both() -> list[WorkerReport]:
        return list(await asyncio.gather(worker("w1"), worker("w2")))

    return plan, store, asyncio.run(both())


@pytest.mark.slow
def test_two_workers_together_never_exceed_the_providers_bound(
    tmp_path: Path, redis_client: redis.Redis, fake: FakeProviderServer
) -> None:
    """Each worker would keep 6 calls in flight (its window), 12 together; the provider's max_concurrency of
    6 is run-wide, so the fake provider, which counts the calls it holds at once, never holds more than 6.
    Every unit is still answered once."""
    fake.configure(latency_ms_min=60.0, latency_ms_max=60.0)
    settings = fake.provider_settings(
        "openai", max_concurrency=6, models={"m": ModelSettings(id="m", input_usd_per_mtok=1.0)}
    )
    tag = uuid.uuid4().hex[:8]
    units = [UnitSpec(unit_id=f"u{i:03d}", request=greedy_request("p", "m", f"{tag} {i} ___")) for i in range(48)]
    plan, store, reports = _two_workers(tmp_path, redis_client, settings, units, window=6)
    stats = fake.stats()
    assert stats.total_calls == 48
    assert 2 <= stats.peak_in_flight <= 6, stats
    assert sum(r.shards_committed for r in reports) == plan.shards_total
    assert all(r.shards_committed > 0 for r in reports), reports  # both workers took part
    decoder = msgspec.msgpack.Decoder(ShardOutput)
    outputs = [decoder.decode(store.get(shard_key(plan.run_id, "s", i)) or b"") for i in range(plan.shards_total)]
    assert sorted(r.unit_id for o in outputs for r in o.results if r.response is not None) == [u.unit_id for u in units]
    # every place was given back: nothing of the bound stays in Redis once the calls are done
    assert redis_client.zcard(keys.inflight("pl", "p")) == 0


@pytest.mark.slow
def test_a_models_own_bound_holds_under_the_providers(
    tmp_path: Path, redis_client: redis.Redis, fake: FakeProviderServer
) -> None:
    """A model's own max_concurrency (2) bounds its calls across both workers, under a provider bound of 8."""
    fake.configure(latency_ms_min=60.0, latency_ms_max=60.0)
    settings = fake.provider_settings(
        "openai", max_concurrency=8, models={"m": ModelSettings(id="m", input_usd_per_mtok=1.0, max_concurrency=2)}
    )
    tag = uuid.uuid4().hex[:8]
    units = [UnitSpec(unit_id=f"u{i:03d}", request=greedy_request("p", "m", f"{tag} {i} ___")) for i in range(16)]
    _two_workers(tmp_path, redis_client, settings, units, window=4)
    stats = fake.stats()
    assert stats.total_calls == 16
    assert 1 <= stats.peak_in_flight <= 2, stats


def _slots(redis_client: redis.Redis, owner: str, ttl_ms: int, limit: int) -> tuple[redis.asyncio.Redis, RunWideSlots]:
    client = redis.asyncio.Redis.from_url(client_url(redis_client))
    settings = ProviderSettings(max_concurrency=limit, models={"m": ModelSettings(id="m")})
    return client, RunWideSlots(client, {"p": settings}, owner=owner, ttl_ms=ttl_ms)


def test_a_crashed_holders_places_lapse_and_a_live_holders_do_not(redis_client: redis.Redis) -> None:
    """Worker A takes both places of a bound of 2. While A renews them, B waits, however long past their ttl;
    once A stops renewing (it crashed: it never gives them back), they lapse and B gets one."""

    async def go() -> None:
        ca, a = _slots(redis_client, "A", ttl_ms=400, limit=2)
        cb, b = _slots(redis_client, "B", ttl_ms=400, limit=2)
        try:
            held = [await a.take("p", "m"), await a.take("p", "m")]
            assert all(isinstance(t, Ticket) for t in held)
            waiting = asyncio.create_task(b.take("p", "m"))
            for _ in range(8):  # 1.2 s: three times the ttl, renewed every 150 ms
                await asyncio.sleep(0.15)
                assert await a.renew() == 0
                assert not waiting.done()
            assert redis_client.zcard(keys.inflight("pl", "p")) == 2
            got = await asyncio.wait_for(waiting, timeout=30)  # A is gone: no renewal, no give
            assert isinstance(got, Ticket) and got.token.startswith("B#")
            assert await a.renew() == 2  # A's heartbeat, were it alive, would hear it lost both
        finally:
            await ca.aclose()
            await cb.aclose()

    asyncio.run(go())


def test_a_place_given_back_goes_to_the_next_waiter(redis_client: redis.Redis) -> None:
    """A place given back goes first to a unit of the same worker waiting for it (no Redis call), else to
    Redis, where another worker's waiting unit takes it; a cancelled waiter leaks nothing."""

    async def go() -> None:
        ca, a = _slots(redis_client, "A", ttl_ms=30_000, limit=1)
        cb, b = _slots(redis_client, "B", ttl_ms=30_000, limit=1)
        try:
            first = await a.take("p", "m")
            assert first is not None
            own_waiter = asyncio.create_task(a.take("p", "m"))
            other = asyncio.create_task(b.take("p", "m"))
            cancelled = asyncio.create_task(b.take("p", "m"))
            await asyncio.sleep(0.1)
            cancelled.cancel()
            a.give(first)
            handed = await asyncio.wait_for(own_waiter, timeout=10)
            assert handed is not None and handed.token == first.token  # handed on in the worker
            assert not other.done()
            a.give(handed)
            got = await asyncio.wait_for(other, timeout=10)
            assert got is not None and got.token.startswith("B#")
            assert redis_client.zrange(keys.inflight("pl", "p"), 0, -1) == [got.token.encode()]
            b.give(got)
            for _ in range(200):  # the give-back's round trip
                if redis_client.zcard(keys.inflight("pl", "p")) == 0:
                    break
                await asyncio.sleep(0.05)
            assert redis_client.zcard(keys.inflight("pl", "p")) == 0
            assert a.held() == b.held() == 0
        finally:
            await ca.aclose()
            await cb.aclose()

    asyncio.run(go())
