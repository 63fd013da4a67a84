"""The global response cache: one stored answer per request key, shared by every run and pipeline.

It lives in the checkpoint store (not in Redis) so that it survives a wiped Redis and can be shared by
runs on different clusters that point at the same bucket.

**Packed.** Answers are not one file each: a writer gathers the answers of a short spell (a group
commit) and writes them as one *pack* under ``_cache/packs/``: a zlib-compressed msgpack list of
entries, written once (one local write with its two fsyncs, or one S3 PUT) and never changed. A
pack's name starts with its writer's clock in ms, so names sort roughly by age. Readers keep an index
(key -> pack) in memory, built by listing the packs and reading the ones they have not seen; the
answers of the packs read last are kept decoded for the look-ups that follow.

**How a reader finds an answer another worker just wrote.** The lease protocol tells it: a worker
commits a request's lease only after the pack holding the answer is durable, and the commit leaves a
short-lived *done marker* (the pack's name) in place of the lease. Taking the lease then answers
"done in pack X" and the reader reads that pack. A reader whose index is older than half the marker's
lifetime refreshes it first (:meth:`ResponseCache.stale`), so an answer committed before the refresh
is in the listing and one committed after it still has its marker. A worker that dies before its pack
is flushed leaves nothing: its answers are simply not there, its leases lapse and another worker pays
once more (the documented bound).

**The same keys and exactly one answer per key.** Two packs can hold the same key only when a lease
lapsed under a live holder; readers then take the entry of the pack whose name sorts first, and a
writer that finds an answer in the index before it writes adopts it. Old caches (one file per key
at ``_cache/<2 hex>/<key>.msgpack``) are still read: a key not in any pack is looked up there.
"""

from __future__ import annotations

import itertools
import secrets
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Iterable

import msgspec

from punchline.data.requests import ProviderRequest, ProviderResponse
from punchline.data.storage.slot_index import SlotIndex
from punchline.data.store import Store

CACHE_PREFIX = "_cache/"
PACK_PREFIX = "_cache/packs/"
MARKER_MS = 10_000  # how long a committed lease leaves its done marker (the pack's name) in Redis


class CachedResponse(msgspec.Struct, kw_only=True):
    """A response together with the request that produced it (for audits and ``--offline`` errors)."""

    request: ProviderRequest
    response: ProviderResponse
    source: str = "provider"  # "provider" or "legacy-import"


class Pack(msgspec.Struct, array_like=True):
    """One pack: the keys and their encoded :class:`CachedResponse` entries, in the same order."""

    keys: list[str]
    entries: list[bytes]


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(CachedResponse)
_pack_decoder = msgspec.msgpack.Decoder(Pack)


def encode_pack(pack: Pack) -> bytes:
    return zlib.compress(_encoder.encode(pack), 6)


def decode_pack(raw: bytes) -> Pack:
    return _pack_decoder.decode(zlib.decompress(raw))


def _slot(key: str) -> int:
    """The index's key: the first 64 bits of the request hash (an entry's full key is checked on read)."""
    return int(key[:16], 16)


