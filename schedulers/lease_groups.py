"""A worker's units take their request leases together: the takes asked in the same moment go as one script call.

Each unit of a worker asks for its own lease when it holds a place in the worker's window (so a group is never
larger than the units the worker may have in hand, its window and the few that take their leases ahead). One
call (:meth:`~punchline.schedulers.leases.Leases.acquire_many`) answers every unit that asked since the last one
went out: while a call is on its way, the units that ask meanwhile wait for the next one, so at a fast
provider a round trip serves many units and at a slow one a unit still waits no longer than one round trip. Units
under different rate scopes (or owners, or lease lengths) go in separate calls of the same turn.

What a group take grants is what each unit would have been granted alone (``lua/lease_take.lua``); a worker that
dies between a group's take and its commits leaves every lease of the group to lapse after ``lease_ms``, as one
unit's did: nothing is committed for them, and they are taken again then.
"""

from __future__ import annotations

import asyncio
import contextlib

from punchline.schedulers.leases import Grant, Leases, Take, Taken
from punchline.schedulers.rate_limit import RateScope

YIELDS = 3  # turns of the loop a group waits for more units before it goes (no wall time when idle)
MAX_GROUP = 256  # leases in one script call at most (a window larger than this takes in several calls)

_Ask = tuple[Take, "asyncio.Future[Taken]"]
_Group = tuple[str, int, RateScope | None]  # owner, lease_ms, rate scope


class LeaseGroups:
    """The lease takes of one event loop's units, gathered into group calls (make it inside the running loop)."""

    def __init__(self, leases: Leases, *, max_group: int = MAX_GROUP) -> None:
        self.leases = leases
        self.max_group = max_group
        self._asks: dict[_Group, list[_Ask]] = {}
        self._sender: asyncio.Task[None] | None = None
        self.calls = 0  # script calls sent (for tests and benchmarks)

    async def take(
        self,
        key: str,
        owner: str,
        lease_ms: int,
        *,
        rate: RateScope | None = None,
        requests: int = 1,
        tokens: int = 0,
        estimate_usd: float = 0.0,
    ) -> Taken:
        """What :meth:`Leases.acquire` answers for this unit, from the next group call."""
        fut: asyncio.Future[Taken] = asyncio.get_running_loop().create_future()
        self._asks.setdefault((owner, lease_ms, rate), []).append((Take(key, requests, tokens, estimate_usd), fut))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send())
        return await fut

    async def _send(self) -> None:
        """Send what was asked, in groups, until nothing is asked any more."""
        while self._asks:
            for _ in range(YIELDS):  # the units woken in this turn (and those they wake) ask too
                await asyncio.sleep(0)
            asks, self._asks = self._asks, {}
            for (owner, lease_ms, rate), group in asks.items():
                for start in range(0, len(group), self.max_group):
                    await self._call(owner, lease_ms, rate, group[start : start + self.max_group])

    async def _call(self, owner: str, lease_ms: int, rate: RateScope | None, group: list[_Ask]) -> None:
        self.calls += 1
        try:
            got = await self.leases.acquire_many(owner, lease_ms, [take for take, _ in group], rate=rate)
        except Exception as exc:  # every unit of the group hears it (LedgerUnavailable: each waits it out)
            for _, fut in group:
                if not fut.done():
                    fut.set_exception(exc)
            return
        except BaseException:
            for _, fut in group:
                fut.cancel()
            raise
        for (_, fut), answer in zip(group, got, strict=True):
            if not fut.done():
                fut.set_result(answer)
            elif isinstance(answer, Grant):  # its unit stopped waiting: the lease goes back at once
                with contextlib.suppress(Exception):
                    await self.leases.release(answer)
