"""Stopping a work call's helper tasks (its heartbeat, its driver watch, its figures) for sure.

``task.cancel()`` followed by ``await task`` waits forever when the task loses the cancellation: a
helper cancelled inside a Redis call can have it swallowed by the client library while it tears its
connection down, and then goes on with its loop. A worker whose work call never ends never leaves
either, and outlives its driver (seen: a killed driver's worker still "busy" minutes later, its figures
task cancelling but asleep in its loop). So the cancellation is asked again until the task ends, and
the wait is bounded: the caller goes on and says so.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

import structlog

STOP_WAIT_S = 10.0  # at most this long for helpers to end (each Redis call of theirs is bounded well below)
RECANCEL_S = 3.0  # a helper still running this long after its cancellation is cancelled again (longer than
# the last publish a helper may make on its way out, which is bounded at 2 s)

log = structlog.get_logger("punchline.worker")


async def stop_tasks(tasks: Iterable[asyncio.Task[object]], timeout_s: float = STOP_WAIT_S) -> list[str]:
    """Cancel ``tasks`` and wait until they end, cancelling again every ``RECANCEL_S``; after ``timeout_s``
    stop waiting. Returns the names of the tasks left running (logged as ``helper_tasks_not_stopped``)."""
    pending = {t for t in tasks if not t.done()}
    for task in pending:
        task.cancel()
    deadline = time.monotonic() + timeout_s
    while pending:
        left_s = deadline - time.monotonic()
        if left_s <= 0:
            names = sorted(t.get_name() for t in pending)
            log.warning("helper_tasks_not_stopped", tasks=names, waited_s=timeout_s)
            return names
        _, pending = await asyncio.wait(pending, timeout=min(RECANCEL_S, left_s))
        for task in pending:  # the cancellation was lost: ask again
            log.info("helper_task_cancelled_again", task=task.get_name())
            task.cancel()
    for task in tasks:  # retrieve what they raised: nothing is left for asyncio to complain about
        if task.done() and not task.cancelled():
            task.exception()
    return []
