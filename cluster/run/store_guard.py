"""One ledger per store: a store records which ledger guards it, and a run with another one refuses.

The delivery guarantee rests on one request lease per request, and the lease lives in the ledger. Two
ledgers over one store (a default run and a ``--redis-url`` run of one config on the same runs folder,
or two runs folders with their own ledgers over one S3 prefix) would each grant the lease, and both
runs would pay: the response cache is shared through the store, the leases are not.

So every driver marks the store with the identity of its ledger (``_ledgers/<host>-<pid>-<token>.json``:
the ledger's identity, host, pid and a timestamp renewed every ``RENEW_S``; never a password or a port
that changes between restarts). A driver that finds a fresh mark of another ledger refuses to start,
with one line naming that ledger and its driver. Marks are written before the check, so two drivers
starting at the same moment with different ledgers see each other and both refuse rather than both
pay. A mark older than ``FRESH_S``, or one of a driver on this machine whose process is gone, is stale
and ignored (and removed); a driver removes its own mark when it ends.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import threading
import time
from urllib.parse import urlsplit, urlunsplit

import msgspec
import structlog

from punchline.data.errors import InputError
from punchline.data.store import Store

log = structlog.get_logger("punchline.store_guard")

PREFIX = "_ledgers/"
RENEW_S = 10.0
FRESH_S = 60.0


class LedgerMark(msgspec.Struct, kw_only=True):
    identity: str
    host: str
    pid: int
    at: float


class OtherLedger(InputError):
    """The store is guarded by another ledger that is in use right now."""


def redis_identity(url: str) -> str:
    """A Redis URL as a ledger identity: scheme, host, port, database; never the credentials."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return f"unix://{parts.path}"
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path or "/0", "", ""))


def _stale(mark: LedgerMark, now: float) -> bool:
    if now - mark.at > FRESH_S:
        return True
    if mark.host == socket.gethostname():
        try:
            os.kill(mark.pid, 0)
        except ProcessLookupError:
            return True
        except (PermissionError, ValueError, OverflowError):
            return False
    return False


def other_ledgers(store: Store, identity: str, *, own_key: str = "", prune: bool = False) -> list[LedgerMark]:
    """Fresh marks of ledgers other than ``identity`` on ``store``; stale marks are removed on the way if ``prune``."""
    now = time.time()
    found = []
    for key in list(store.list(PREFIX)):
        if key == own_key:
            continue
        raw = store.get(key)
        try:
            mark = msgspec.json.decode(raw or b"", type=LedgerMark)
        except msgspec.DecodeError:
            continue
        if _stale(mark, now):
            if prune:
                with contextlib.suppress(Exception):
                    store.delete(key)
        elif mark.identity != identity:
            found.append(mark)
    return found


def check_unguarded(store: Store, identity: str) -> None:
    """The preflight's look, before the run creates anything (its runs folder, its ledger): a store another ledger
    guards right now refuses the run at once (one line, exit 2). Read only; the mark :class:`StoreGuard` writes later
    still decides between two drivers that start at the same moment."""
    others = other_ledgers(store, identity)
    if others:
        raise _refusal(store, others[0], identity)


def _refusal(store: Store, other: LedgerMark, identity: str) -> OtherLedger:
    return OtherLedger(
        f"store {store.url} is guarded by another ledger ({other.identity}, in use by driver pid "
        f"{other.pid} on {other.host}); this run's ledger is {identity}, and two ledgers on one "
        "store would pay for requests twice: use the same ledger (the same --redis-url, or none for the "
        "runs folder's own) or wait for that run to end",
        field="--redis-url",
    )


class StoreGuard:
    """This driver's mark on the store (a context manager)."""

    def __init__(self, store: Store, identity: str) -> None:
        self.store = store
        self.mark = LedgerMark(identity=identity, host=socket.gethostname(), pid=os.getpid(), at=time.time())
        self.key = f"{PREFIX}{self.mark.host}-{self.mark.pid}-{secrets.token_hex(4)}.json"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _write(self) -> None:
        self.mark.at = time.time()
        self.store.put(self.key, msgspec.json.encode(self.mark))

    def others(self) -> list[LedgerMark]:
        """Fresh marks of other ledgers; stale marks are removed on the way."""
        return other_ledgers(self.store, self.mark.identity, own_key=self.key, prune=True)

    def acquire(self) -> StoreGuard:
        self._write()
        others = self.others()
        if others:
            self.store.delete(self.key)
            raise _refusal(self.store, others[0], self.mark.identity)
        self._thread = threading.Thread(target=self._renew, name="store-guard", daemon=True)
        self._thread.start()
        return self

    def _renew(self) -> None:
        while not self._stop.wait(RENEW_S):
            try:
                self._write()
            except Exception as exc:  # an outage of the store: the run waits it out elsewhere
                log.warning("store_mark_failed", error=f"{type(exc).__name__}: {exc}"[:300])

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with contextlib.suppress(Exception):
            self.store.delete(self.key)

    def __enter__(self) -> StoreGuard:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
