"""A worker refuses to start on a node that does not see the driver's store (its sentinel)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from punchline.data.errors import StoreError
from punchline.data.stores import open_store
from punchline.data.stores.sentinel import plant
from punchline.workers.shard_actor import ShardWorker
from punchline.workers.shard_worker import WorkerConfig


def test_a_worker_that_cannot_see_the_sentinel_does_not_start(tmp_path: Path, redis_url: str) -> None:
    sentinel = plant(open_store(str(tmp_path / "drivers-view")), "r1")
    cfg = WorkerConfig(
        run_id="r1",
        redis_url=redis_url,
        store_url=str(tmp_path / "nodes-own-disk"),
        providers={},
        store_sentinel=sentinel,
    )
    with pytest.raises(StoreError, match=r"not shared: worker w1@.* cannot see what the driver wrote there"):
        ShardWorker(msgspec.msgpack.encode(cfg), "w1")
    seen = msgspec.structs.replace(cfg, store_url=str(tmp_path / "drivers-view"))
    assert ShardWorker(msgspec.msgpack.encode(seen), "w2").ping().startswith("w2@")
