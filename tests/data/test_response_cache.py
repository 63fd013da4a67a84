"""The packed response cache on both stores: answers in packs, found by another process's index, one
answer per key, old one-file-per-key caches still read, and a few hundred bytes per answer on disk."""

from __future__ import annotations

import os
import time
from pathlib import Path

import msgspec
import pytest

from punchline.data.requests import ProviderResponse
from punchline.data.storage.response_cache import (
    PACK_PREFIX,
    CachedResponse,
    ResponseCache,
    _encoder,
)
from punchline.data.store import Store
from punchline.data.stores import open_store
from punchline.pipelines.puns.data.completions import greedy_request


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "local":
        return open_store(str(tmp_path / "store"))
    return open_store(request.getfixturevalue("s3_url"))


def _entry(i: int, text: str = "") -> CachedResponse:
    request = greedy_request("p", "m", f"Why did joke {i} cross the road ___")
    return CachedResponse(request=request, response=ProviderResponse(texts=[text or f"answer {i}"], model="m"))


def test_answers_go_into_packs_and_another_process_finds_them(store: Store) -> None:
    writer = ResponseCache(store)
    assert writer.write_pack([_entry(i) for i in range(50)]) is not None
    assert writer.write_pack([_entry(i) for i in range(50, 60)]) is not None
    packs = list(store.list(PACK_PREFIX))
    assert len(packs) == 2  # two packs, not sixty files
    assert list(store.list("_cache/")) == packs
    reader = ResponseCache(store)  # a fresh process: its index is built from the listing
    hit = reader.get(_entry(55).request.key())
    assert hit is not None and hit.response.texts == ["answer 55"]
    assert reader.get(greedy_request("p", "m", "never asked ___").key()) is None


def test_one_answer_per_key_the_first_pack_wins(store: Store) -> None:
    """Two writers that both stored a key (a lease lapsed under a live holder): every reader takes the same
    one, the pack whose name sorts first; a writer that already sees an answer does not write another."""
    first, second = ResponseCache(store), ResponseCache(store)
    name_a = first.write_pack([_entry(1, "first")])
    time.sleep(0.01)  # pack names start with their writer's clock in ms
    name_b = second.write_pack([_entry(1, "second")])
    assert name_a is not None and name_b is not None and name_a < name_b
    for reader in (ResponseCache(store), second):
        reader.refresh()
        hit = reader.get(_entry(1).request.key())
        assert hit is not None and hit.response.texts == ["first"]
    assert not first.put(_entry(1).request, _entry(1, "third").response)
    assert first.write_pack([_entry(1, "third")]) is None


def test_old_one_file_per_key_caches_still_read(store: Store) -> None:
    old = _entry(7, "from the old layout")
    store.put(ResponseCache.path(old.request.key()), _encoder.encode(old))
    cache = ResponseCache(store)
    hit = cache.get(old.request.key())
    assert hit is not None and hit.response.texts == ["from the old layout"]
    assert cache.contains(old.request.key())
    assert cache.put_many([old, _entry(8)]) == 1  # the old answer is kept, only the new one is written


def test_put_many_writes_few_packs(store: Store) -> None:
    cache = ResponseCache(store)
    assert cache.put_many([_entry(i) for i in range(300)], per_pack=128) == 300
    assert len(list(store.list(PACK_PREFIX))) == 3
    assert cache.put_many([_entry(i) for i in range(300)]) == 0


def test_a_few_hundred_bytes_per_answer_on_disk(tmp_path: Path) -> None:
    """What the issue measured as 4.2 KB per unit (a file per answer) is now the answer's bytes, compressed."""
    store = open_store(str(tmp_path / "store"))
    cache = ResponseCache(store)
    n = 2_000
    for start in range(0, n, 100):  # packs of 100, like a busy worker's group commits
        cache.write_pack([_entry(i, f"a pun about number {i} " * 8) for i in range(start, start + 100)])
    on_disk = sum(os.stat(p).st_blocks * 512 for p in (tmp_path / "store").rglob("*.pack"))
    raw = sum(len(msgspec.msgpack.encode(_entry(i, f"a pun about number {i} " * 8))) for i in range(n))
    assert on_disk / n < 1024
    assert on_disk < raw
