"""Answers paid before a fatal S3 outage are kept on the node's disk and committed on resume
(data/storage/response_spool.py): real Redis, moto S3 behind a TCP proxy that is switched off, the fake provider."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import msgspec
import pytest
import redis
import redis.asyncio

from punchline.data.errors import StoreError
from punchline.data.provider_settings import ModelSettings
from punchline.data.storage.response_cache import ResponseCache
from punchline.data.storage.response_spool import ResponseSpool
from punchline.data.stores.s3 import S3Settings, S3Store
from punchline.data.units import ShardOutput, StagePlan, UnitSpec, cut, encode_page, plan_page_key, shard_key
from punchline.pipelines.puns.data.completions import greedy_request
from punchline.schedulers.leases import BudgetTerms, Leases
from punchline.schedulers.ledger import Ledger
from punchline.workers.fake.server import FakeProviderServer
from punchline.workers.providers import make_provider
from punchline.workers.shard_worker import ShardProcessor, WorkerConfig
from tests.fixtures.redis import client_url
from tests.fixtures.s3 import TcpProxy


def test_the_spool_commits_into_the_cache_once(tmp_path: Path) -> None:
    from punchline.data.requests import ProviderResponse
    from punchline.data.stores.local import LocalStore

    spool = ResponseSpool(tmp_path / "spool")
    request = greedy_request("p", "m", "A joke ___")
    spool.keep(request, ProviderResponse(texts=["cat"], input_tokens=3, output_tokens=1))
    (tmp_path / "spool" / ".torn.msgpack.tmp").write_bytes(b"half")  # a crash mid-write: never counted
    cache = ResponseCache(LocalStore(tmp_path / "store"))
    assert [p.name for p in spool.pending()] == [f"{request.key()}.msgpack"]
    assert spool.commit(cache) == 1 and spool.pending() == []
    hit = cache.get(request.key())
    assert hit is not None and hit.response.texts == ["cat"]


def _plan(store: S3Store, run_id: str, units: list[UnitSpec]) -> StagePlan:
    def put(page: object) -> None:
        store.put(plan_page_key(run_id, "s", page.first_shard // 4), encode_page(page))  # type: ignore[attr-defined,arg-type]

    shape = cut("s", units, 2, 4, on_page=put)
    return StagePlan(
        run_id=run_id, stage="s", shard_size=2, shards_per_page=4,
        units_total=shape.units_total, shards_total=shape.shards_total, digest=shape.digest,
    )  # fmt: skip


@pytest.mark.timeout(600)
def test_answers_paid_before_a_fatal_s3_outage_are_not_paid_again_on_resume(
    tmp_path: Path,
    redis_client: redis.Redis,
    fake: FakeProviderServer,
    s3_proxy: TcpProxy,
    s3_settings: S3Settings,
    s3_url: str,
) -> None:
    quick = {"retry_initial_s": 0.05, "retry_max_s": 0.3, "max_attempts": 1, "connect_timeout_s": 2.0}
    settings = msgspec.structs.replace(s3_settings, endpoint_url=s3_proxy.url, outage_s=1.0, **quick)
    store = S3Store.from_url(s3_url, settings)
    run_id = f"sp-{uuid.uuid4().hex[:8]}"
    # the calls are slow, so S3 can be cut while they are in flight (after their last store read)
    fake.configure(latency_ms_for_model={"slow": 3000.0})
    units = [
        UnitSpec(unit_id=f"u{i}", request=greedy_request("p", "slow", f"Spool joke {run_id} {i} ___")) for i in range(2)
    ]
    plan = _plan(store, run_id, units)
    Ledger(redis_client).init_stage(
        run_id, "s", pending=range(plan.shards_total), shards_total=plan.shards_total, units_total=2, shards_done=0
    )
    provider = fake.provider_settings("openai", models={"slow": ModelSettings(id="slow", input_usd_per_mtok=1.0)})
    url = client_url(redis_client)
    spool_dir = tmp_path / "runs" / run_id / "spool"
    cfg = WorkerConfig(
        run_id=run_id, redis_url=url, store_url=store.url, providers={"p": provider}, lease_ms=5_000,
        spool_dir=str(spool_dir),
    )  # fmt: skip
    before = fake.stats().total_calls

    async def work(worker: str, during: float | None) -> BaseException | None:
        client = redis.asyncio.Redis.from_url(url)
        proc = ShardProcessor(
            cfg,
            worker,
            leases=Leases(client, budget=BudgetTerms(run_id=run_id)),
            store=store,
            providers={"p": make_provider("p", provider)},
        )
        task = asyncio.create_task(proc.work(plan))
        if during is not None:
            deadline = time.monotonic() + 300
            while fake.stats().total_calls < before + 2:  # both calls reached the provider: cut S3 now
                assert time.monotonic() < deadline, "the calls never started"
                await asyncio.sleep(0.02)
            s3_proxy.down()
        try:
            await task
        except BaseException as exc:
            return exc
        finally:
            await client.aclose()
        return None

    try:
        failed = asyncio.run(asyncio.wait_for(work("w1", during=1.0), timeout=300))
    finally:
        s3_proxy.up()
    assert isinstance(failed, StoreError), failed  # the work call ends with the store's error, not a hang
    assert fake.stats().total_calls == before + 2
    assert len(ResponseSpool(spool_dir).pending()) == 2, "the paid answers were not kept"
    assert store.get(shard_key(run_id, "s", 0)) is None  # nothing committed while S3 was down
    # a new worker of the run on this machine (the resume) commits them first: no call is paid twice
    assert asyncio.run(work("w2", during=None)) is None
    assert fake.stats().total_calls == before + 2
    assert ResponseSpool(spool_dir).pending() == []
    output = msgspec.msgpack.decode(store.get(shard_key(run_id, "s", 0)) or b"", type=ShardOutput)
    assert [r.unit_id for r in output.results] == ["u0", "u1"] and all(r.response for r in output.results)
