"""Dropping the committed shards that hold failed units, so that resuming the run calls only those units again
(their answers that did come back are in the response cache, and the shard's other units are free).

Two callers, one rule:

* ``retry-failed`` drops the shards with any failed unit, permanent failures (a 400, an unknown model) too;
* every resume (:func:`drop_retryable_failures`, from the driver before its first stage) drops those whose
  failures include a retryable one (a 429 or 5xx, a timeout, a dropped connection: ``UnitResult.retryable``),
  so a unit that failed only for the moment, or because its run was killed while it failed, is called again by
  a plain resume. Each resume retries such a unit once more within its retry policy, so a provider that fails
  every attempt still ends the run ``failed``, not in a loop.

Later stages depend on the retried results, so the manifests of the first stage dropped from and of every
stage after it are dropped too: the resumed run rebuilds them from the shards. A stage with a manifest has no
failed unit (the coordinator writes none otherwise), so its shards are not read; the others' are, once per
resume (about what the stage's reduce reads again at its end).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import msgspec

from punchline.cluster.records.run_record import RunRecord
from punchline.cluster.records.runs import load_run_record
from punchline.data.storage.run_layout import RunLayout
from punchline.data.store import Store
from punchline.data.stores import open_store
from punchline.data.units import ShardOutput, UnitResult

# shard files read at once: every resume reads the shards of its unfinished stages, and on S3 one by one would
# take a GET's round trip each
READERS = 16


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
    dropped = drop_failed_shards(record.run_id, record.stages, open_store(record.services.store_url))
    return msgspec.structs.replace(dropped, config_path=record.config_path, store_url=record.services.store_url)


def drop_retryable_failures(record: RunRecord, store: Store) -> DroppedShards:
    """What a resume drops before its first stage: the shards whose failures include a retryable one."""
    return drop_failed_shards(record.run_id, record.stages, store, retryable_only=True)


def _failed(result: UnitResult, retryable_only: bool) -> bool:
    return result.error is not None and (result.retryable or not retryable_only)


def drop_failed_shards(run_id: str, stages: list[str], store: Store, *, retryable_only: bool = False) -> DroppedShards:
    """Drop the shards of ``stages`` (in run order) holding a failed unit (``retryable_only``: a unit whose last
    error was retryable), then the manifests from the first stage dropped from onwards."""
    decoder = msgspec.msgpack.Decoder(ShardOutput)
    layout = RunLayout(run_id)
    dropped: dict[str, list[str]] = {}
    with ThreadPoolExecutor(max_workers=READERS, thread_name_prefix="punchline-retry-failed") as pool:
        for stage in stages:
            if store.exists(layout.manifest(stage)):  # finished with no failed unit
                continue
            keys = list(store.list(layout.shards(stage)))
            for start in range(0, len(keys), READERS * 4):  # a few reads ahead, never the whole stage in memory
                chunk = keys[start : start + READERS * 4]
                for key, raw in zip(chunk, pool.map(store.get, chunk), strict=True):
                    if raw is not None and any(_failed(r, retryable_only) for r in decoder.decode(raw).results):
                        store.delete(key)
                        dropped.setdefault(stage, []).append(key)
    if dropped:
        first = min(stages.index(stage) for stage in dropped)
        for stage in stages[first:]:
            store.delete(layout.manifest(stage))
    return DroppedShards(run_id=run_id, shards=dropped, manifests_dropped=bool(dropped))
