"""The response cache's index, compact: a request key's slot (the first 64 bits of its hash) -> the id of the pack
that holds it, for every answer a process has indexed.

Why not a dict: a reader indexes every answer of the cache it reads, so the index grows with the answers (issue 42:
a worker's memory per unit). A dict of int keys costs about 92 bytes an entry (the key's int object and the table's
room); this keeps sorted arrays of 12 bytes an entry (8 for the slot, 4 for the pack id) and a dict of the latest
additions only, merged into the arrays when it holds :data:`RECENT` of them (a merge copies the arrays once).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left

RECENT = 32_768  # additions kept in the dict before they are merged into the sorted arrays


class SlotIndex:
    """slot -> pack id. Readers need no lock (a merge swaps the arrays in one assignment, and an entry is in the
    arrays or the dict at every moment); writers are serialized by the caller (the cache's lock)."""

    def __init__(self, recent: int = RECENT) -> None:
        self._limit = recent
        self._sorted: tuple[array[int], array[int]] = (array("Q"), array("I"))  # slots ascending, their pack ids
        self._recent: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._sorted[0]) + len(self._recent)

    def get(self, slot: int) -> int | None:
        pid = self._recent.get(slot)
        if pid is not None:
            return pid
        slots, pids = self._sorted
        i = bisect_left(slots, slot)
        return pids[i] if i < len(slots) and slots[i] == slot else None

    def set(self, slot: int, pid: int) -> None:
        slots, pids = self._sorted
        i = bisect_left(slots, slot)
        if i < len(slots) and slots[i] == slot:
            pids[i] = pid
            return
        self._recent[slot] = pid
        if len(self._recent) >= self._limit:
            self._merge()

    def _merge(self) -> None:
        old_slots, old_pids = self._sorted
        slots, pids = array("Q"), array("I")
        start = 0
        for slot, pid in sorted(self._recent.items()):
            i = bisect_left(old_slots, slot, start)
            slots.extend(old_slots[start:i])
            pids.extend(old_pids[start:i])
            slots.append(slot)
            pids.append(pid)
            start = i
        slots.extend(old_slots[start:])
        pids.extend(old_pids[start:])
        self._sorted = slots, pids  # readers see the old arrays and the dict, or the new arrays: never neither
        self._recent = {}
