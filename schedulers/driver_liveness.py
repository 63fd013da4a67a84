"""A run's driver claim as its workers read it: the value the driver holds its run id with, or nothing.

The claim is written and renewed by the driver (:mod:`punchline.schedulers.run_claim`); whether a worker's
driver is gone (its process, the claim's value, how long a missing claim is forgiven) is the worker's decision
(``workers/driver_watch.py``). What goes to Redis to find out is this one read, here with the engine's other
Redis conversations.
"""

from __future__ import annotations

from typing import Any

from punchline.schedulers.keys import driver_claim


class DriverClaimReader:
    """Reads the claim on ``run_id`` through ``client`` (an asynchronous Redis client)."""

    def __init__(self, client: Any, run_id: str) -> None:
        self._client = client
        self.key = driver_claim(run_id)

    async def read(self) -> tuple[bool, str | None]:
        """(read, the claim's value now: None when there is none); an unreachable ledger reads nothing (and
        says nothing: without it no lease can be taken anyway, and the watcher decides nothing from it)."""
        try:
            held = await self._client.get(self.key)
        except Exception:  # ledger down: fail closed elsewhere, decide nothing here
            return False, None
        return True, held.decode() if isinstance(held, bytes) else held