class ResponseCache:
    """Reads answers from packs (and the old one-file-per-key layout); writes packs. Thread-safe."""

    def __init__(self, store: Store, *, keep_packs: int = 16) -> None:
        self.store = store
        self.writer = secrets.token_hex(4)
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._refresh_lock = threading.Lock()
        self._names: list[str] = []  # pack names by id
        self._ids: dict[str, int] = {}
        self._index = SlotIndex()  # _slot(key) -> pack id (compact: it holds every answer indexed)
        self._decoded: OrderedDict[int, dict[str, bytes]] = OrderedDict()
        self._keep = keep_packs
        self._refreshed_at = float("-inf")  # time.monotonic() when the last listing started

    @staticmethod
    def path(key: str) -> str:
        """Where the old layout kept ``key``'s answer (still read)."""
        return f"{CACHE_PREFIX}{key[:2]}/{key}.msgpack"

    # --- reading -----------------------------------------------------------------------------------

    def stale(self, max_age_s: float = MARKER_MS / 2000) -> bool:
        """Whether the index is older than ``max_age_s`` (by default half a done marker's lifetime)."""
        return time.monotonic() - self._refreshed_at > max_age_s

    def refresh(self) -> None:
        """Index the packs written since the last refresh (by anyone). Callers that ask together share
        one listing: a refresh that started after this call was made covers it."""
        asked = time.monotonic()
        with self._refresh_lock:
            if self._refreshed_at >= asked:
                return
            started = time.monotonic()
            for name in self.store.list(PACK_PREFIX):
                if name not in self._ids:
                    self.load(name)
            self._refreshed_at = max(self._refreshed_at, started)

    def load(self, name: str) -> bool:
        """Index (and keep decoded) the pack ``name``; False if it is not there."""
        if name in self._ids:
            return True
        raw = self.store.get(name)
        if raw is None:
            return False
        self._add(name, decode_pack(raw))
        return True

    def _add(self, name: str, pack: Pack) -> None:
        with self._lock:
            if name in self._ids:
                return
            pid = len(self._names)
            self._names.append(name)
            self._ids[name] = pid
            for key in pack.keys:
                slot = _slot(key)
                have = self._index.get(slot)
                if have is None or name < self._names[have]:  # the pack that sorts first wins
                    self._index.set(slot, pid)
            self._remember(pid, dict(zip(pack.keys, pack.entries, strict=True)))

    def _remember(self, pid: int, entries: dict[str, bytes]) -> None:
        self._decoded[pid] = entries
        self._decoded.move_to_end(pid)
        while len(self._decoded) > self._keep:
            self._decoded.popitem(last=False)

    def _entries(self, pid: int) -> dict[str, bytes]:
        with self._lock:
            entries = self._decoded.get(pid)
            if entries is not None:
                self._decoded.move_to_end(pid)
                return entries
        raw = self.store.get(self._names[pid])
        if raw is None:  # packs are never removed while a run reads them
            return {}
        pack = decode_pack(raw)
        entries = dict(zip(pack.keys, pack.entries, strict=True))
        with self._lock:
            self._remember(pid, entries)
        return entries

    def indexed(self, key: str) -> CachedResponse | None:
        """The answer if a pack this process has indexed holds it (no listing, no old-layout look-up)."""
        pid = self._index.get(_slot(key))
        if pid is None:
            return None
        raw = self._entries(pid).get(key)
        return None if raw is None else _decoder.decode(raw)

    def pack_of(self, key: str) -> str | None:
        """The indexed pack that may hold ``key`` (None: none this process knows of)."""
        pid = self._index.get(_slot(key))
        return None if pid is None else self._names[pid]

    def in_memory(self, key: str) -> bool:
        """Whether :meth:`indexed` answers ``key`` without reading the store (not indexed, or its pack
        is kept decoded), so the event loop may call it directly."""
        pid = self._index.get(_slot(key))
        return pid is None or pid in self._decoded

    def get(self, key: str, *, max_age_s: float | None = 1.0) -> CachedResponse | None:
        """The stored answer of ``key``: from the packs (refreshing an index older than ``max_age_s``
        when the key is not in it; None: never refresh), else from the old one-file-per-key layout."""
        hit = self.indexed(key)
        if hit is None and max_age_s is not None and self.stale(max_age_s):
            self.refresh()
            hit = self.indexed(key)
        if hit is None:
            raw = self.store.get(self.path(key))
            hit = None if raw is None else _decoder.decode(raw)
        return hit

    def contains(self, key: str) -> bool:
        return self.get(key) is not None

    # --- writing -----------------------------------------------------------------------------------

    def new_pack_name(self) -> str:
        return f"{PACK_PREFIX}{int(time.time() * 1000):013d}-{self.writer}-{next(self._seq):06d}.pack"

    def write_pack(self, entries: Iterable[CachedResponse]) -> str | None:
        """Write ``entries`` as one pack (durable when this returns) and index it; returns its name, or
        None when there was nothing to write. Keys already indexed are skipped (their answer stays)."""
        keys: list[str] = []
        blobs: list[bytes] = []
        seen: set[str] = set()
        for entry in entries:
            key = entry.request.key()
            if key in seen or self.indexed(key) is not None:
                continue
            seen.add(key)
            keys.append(key)
            blobs.append(_encoder.encode(entry))
        if not keys:
            return None
        pack = Pack(keys=keys, entries=blobs)
        name = self.new_pack_name()
        self.store.put(name, encode_pack(pack))
        self._add(name, pack)
        return name

    def put(self, request: ProviderRequest, response: ProviderResponse, *, source: str = "provider") -> bool:
        """Store one answer at once (a pack of one) unless one is already there; returns whether this
        call wrote it. Many answers at once: :meth:`put_many`; the unit path groups them itself."""
        if self.get(request.key()) is not None:
            return False
        return self.write_pack([CachedResponse(request=request, response=response, source=source)]) is not None

    def put_many(self, entries: Iterable[CachedResponse], *, per_pack: int = 4096) -> int:
        """Store answers not cached yet, ``per_pack`` to a pack; returns how many were written."""
        self.refresh()
        written = 0
        it = iter(entries)
        while chunk := list(itertools.islice(it, per_pack)):
            fresh = [e for e in chunk if self.get(e.request.key(), max_age_s=None) is None]
            if self.write_pack(fresh) is not None:
                written += len({e.request.key() for e in fresh})
        return written
