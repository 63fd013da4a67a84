"""A sentinel proves that a process sees the same store as the driver.

Every node's workers write their shards and cached answers into the store, and the driver decides
that a stage is finished from what *it* sees there. A folder that is not shared (a local path on a
multi-node cluster, a relative path inside a Ray job's temporary working dir) splits the run into
copies that never meet: the workers pay for everything and the driver waits forever. So before any
paid call the driver plants a sentinel (a random token under the run's prefix), and every node, and
every worker when it starts, checks that it reads the same token back; one that cannot stops the
run with one line naming the fix.
"""

from __future__ import annotations

import os
import secrets
import socket
import time

import msgspec

from punchline.data.errors import StoreError
from punchline.data.storage.run_layout import RunLayout
from punchline.data.store import Store

SHARED_HINT = "use --store s3://bucket/prefix or a folder on a mount every node shares"


class Sentinel(msgspec.Struct, frozen=True, kw_only=True):
    """Where the driver put its token, and the token; crosses to every worker in its config."""

    key: str
    token: str


class SentinelBody(msgspec.Struct, kw_only=True):
    token: str
    host: str
    pid: int
    created_at: float


def plant(store: Store, run_id: str) -> Sentinel:
    """Write a fresh sentinel for this driver (one per driver start, so overlapping drivers of a
    run never invalidate each other's workers)."""
    token = secrets.token_hex(16)
    key = RunLayout(run_id).sentinel(token)
    body = SentinelBody(token=token, host=socket.gethostname(), pid=os.getpid(), created_at=time.time())
    store.put(key, msgspec.json.encode(body))
    return Sentinel(key=key, token=token)


def sees(store: Store, sentinel: Sentinel) -> bool:
    """Whether this process reads back the token the driver wrote."""
    raw = store.get(sentinel.key)
    if raw is None:
        return False
    try:
        return msgspec.json.decode(raw, type=SentinelBody).token == sentinel.token
    except msgspec.DecodeError:
        return False


def not_shared(store_url: str, where: str) -> str:
    """The one line that stops a run whose store ``where`` (a node, a worker) cannot see."""
    if store_url.startswith("s3://"):
        return (
            f"{where} cannot read what the driver wrote to {store_url}; give every node the same bucket, "
            "endpoint and access (instance profile, IRSA / pod identity)"
        )
    return f"store {store_url} is not shared: {where} cannot see what the driver wrote there; {SHARED_HINT}"


def is_not_shared(text: str) -> bool:
    """Whether an error line is :func:`not_shared`'s (a worker found it cannot see the driver's store)."""
    return "what the driver wrote" in text and ("cannot see" in text or "cannot read" in text)


def ensure_sees(store: Store, sentinel: Sentinel | None, where: str) -> None:
    """Raise (with the one line) unless this process sees ``sentinel``; None checks nothing."""
    if sentinel is not None and not sees(store, sentinel):
        raise StoreError(not_shared(store.url, where))
