"""``retry-failed``'s work: drop the committed shards that hold failed units, so that resuming the run
calls only those units again (their answers that did come back are in the response cache).

Later stages depend on the retried results, so every stage's manifest is dropped too when anything was:
the resumed run rebuilds them from the shards.
"""

from __future__ import annotations

import msgspec

from punchline.cluster.driver import RunRecord
from punchline.cluster.runs import load_run_record
from punchline.data.run_layout import RunLayout
from punchline.data.store import Store
from punchline.data.stores import open_store
from punchline.data.units import ShardOutput


class DroppedShards(msgspec.Struct, kw_only=True):
    """What was dropped, per stage (shard keys), and whether the manifests went with them."""

    run_id: str
    shards: dict[str, list[str]]
    manifests_dropped: bool
    config_path: str = ""  # what resumes the run: its config and its store
    store_url: str = ""

    @property
    def count(self) -> int:
        return sum(len(keys) for keys in self.shards.values())


def drop_failed(runs_dir: str, run_id: str) -> DroppedShards:
    """Drop the failed shards of run ``run_id`` (its record under ``runs_dir``) in the store it names."""
    record = load_run_record(runs_dir, run_id)
    return drop_failed_shards(record, open_store(record.services.store_url))


def drop_failed_shards(record: RunRecord, store: Store) -> DroppedShards:
    decoder = msgspec.msgpack.Decoder(ShardOutput)
    dropped: dict[str, list[str]] = {}
    for stage in record.stages:
        for key in list(store.list(RunLayout(record.run_id).shards(stage))):
            raw = store.get(key)
            if raw is not None and any(r.error for r in decoder.decode(raw).results):
                store.delete(key)
                dropped.setdefault(stage, []).append(key)
    if dropped:
        for stage in record.stages:
            store.delete(RunLayout(record.run_id).manifest(stage))
    return DroppedShards(
        run_id=record.run_id,
        shards=dropped,
        manifests_dropped=bool(dropped),
        config_path=record.config_path,
        store_url=record.services.store_url,
    )
