"""Workers stop with their driver: a killed driver must not leave its workers spending.

Ray ends a dead driver's actors only after it notices the driver's connection is gone, and until then
the workers keep claiming shards and calling providers (a user who kills a run to stop spending would
keep spending). So each worker watches its driver itself, through the run's claim that the driver
renews every 10 s (``pl:run:<id>:driver``, ``cluster/run_claim.py``):

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
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import time
from typing import Any

from punchline.data.errors import LedgerUnavailable, PunchlineError

PID_CHECK_S = 0.2
CLAIM_CHECK_S = 2.0
CLAIM_GRACE_S = 12.0  # a live driver sets a missing claim again within its renewal period (10 s)


def driver_claim_key(run_id: str, namespace: str = "pl") -> str:
    """The key holding the driver's claim on a run id (its host, pid and a token)."""
    return f"{namespace}:run:{run_id}:driver"


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
        self.r = client
        self.key = driver_claim_key(run_id)
        self.claim = claim
        self.gone = False
        self._pid = 0
        self._missing_since: float | None = None
        if claim:
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                holder = json.loads(claim)
                if holder.get("host") == socket.gethostname():
                    self._pid = int(holder.get("pid", 0))

    def process_gone(self) -> bool:
        """The driver ran on this machine and its process no longer exists."""
        return bool(self._pid) and _process_gone(self._pid)

    async def claim_lost(self) -> bool:
        """The run's claim no longer holds this driver's value (an unreachable ledger says nothing:
        without it no lease can be taken anyway)."""
        if not self.claim:
            return False
        try:
            held = await self.r.get(self.key)
        except Exception:  # ledger down: fail closed elsewhere, decide nothing here
            return False
        if isinstance(held, bytes):
            held = held.decode()
        if held is None:  # lapsed, or the ledger was wiped: gone only if it stays missing
            now = time.monotonic()
            self._missing_since = self._missing_since or now
            return now - self._missing_since > CLAIM_GRACE_S
        self._missing_since = None
        return held != self.claim

    async def check(self) -> bool:
        """True (and ``gone`` set) when the driver is gone."""
        if self.claim and (self.process_gone() or await self.claim_lost()):
            self.gone = True
        return self.gone

    async def watch(self, on_gone: Any) -> None:
        """Check until the driver is gone, then call ``on_gone()`` once."""
        if not self.claim:
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
