"""The response cache's compact index (slot -> pack id): the answers of a dict, across merges of its recent
additions into its sorted arrays, at a fraction of a dict's memory (issue 42)."""

from __future__ import annotations

import hashlib
import random
import tracemalloc

from punchline.data.storage.slot_index import SlotIndex


def _slot(i: int) -> int:
    return int(hashlib.sha256(str(i).encode()).hexdigest()[:16], 16)


def test_it_answers_as_a_dict_across_merges() -> None:
    index, truth = SlotIndex(recent=100), {}
    rng = random.Random(7)
    for step in range(5_000):
        slot = _slot(rng.randrange(3_000))  # repeats: a slot set again takes its new pack id
        index.set(slot, step)
        truth[slot] = step
        if step % 97 == 0:
            probe = _slot(rng.randrange(6_000))
            assert index.get(probe) == truth.get(probe)
    assert len(index) == len(truth)
    assert all(index.get(s) == p for s, p in truth.items())
    assert index.get(0) is None and index.get(2**64 - 1) is None
    index.set(2**64 - 1, 1)
    index.set(0, 2)
    assert (index.get(2**64 - 1), index.get(0)) == (1, 2)


def test_it_holds_an_entry_in_a_fraction_of_a_dicts_memory() -> None:
    n = 100_000
    slots = [_slot(i) for i in range(n)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        index = SlotIndex()
        for i, s in enumerate(slots):
            index.set(s, i // 100)
        compact = tracemalloc.get_traced_memory()[0] - before
        before = tracemalloc.get_traced_memory()[0]
        plain = {s: i // 100 for i, s in enumerate(slots)}
        as_dict = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(index) == len(plain) == n
    assert compact < as_dict / 2, (compact / n, as_dict / n)
