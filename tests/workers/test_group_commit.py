"""The group commit writes a pack as soon as half of its room is taken, not only after its linger: a fast
provider's answers would otherwise fill the room within the linger, and the units after them would keep
their call slots until a later pack was durable (the demo's collect ran at two thirds of its rate limit)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import redis
import redis.asyncio

from punchline.data.requests import ProviderResponse
from punchline.data.storage.response_cache import CachedResponse, ResponseCache
from punchline.data.stores.local import LocalStore
from punchline.pipelines.puns.data.completions import greedy_request
from punchline.schedulers.leases import BudgetTerms, Grant, Leases, Settle
from punchline.workers.group_commit import GroupCommit
from punchline.workers.shard_worker import _Held
from tests.fixtures.redis import client_url


def test_half_the_room_taken_writes_the_pack_without_waiting_for_the_linger(
    tmp_path: Path, redis_client: redis.Redis
) -> None:
    cache = ResponseCache(LocalStore(tmp_path / "store"))
    tag = uuid.uuid4().hex[:8]
    requests = [greedy_request("p", "m", f"{tag} {i} ___") for i in range(2)]

    async def go() -> list[tuple[CachedResponse, bool]]:
        client = redis.asyncio.Redis.from_url(client_url(redis_client))
        leases = Leases(client, budget=BudgetTerms(run_id=f"gc-{tag}"))
        commits = GroupCommit(cache, leases, _Held(), linger_s=60.0, max_waiting=4)
        settles = []
        for r in requests:
            grant = await leases.acquire(r.key(), "w1", 30_000)
            assert isinstance(grant, Grant)
            settles.append(Settle(grant))
        entries = [CachedResponse(request=r, response=ProviderResponse(texts=["x"])) for r in requests]
        try:  # two of four: durable and committed long before the 60 s linger
            return await asyncio.wait_for(
                asyncio.gather(*(commits.submit(e, s) for e, s in zip(entries, settles, strict=True))), 30.0
            )
        finally:
            await client.aclose()

    done = asyncio.run(go())
    assert [ok for _, ok in done] == [True, True]
    assert all(cache.get(r.key()) is not None for r in requests)
