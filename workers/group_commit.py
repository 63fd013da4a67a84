"""Group commit: the answers of many units made durable together, then their leases committed together.

A paid answer must be durable in the store before its request lease is committed (the delivery
guarantee), but it need not be durable *alone*. A worker gathers the answers that arrive within
``linger_s`` (or until half of ``max_waiting`` are in hand), writes them as one response-cache pack (one
write and its fsyncs, or one S3 PUT) and then commits all their leases in one Redis round trip (one AOF fsync),
each commit leaving a done marker that names the pack. A unit's call slot is free as soon as its
answer is in hand, so the provider never waits for this; only the unit's own completion (and its
shard's commit) does, by at most ``linger_s`` plus one write. At most ``max_waiting`` answers wait
without a slot (beyond that a unit keeps its slot until its answer is durable), so a worker holds at most
its window of calls plus ``max_waiting`` answers' leases.

If the worker dies before the pack is written, the answers are lost with it and their leases lapse:
another worker pays for each once more, which is the bound the lease protocol already documents (a
death costs at most the window's calls in flight plus ``max_waiting`` answers).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Protocol

import structlog

from punchline.data.backoff import Backoff, retry_async
from punchline.data.errors import LedgerUnavailable, StoreError
from punchline.data.storage.response_cache import CachedResponse, ResponseCache
from punchline.data.storage.response_spool import ResponseSpool
from punchline.schedulers.leases import Grant, Leases, Settle

log = structlog.get_logger("punchline.unit")


class LeaseBook(Protocol):
    """Where a unit registers the request lease it holds, so the worker's one heartbeat renews it."""

    def hold(self, grant: Grant) -> None: ...

    def closing(self, grant: Grant) -> None:
        """Its commit or release is on its way: a renewal that finds it gone is not a loss."""

    def drop(self, grant: Grant) -> None: ...

    def lost(self, grant: Grant) -> bool:
        """A renewal found it gone while it was held (expired, taken over): what ran under it is not recorded."""


class _Waiting:
    __slots__ = ("done", "entry", "settle")

    def __init__(self, entry: CachedResponse, settle: Settle, done: asyncio.Future[tuple[CachedResponse, bool]]):
        self.entry = entry
        self.settle = settle
        self.done = done


class GroupCommit:
    """One per worker (per event loop). :meth:`submit` returns once the answer is durable and its lease
    committed, with the answer the cache holds (ours, or an earlier one we adopt) and whether the
    lease was still ours."""

    def __init__(
        self,
        cache: ResponseCache,
        leases: Leases,
        book: LeaseBook,
        *,
        linger_s: float = 0.25,
        max_entries: int = 512,
        max_waiting: int = 8,
        ledger_retry_s: float = 0.5,
        spool: ResponseSpool | None = None,
        stopping: Callable[[], bool] = lambda: False,
    ) -> None:
        self.cache = cache
        # once the driver is gone an unreachable ledger is not waited for: the answers are in the store
        # already, so whoever takes their (lapsed) leases next finds them there
        self.stopping = stopping
        self.leases = leases
        self.book = book
        self.linger_s = linger_s
        self.max_entries = max_entries
        # a fast provider fills half the room well within the linger: writing then keeps room for the answers
        # that arrive meanwhile, so their units need not hold their call slots until a later pack is durable
        self.flush_at = max(1, min(max_entries, max_waiting // 2))
        self.max_waiting = max_waiting
        self.waiting = 0  # answers handed in and not yet durable and committed
        self.ledger_retry_s = ledger_retry_s
        self.spool = spool  # where paid answers go when the store cannot take them (committed on resume)
        self._pending: list[_Waiting] = []
        self._full = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None

    def has_room(self) -> bool:
        """Whether one more answer may wait here without its call slot. A worker that dies loses the
        answers waiting here with the calls in flight, so both are bounded: at most ``max_waiting``
        answers wait here beside the window's calls; past that a unit keeps its slot until its answer
        is durable."""
        return self.waiting < self.max_waiting

    async def submit(self, entry: CachedResponse, settle: Settle) -> tuple[CachedResponse, bool]:
        self.waiting += 1
        try:
            return await self._submit(entry, settle)
        finally:
            self.waiting -= 1

    async def _submit(self, entry: CachedResponse, settle: Settle) -> tuple[CachedResponse, bool]:
        done: asyncio.Future[tuple[CachedResponse, bool]] = asyncio.get_running_loop().create_future()
        self._pending.append(_Waiting(entry, settle, done))
        if len(self._pending) >= self.flush_at:
            self._full.set()
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_loop())
        return await done

    async def _flush_loop(self) -> None:
        """Flush every ``linger_s`` (sooner when full) while answers keep coming."""
        while self._pending:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._full.wait(), self.linger_s)
            self._full.clear()
            batch, self._pending = self._pending, []
            try:
                await self._flush(batch)
            except BaseException as exc:  # the write failed: every unit of the batch sees why
                for w in batch:
                    if not w.done.done():
                        w.done.set_exception(exc if isinstance(exc, Exception) else RuntimeError(str(exc)))
                if not isinstance(exc, Exception):
                    raise

    def _write(self, entries: list[CachedResponse]) -> list[tuple[CachedResponse, str]]:
        """Write the pack (in a thread); for each entry, the answer stored under its key and its pack
        (an answer some other writer stored first is adopted, so every copy is identical)."""
        try:
            name = self.cache.write_pack(entries)
        except StoreError:  # the store stayed down past its bound: keep the paid answers on this disk
            if self.spool is not None:
                for entry in entries:
                    self.spool.keep(entry.request, entry.response)
                log.error("answers_spooled", answers=len(entries), folder=str(self.spool.folder))
            raise
        out: list[tuple[CachedResponse, str]] = []
        for entry in entries:
            key = entry.request.key()
            pack = self.cache.pack_of(key) or name or ""
            hit = self.cache.indexed(key) if pack != name else None
            out.append((hit or entry, pack))
        return out

    async def _flush(self, batch: list[_Waiting]) -> None:
        stored = await asyncio.to_thread(self._write, [w.entry for w in batch])
        settles = [w.settle._replace(pack=pack) for w, (_, pack) in zip(batch, stored, strict=True)]
        for w in batch:
            self.book.closing(w.settle.grant)
        committed = await self._commit(settles)
        for w, (entry, _), ok in zip(batch, stored, committed, strict=True):
            if not w.done.done():
                w.done.set_result((entry, ok))

    async def _commit(self, settles: list[Settle]) -> list[bool]:
        """Commit, waiting out a short Redis outage; after that the leases simply lapse (the answers are
        stored, so whoever takes a lease next finds its answer)."""
        try:
            return await retry_async(
                lambda: self.leases.commit_many(settles),
                retry_on=(LedgerUnavailable,),
                backoff=Backoff(initial_s=self.ledger_retry_s, max_s=10.0),
                attempts=8,
                when=lambda _exc: not self.stopping(),
                on_retry=lambda exc, _n, delay: log.warning(
                    "ledger_unavailable", keys=len(settles), error=str(exc), retry_in_s=delay
                ),
            )
        except LedgerUnavailable:
            return [False] * len(settles)
