"""Workers stop with their driver: a killed driver must not leave its workers spending.

Ray ends a dead driver's actors only after it notices the driver's connection is gone, and until then
the workers keep claiming shards and calling providers (a user who kills a run to stop spending would
keep spending). So each worker watches its driver itself, through the run's claim that the driver
renews every 10 s (``pl:run:<id>:driver``, ``schedulers/run_claim.py``):

* on the driver's own machine, every ``PID_CHECK_S`` whether the driver's process still exists
  (a ``kill -9`` is seen within a fraction of a second);
* anywhere, every ``CLAIM_CHECK_S`` whether the claim still holds this driver's value: another value
  (a resumed driver took the run over) means gone at once; no claim at all means gone once it has been
  missing for ``CLAIM_GRACE_S``, longer than a live driver takes to set it again (it renews every 10 s
  and sets a missing claim), so a wiped or restarted ledger does not stop the workers of a live driver,
  while one that died elsewhere or is paused past the claim's TTL does.

Once the driver is gone the worker takes no new unit: calls in flight finish (they are paid for
already and their answers are kept), the rest wait for the next driver. A paused driver that comes
back takes its claim again and its workers carry on at the next ``work`` call.

Workers are *detached* Ray actors, so a killed driver does not take them (and the calls they have in
flight, paid for already) down with it: each one drains instead. Its :class:`Lifeguard` (a thread of
its own, with its own event loop and Redis connection, so it watches whether or not a ``work`` call
is running) sees the driver gone, waits until no ``work`` call is left (they finish the calls in flight
and commit them, the normal way: response cache, then the leases), and ends the actor. The same
lifeguard also asks Ray whether the job that created the worker is still alive, which covers a driver
on another machine while the ledger is unreachable, and workers that have no claim to watch (what it finds
reaches the ``work`` calls too: :attr:`DriverWatch.also`). No worker outlives its driver by more than its
last calls, and never by more than its drain bound (``shard_worker.drain_bound_s``): a draining worker
retries neither a provider nor an unreachable ledger, cancels what is still running at the bound, and
past it (plus ``FORCE_GRACE_S``) the lifeguard ends the process itself, whatever the ledger does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog

from punchline.data.errors import LedgerUnavailable, PunchlineError
from punchline.schedulers import keys as redis_keys
from punchline.schedulers.driver_liveness import DriverClaimReader

PID_CHECK_S = 0.2
CLAIM_CHECK_S = 2.0
CLAIM_GRACE_S = 12.0  # a live driver sets a missing claim again within its renewal period (10 s)
OWNER_CHECK_S = 5.0  # how often the lifeguard asks Ray whether the worker's job (its driver) is alive
FORCE_GRACE_S = 30.0  # past its drain bound, a worker still busy this much longer is ended by its lifeguard

log = structlog.get_logger("punchline.worker")


# The key holding the driver's claim on a run id (its host, pid and a token).
driver_claim_key = redis_keys.driver_claim


class DriverGone(PunchlineError):
    """The driver of this run is gone: no new unit is started."""


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, ValueError, OverflowError):
        return False
    return False


class DriverWatch:
    """Whether a worker's driver is still there. ``claim`` is the value the driver holds its claim
    with (None: nothing to watch, e.g. a worker used without a driver in tests)."""

    def __init__(self, client: Any, run_id: str, claim: str | None) -> None:
        self.r = client  # the ledger client, for a watch built on the same connection (local_process's)
        self.claim_reader = DriverClaimReader(client, run_id)
        self.claim = claim
        self.gone = False
        self.also: Callable[[], bool] | None = None  # another sign of the driver's end (the lifeguard's finding)
        self._pid = 0
        self._missing_since: float | None = None
        if claim:
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                holder = json.loads(claim)
                if holder.get("host") == socket.gethostname():
                    self._pid = int(holder.get("pid", 0))

    def asked_to_stop(self) -> bool:
        """The driver, alive, told the worker to stop (its stage is over): not a gone driver, nothing to warn
        about. This watch has no such channel; the driver's own worker's has (``local_process.StoppableWatch``)."""
        return False

    def process_gone(self) -> bool:
        """The driver ran on this machine and its process no longer exists (or :attr:`also` says it is gone)."""
        return (bool(self._pid) and _process_gone(self._pid)) or (self.also is not None and self.also())

    async def claim_lost(self) -> bool:
        """The run's claim no longer holds this driver's value."""
        if not self.claim:
            return False
        read, held = await self.claim_reader.read()
        if not read:
            return False
        if held is None:  # lapsed, or the ledger was wiped: gone only if it stays missing
            now = time.monotonic()
            self._missing_since = self._missing_since or now
            return now - self._missing_since > CLAIM_GRACE_S
        self._missing_since = None
        return held != self.claim

    async def claim_taken(self) -> bool:
        """Another driver holds the run's claim now (a resumed driver took the run over). Unlike a lapsed
        claim, which a paused driver takes again when it wakes, this one never comes back."""
        if not self.claim:
            return False
        read, held = await self.claim_reader.read()
        return read and held is not None and held != self.claim

    async def check(self) -> bool:
        """True (and ``gone`` set) when the driver is gone."""
        if self.process_gone() or (self.claim and await self.claim_lost()):
            self.gone = True
        return self.gone

    async def watch(self, on_gone: Any) -> None:
        """Check until the driver is gone, then call ``on_gone()`` once."""
        if not self.claim and self.also is None:
            return
        since_claim = 0.0
        while True:
            await asyncio.sleep(PID_CHECK_S)
            since_claim += PID_CHECK_S
            lost = self.process_gone()
            if not lost and since_claim >= CLAIM_CHECK_S:
                since_claim = 0.0
                with contextlib.suppress(LedgerUnavailable):
                    lost = await self.claim_lost()
            if lost:
                self.gone = True
                on_gone()
                return


class Lifeguard:
    """Ends a worker once its driver is gone for good and no ``work`` call of it is left running.

    Gone for good: its process no longer exists (same machine), another driver took the run's claim, or
    Ray says the job that created the worker is dead. A claim that merely lapsed is not enough (a paused
    driver takes it again when it wakes, and finds its workers still there): the ``work`` calls stop
    taking units meanwhile (:meth:`DriverWatch.watch`), and Ray's job record decides.

    ``make_watch`` builds the :class:`DriverWatch` inside the lifeguard's own thread (its Redis client
    belongs to that thread's event loop); ``owner_gone`` says whether the job that created the worker
    has ended (blocking, called in a thread every ``OWNER_CHECK_S``; an error counts as "not known");
    ``busy`` whether a ``work`` call is running; ``leave`` ends the worker (called once, from the
    lifeguard's thread). ``drain_s``: a ``work`` call still running that long after the driver is gone (plus
    ``FORCE_GRACE_S``) is not waited for: ``force`` ends the process (``leave`` would wait for it)."""

    def __init__(
        self,
        make_watch: Callable[[], DriverWatch],
        *,
        busy: Callable[[], bool],
        leave: Callable[[], None],
        owner_gone: Callable[[], bool] = lambda: False,
        drain_s: float | None = None,
        force: Callable[[], None] | None = None,
    ) -> None:
        self.make_watch = make_watch
        self.drain_s = drain_s
        self.force = force
        self.busy = busy
        self.leave = leave
        self.owner_gone = owner_gone
        self.gone = threading.Event()  # the driver is gone
        self.left = threading.Event()  # leave() was called
        self._thread = threading.Thread(target=self._run, name="punchline-lifeguard", daemon=True)

    def start(self) -> Lifeguard:
        self._thread.start()
        return self

    def join(self, timeout_s: float | None = None) -> None:
        self._thread.join(timeout_s)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception as exc:  # never silently: a worker without its lifeguard could outlive its driver
            log.error("lifeguard_failed", error=f"{type(exc).__name__}: {exc}")

    def _owner_gone(self) -> bool:
        try:
            return self.owner_gone()
        except Exception:
            return False

    async def _main(self) -> None:
        watch = self.make_watch()
        since_claim = since_owner = 0.0
        while not self.gone.is_set():
            await asyncio.sleep(PID_CHECK_S)
            since_claim += PID_CHECK_S
            since_owner += PID_CHECK_S
            gone = watch.process_gone()
            if not gone and since_claim >= CLAIM_CHECK_S:
                since_claim = 0.0
                gone = await watch.claim_taken()
            if not gone and since_owner >= OWNER_CHECK_S:
                since_owner = 0.0
                gone = await asyncio.to_thread(self._owner_gone)
            if gone:
                self.gone.set()
        log.warning("driver_gone_draining")
        until = None if self.drain_s is None else time.monotonic() + self.drain_s + FORCE_GRACE_S
        while self.busy():  # the work calls finish their calls in flight and commit them
            if until is not None and time.monotonic() > until and self.force is not None:
                log.error("drain_bound_passed_ending", drain_s=self.drain_s)
                self.left.set()
                self.force()
                return
            await asyncio.sleep(PID_CHECK_S)
        log.info("worker_leaving")
        self.left.set()
        self.leave()
