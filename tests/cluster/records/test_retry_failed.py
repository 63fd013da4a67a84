"""Which committed shards a resume and ``retry-failed`` drop (cluster/records/retry_failed.py), on a local store: a
resume those whose failures include a retryable one, ``retry-failed`` those with any failure; then the manifests from
the first stage dropped from onwards, since later stages were planned from its results."""

from __future__ import annotations

from pathlib import Path

import msgspec

from punchline.cluster.records.retry_failed import drop_failed_shards
from punchline.data.storage.run_layout import RunLayout
from punchline.data.stores.local import LocalStore
from punchline.data.units import ShardOutput, UnitResult

RUN = "r1"
STAGES = ["first", "second", "third"]


def _shard(store: LocalStore, stage: str, shard: int, *results: UnitResult) -> str:
    key = RunLayout(RUN).shard(stage, shard)
    store.put(key, msgspec.msgpack.encode(ShardOutput(stage=stage, shard=shard, results=list(results))))
    return key


def _ok(unit: str) -> UnitResult:
    return UnitResult(unit_id=unit, key=unit)


def _failed(unit: str, *, retryable: bool) -> UnitResult:
    error = "RetryableProviderError: HTTP 500" if retryable else "FatalProviderError: HTTP 400"
    return UnitResult(unit_id=unit, key=unit, error=error, retryable=retryable)


def _store(tmp_path: Path) -> tuple[LocalStore, dict[str, str]]:
    """``first`` finished (its manifest), ``second`` with a 500 in shard 1 and a 400 in shard 2, ``third``
    finished from ``second``'s partial results (its manifest too)."""
    store = LocalStore(tmp_path / "store")
    layout = RunLayout(RUN)
    keys = {
        "first/0": _shard(store, "first", 0, _ok("a"), _ok("b")),
        "second/0": _shard(store, "second", 0, _ok("c"), _ok("d")),
        "second/1": _shard(store, "second", 1, _ok("e"), _failed("f", retryable=True)),
        "second/2": _shard(store, "second", 2, _failed("g", retryable=False), _ok("h")),
        "third/0": _shard(store, "third", 0, _ok("i")),
    }
    for stage in ("first", "third"):
        store.put(layout.manifest(stage), b"{}")
    return store, keys


def test_a_resume_drops_the_shards_with_a_retryable_failure_and_the_manifests_after_them(tmp_path: Path) -> None:
    store, keys = _store(tmp_path)
    dropped = drop_failed_shards(RUN, STAGES, store, retryable_only=True)
    assert dropped.shards == {"second": [keys["second/1"]]} and dropped.manifests_dropped
    assert not store.exists(keys["second/1"])
    assert all(store.exists(keys[k]) for k in ("first/0", "second/0", "second/2", "third/0"))  # the 400 waits
    layout = RunLayout(RUN)
    assert store.exists(layout.manifest("first")) and not store.exists(layout.manifest("third"))
    assert drop_failed_shards(RUN, STAGES, store, retryable_only=True).count == 0  # nothing more to drop


def test_retry_failed_drops_every_shard_with_a_failure(tmp_path: Path) -> None:
    store, keys = _store(tmp_path)
    dropped = drop_failed_shards(RUN, STAGES, store)
    assert dropped.shards == {"second": [keys["second/1"], keys["second/2"]]}
    assert not store.exists(RunLayout(RUN).manifest("third"))


def test_nothing_failed_drops_nothing(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    _shard(store, "first", 0, _ok("a"))
    dropped = drop_failed_shards(RUN, STAGES, store)
    assert dropped.count == 0 and not dropped.manifests_dropped


def test_a_shard_file_written_before_retryable_was_kept_reads_as_a_permanent_failure(tmp_path: Path) -> None:
    """Old shard files have no ``retryable``: their failures decode as permanent, so a resume leaves them to
    ``retry-failed`` as before."""

    class OldResult(msgspec.Struct, kw_only=True):
        unit_id: str
        key: str
        response: None = None
        error: str | None = None
        latency_s: float | None = None
        retries: int = 0

    class OldOutput(msgspec.Struct, kw_only=True):
        stage: str
        shard: int
        results: list[OldResult]

    store = LocalStore(tmp_path / "store")
    key = RunLayout(RUN).shard("second", 0)
    old = OldOutput(stage="second", shard=0, results=[OldResult(unit_id="x", key="x", error="HTTP 500")])
    store.put(key, msgspec.msgpack.encode(old))
    [result] = msgspec.msgpack.decode(store.get(key) or b"", type=ShardOutput).results
    assert result.error == "HTTP 500" and result.retryable is False
    assert drop_failed_shards(RUN, STAGES, store, retryable_only=True).count == 0
    assert drop_failed_shards(RUN, STAGES, store).count == 1
