"""What ``punchline status`` shows of a run: live from its Redis while it runs, from its record after.

A function returning a struct, so that the command only prints it (a table, or ``--json``) and other
callers (a notebook, a test) read the same view.
"""

from __future__ import annotations

import contextlib

import msgspec

from punchline.cluster.records.runs import ledger_client, live_counters, load_run_record, with_batch_records
from punchline.data.errors import PunchlineError
from punchline.data.units import RunState
from punchline.schedulers.batches import BatchRecord
from punchline.schedulers.budget import Budget, UsageRow
from punchline.schedulers.ledger import StageCounters
from punchline.schedulers.server.redis_client import ClientError


class StatusView(msgspec.Struct, kw_only=True):
    """What ``status`` shows: live from the run's Redis while it runs, from its record afterwards."""

    run_id: str
    pipeline: str
    state: RunState
    live: bool
    counters: dict[str, StageCounters]
    leased: dict[str, int] | None
    failures: dict[str, dict[str, str]]
    usage: list[UsageRow]
    batches: list[BatchRecord] = []  # provider batches of batch-mode providers, from the store


def run_status(runs_dir: str, run_id: str, store: str | None = None) -> StatusView:
    """The run's progress, cost, failures and provider batches (``store``: where a run submitted as a
    Ray job keeps its record)."""
    record = load_run_record(runs_dir, run_id, store)
    live = live_counters(record) if record.state == "running" else None
    if record.driver_gone():
        record.state = "interrupted"
    usage = record.usage
    if live is not None:
        with contextlib.suppress(PunchlineError, ClientError, OSError):
            usage = Budget(ledger_client(record), record.run_id, None).usage()
    counters, usage, batches = with_batch_records(record, live.counters if live else record.counters, usage)
    return StatusView(
        run_id=record.run_id,
        pipeline=record.pipeline,
        state=record.state,
        live=live is not None,
        counters=counters,
        leased=live.leased if live else None,
        failures=live.failures if live else record.failures,
        usage=usage,
        batches=batches,
    )
