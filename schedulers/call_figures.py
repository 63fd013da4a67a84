"""Where workers' call figures live in the ledger: each worker's latest figures as one value of its own, listed in
the run's sorted set by when they were written.

What the figures are and how they add up is the workers' (``workers/calls/call_stats.py``: a JSON blob per worker); this
module only stores and fetches the blobs, so that the Redis commands stay in this layer. One round trip a second
per worker (a pipeline of three commands), nothing per call; both keys expire :data:`KEEP_S` after their last write.
The ledger's command allow-list has sorted sets, not sets, hence ``ZADD`` for the listing.
"""

from __future__ import annotations

import time
from typing import Any

from punchline.schedulers.keys import calls, worker_calls
from punchline.schedulers.ledger import ledger_errors

KEEP_S = 86_400  # the keys' expiry after their last write


async def publish(client: Any, namespace: str, run_id: str, worker_id: str, blob: bytes) -> None:
    """Write one worker's figures (``client``: an asynchronous Redis client) and list them in the run's set."""
    key, members = worker_calls(namespace, run_id, worker_id), calls(namespace, run_id)
    pipe = client.pipeline(transaction=False)
    pipe.set(key, blob, ex=KEEP_S)
    pipe.zadd(members, {key: time.time()})
    pipe.expire(members, KEEP_S)
    with ledger_errors():
        await pipe.execute()


def read_all(client: Any, namespace: str, run_id: str) -> list[bytes | None]:
    """Every worker's figures the run's set lists (``client``: a synchronous Redis client); None for one expired."""
    with ledger_errors():
        keys = client.zrange(calls(namespace, run_id), 0, -1)
        return list(client.mget(keys)) if keys else []
