"""What a worker is given and what it reports back, and the sizes derived from its window: the messages that
cross from the driver to a worker on any node and back. Apart from the worker's logic
(:mod:`~punchline.workers.shard_worker`) so the driver side reads them without the processor's machinery.
"""

from __future__ import annotations

import msgspec

from punchline.data.provider_settings import ProviderSettings
from punchline.data.stores.sentinel import Sentinel

DRAIN_SLACK_S = 60.0  # a draining worker's commits and releases: a few Redis round trips, none retried


def drain_bound_s(providers: dict[str, ProviderSettings]) -> float:
    """How long a worker whose driver is gone may take to end: its calls in flight finish (one attempt each:
    no retry once the driver is gone, so at most the slowest provider's ``timeout_s``), then their answers
    and shards are committed, without waiting out an unreachable ledger (the store has them: the next driver
    finds them there). Past the bound the worker's remaining units are cancelled, whatever the ledger or
    the provider does."""
    timeout_s = max((p.timeout_s for p in providers.values()), default=60.0)
    return timeout_s + DRAIN_SLACK_S


def lease_ahead(window: int) -> int:
    """Units that may take their leases while the window's calls are in flight: a lease takes a Redis
    round trip (and its fsync), a few per cent of a call, so a quarter of the window covers it."""
    return max(2, window // 4)


def answers_waiting(window: int) -> int:
    """Answers that may wait for the group commit without a call slot: at the provider's pace a worker
    receives about a window of answers per quarter second, the commit's linger; twice that keeps the
    call slots free through a slow write. A death loses at most these and the calls in flight."""
    return 2 * window


class WorkerConfig(msgspec.Struct, kw_only=True):
    """Everything a worker needs, serialisable so it crosses to any node."""

    run_id: str
    redis_url: str
    store_url: str
    providers: dict[str, ProviderSettings]
    lease_ms: int = 30_000
    offline: bool = False
    max_cost_usd: float | None = None
    log_path: str | None = None
    spool_dir: str | None = None  # paid answers the store could not take (runs/<id>/spool on each node's disk)
    max_in_flight: int = 0  # units running at once per worker; 0 = the largest provider max_concurrency
    store_sentinel: Sentinel | None = None  # checked at start: this node must see the driver's store
    # redis_url shows its password as ***: the worker reads it from this 0600 file, else from its own
    # PUNCHLINE_REDIS_URL (credentials never travel in actor arguments)
    redis_password_file: str | None = None
    # the value of the driver's claim on the run (host, pid, token): the worker stops taking units once
    # the claim no longer holds it (the driver was killed); None: no driver to watch
    driver_claim: str | None = None

    def window(self) -> int:
        if self.max_in_flight > 0:
            return self.max_in_flight
        return max((p.max_concurrency for p in self.providers.values()), default=8)


class WorkerReport(msgspec.Struct, kw_only=True):
    worker_id: str
    shards_committed: int = 0
    shards_lost: int = 0
    budget_exhausted: bool = False
    stage_reset: bool = False
    driver_gone: bool = False
