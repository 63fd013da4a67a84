"""The shard scheduler: a worker claims the next shard whenever its window has room, until the queue is drained.

Which shard comes next is the ledger's claim script (``schedulers/lua/shard_claim.lua``: an expired lease first, else
the lowest shard to do); *when* a worker asks, how it waits out a Redis outage, and what each answer means
is this loop. The worker (``workers/shard_worker.py``) gives it its window and is handed each claimed shard;
the coordinator only watches the stage's counters (``cluster/run/executors/shards.py``).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from punchline.data.backoff import constant, retry_async
from punchline.data.errors import LedgerUnavailable
from punchline.schedulers.keys import StageKeys
from punchline.schedulers.leases import Claim, Leases, NoClaim

LEDGER_PAUSE = constant(1.0)  # between attempts while Redis is unreachable
HELD_WAIT_MS = 1_000  # the longest wait for a shard held by another worker before asking again


class ClaimEnd(enum.Enum):
    """Why a worker stopped claiming."""

    DRAINED = "drained"  # no shard left to claim: what the worker holds finishes
    STAGE_RESET = "stage_reset"  # Redis lost the stage: the coordinator rebuilds it from the store
    STOPPED = "stopped"  # the worker was told to stop (its driver gone, a shard failed)
    LEDGER_LOST = "ledger_lost"  # the ledger stayed unreachable past the wait's bound


class Window(Protocol):
    """A worker's room for more units, as the loop asks about it."""

    def stopped(self) -> bool:
        """Claim nothing more."""
        ...

    def full(self) -> bool:
        """The units of the shards held fill the window."""
        ...

    def busy(self) -> bool:
        """Some held shard is still running (its end makes room)."""
        ...

    async def wait_for_room(self, timeout_s: float | None = None) -> None:
        """Until a unit ends (or ``timeout_s``)."""
        ...


async def claim_shards(
    leases: Leases,
    keys: StageKeys,
    owner: str,
    lease_ms: int,
    window: Window,
    on_claim: Callable[[Claim], Awaitable[None]],
    *,
    ledger_wait_s: float,
    stopping: Callable[[], bool],
    log: Any,
) -> tuple[ClaimEnd, LedgerUnavailable | None]:
    """Claim shards for ``owner`` while ``window`` has room, handing each to ``on_claim``; why it ended (and the
    ledger's last error when it stayed unreachable). A Redis outage is waited out (``LEDGER_PAUSE`` apart, for
    ``ledger_wait_s``) unless the worker is told to stop meanwhile (``stopping``: its driver is gone)."""
    while not window.stopped():
        if window.full():
            await window.wait_for_room()
            continue
        try:
            claim = await retry_async(
                lambda: leases.claim(keys, owner, lease_ms),
                retry_on=(LedgerUnavailable,),
                backoff=LEDGER_PAUSE,
                deadline_s=ledger_wait_s,
                when=lambda _exc: not (window.stopped() or stopping()),
                on_retry=lambda exc, _n, _d: log.warning("ledger_unavailable", error=str(exc)),
            )
        except LedgerUnavailable as exc:
            return ClaimEnd.LEDGER_LOST, exc
        if claim is NoClaim.DRAINED:
            return ClaimEnd.DRAINED, None
        if claim is NoClaim.STAGE_UNKNOWN:
            return ClaimEnd.STAGE_RESET, None
        if isinstance(claim, int):  # everything left is held by others: wait for them or for our own units
            wait_s = min(claim, HELD_WAIT_MS) / 1000
            if window.busy():
                await window.wait_for_room(wait_s)
            else:
                await asyncio.sleep(wait_s)
            continue
        await on_claim(claim)
    return ClaimEnd.STOPPED, None
