"""A run's record and the list of runs: what ``status``, ``runs``, ``retry-failed`` and ``batches`` read.

Kept apart from the commands so that they only parse, call and print, and cheap to import (no Ray, no
Redis server): reading a record touches the runs folder (or the store), and only a run still marked
running is asked about its live counters, from its own Redis.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import msgspec

from punchline.cluster.records.run_record import RunRecord, check_run_id, load_record
from punchline.data.errors import InputError, PunchlineError
from punchline.data.storage.run_layout import RECORD, RunLayout
from punchline.data.stores import open_store
from punchline.schedulers.batches import BatchRecord, read_records, with_batch_costs
from punchline.schedulers.budget import UsageRow
from punchline.schedulers.ledger import Ledger, StageCounters
from punchline.schedulers.server.redis_client import ClientError, LedgerClient, connect, resolve_url

#: the state ``runs`` shows for a run whose driver is gone (killed, or its Redis with it)
INTERRUPTED = "interrupted (resume with --run-id)"


def runs_folder(runs_dir: str) -> Path:
    """The runs folder (it may not exist yet); a file in its place is bad input."""
    if not runs_dir.strip():
        raise InputError("is empty; give a folder (default: runs)", field="--runs-dir")
    root = Path(runs_dir)
    if root.exists() and not root.is_dir():
        raise InputError("is a file, not a folder", file=runs_dir, field="--runs-dir")
    return root


def load_run_record(runs_dir: str, run_id: str, store: str | None = None) -> RunRecord:
    """The run's record under the runs folder, else (a run submitted as a Ray job keeps its runs folder
    in the job's working dir on the head) the one the driver keeps in the store."""
    check_run_id(run_id, field="run_id")  # a run id never names a path outside the runs folder
    path = RunLayout(run_id).local(runs_folder(runs_dir)).record
    if path.is_file():
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise InputError(f"cannot read: {exc.strerror}", file=str(path)) from None
        return load_record(raw, str(path))
    if store:
        found = open_store(store).get(RunLayout(run_id).record)
        if found is not None:
            return load_record(found, f"{store}/{RunLayout(run_id).record}")
    where = f"{runs_dir}/" + (f" or in {store}" if store else "")
    raise InputError(f"no run {run_id!r} under {where} (see `punchline runs`)", file=str(path))


def ledger_client(record: RunRecord) -> LedgerClient:
    """A client of the run's Redis; the password comes from this machine (file or environment)."""
    services = record.services
    return connect(resolve_url(services.redis_url, services.redis_password_file))


def with_batch_records(
    record: RunRecord, counters: dict[str, StageCounters] | None = None, usage: list[UsageRow] | None = None
) -> tuple[dict[str, StageCounters], list[UsageRow], list[BatchRecord]]:
    """Counters and cost-per-model rows (the record's unless given) with every batch record of the run added
    (what batches cost is in their records, whichever driver ran them), and the records themselves."""
    batches: list[BatchRecord] = []
    with contextlib.suppress(PunchlineError):  # the store may be out of reach: status still shows the rest
        batches = read_records(open_store(record.services.store_url), record.run_id)
    counters = record.counters if counters is None else counters
    usage = record.usage if usage is None else usage
    return (*with_batch_costs(counters, usage, batches), batches)


class LiveCounters(msgspec.Struct, kw_only=True):
    """A running run's progress, read from its Redis."""

    counters: dict[str, StageCounters]
    leased: dict[str, int]
    failures: dict[str, dict[str, str]]


def live_counters(record: RunRecord) -> LiveCounters | None:
    """Counters from the run's Redis if it is still up (a running run), else None."""
    try:
        ledger = Ledger(ledger_client(record))
        ledger.ping()
        return LiveCounters(
            counters={s: ledger.counters(record.run_id, s) for s in record.stages},
            leased={s: ledger.leased_shards(record.run_id, s) for s in record.stages},
            failures={s: f for s in record.stages if (f := ledger.failures(record.run_id, s))},
        )
    except (PunchlineError, ClientError, OSError):
        return None


class RunRow(msgspec.Struct, kw_only=True):
    """One line of ``punchline runs``; ``error`` names a record that could not be read."""

    run_id: str
    pipeline: str = "?"
    state: str = ""
    created: str = ""  # UTC, minutes
    units_done: int = 0
    cost_usd: float = 0.0
    error: str | None = None


def list_runs(runs_dir: str) -> list[RunRow]:
    """Every run under the runs folder, by id; one unreadable record does not hide the others."""
    rows = []
    for path in sorted(runs_folder(runs_dir).glob(f"*/{RECORD}")):
        try:
            rec = load_record(path.read_bytes(), str(path))
        except (InputError, OSError) as exc:
            rows.append(RunRow(run_id=path.parent.name, error=f"unreadable run.json: {str(exc)[:80]}"))
            continue
        state: str = rec.state
        if state == "running" and (rec.driver_gone() or live_counters(rec) is None):
            state = INTERRUPTED
        rows.append(
            RunRow(
                run_id=rec.run_id,
                pipeline=rec.pipeline,
                state=state,
                created=time.strftime("%Y-%m-%d %H:%M", time.gmtime(rec.created_at)),
                units_done=sum(c.units_done for c in rec.counters.values()),
                cost_usd=sum(c.cost_usd for c in with_batch_records(rec)[0].values()),
            )
        )
    return rows
