"""``punchline batches RUN_ID [--cancel]``: a run's provider batches (state, counts, age, cost), and cancelling them.

The list comes from the store's batch records (``<run>/batches/*.json``), so it works after a crash and
without Redis; a store that does not hold the run is one line and exit 2, not an empty table. ``--cancel``
first records the cancel in the store (``<run>/batches/control/cancel.json``), so a live driver stops sending
anything more (it cancels what it created meanwhile, keeps what came back and stops the stage), then asks each
provider to cancel the batches still open and writes that into their records. A later resume reconciles
cancelled batches like any other: answers that came back are kept, the rest is submitted again.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import msgspec
from rich.console import Console

from punchline.cluster.cli_shared import batch_table
from punchline.cluster.driver import RunRecord
from punchline.cluster.runs import load_run_record
from punchline.data.errors import InputError, ProviderError
from punchline.data.provider_settings import ProviderSettings
from punchline.data.settings import RUNS_DIR_HELP, runs_dir
from punchline.data.store import Store
from punchline.data.stores import open_store
from punchline.schedulers.batches import BatchRecord, read_records, record_path, request_cancel
from punchline.workers.providers import make_batch_provider


def register(sub: Any) -> None:
    p = sub.add_parser("batches", help="a run's provider batches: state, request counts, age; --cancel cancels them")
    p.add_argument("run_id")
    p.add_argument("--runs-dir", help=RUNS_DIR_HELP)
    p.add_argument(
        "--cancel",
        action="store_true",
        help="cancel every batch of the run still open at its provider (a live run stops sending more)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_batches)


def run_store(run: RunRecord) -> Store:
    """The store a run's record names, checked to hold the run (moved, deleted or not mounted: one line)."""
    store = open_store(run.services.store_url)
    if not store.exists(f"{run.run_id}/run.json"):
        raise InputError(
            f"the store {store.url} does not hold run {run.run_id} (moved, deleted or not mounted?)",
            file=f"{store.url}/{run.run_id}/run.json",
        )
    return store


def cmd_batches(args: argparse.Namespace) -> int:
    run = load_run_record(runs_dir(args.runs_dir), args.run_id)
    store = run_store(run)
    if args.cancel:
        cancel_run(run, store)
    records = read_records(store, args.run_id)
    if args.json:
        print(msgspec.json.encode(records).decode())
        return 0
    Console(width=max(Console().width, 150)).print(batch_table(records))
    return 0


def cancel_run(run: RunRecord, store: Store) -> None:
    """Record the cancel (a live driver stops sending), cancel each open batch and mark its record."""
    at = time.time()
    request_cancel(store, run.run_id, at)
    providers = msgspec.toml.decode(run.config_toml.encode()).get("providers", {})
    open_records = [r for r in read_records(store, run.run_id) if r.state in ("intent", "submitted")]
    if not open_records:
        print(f"run {run.run_id} has no open batches")
    for r in open_records:
        status = "not created"
        if r.batch_id:
            settings = msgspec.convert(providers[r.provider], ProviderSettings)
            client = make_batch_provider(r.provider, settings)
            try:
                status = client.cancel(r.batch_id).provider_status
            except ProviderError as exc:  # ended meanwhile, or unreachable: said, and the others go on
                status = f"not cancelled: {exc}"
            finally:
                client.close()
        _mark_cancelled(store, r, at, status)
        print(f"cancelled {r.batch_id or 'intent ' + r.batch_key[:12]} ({r.provider}): {status}")


def _mark_cancelled(store: Store, rec: BatchRecord, at: float, status: str) -> None:
    """Write the cancel into the record as it is now (a live driver may have moved it on meanwhile)."""
    path = record_path(rec.run_id, rec.batch_key)
    raw = store.get(path)
    fresh = rec if raw is None else msgspec.json.decode(raw, type=BatchRecord)
    fresh.cancelled_at = fresh.cancelled_at or at
    if fresh.state != "collected" and not status.startswith("not cancelled"):
        fresh.provider_status = status
    store.put(path, msgspec.json.encode(fresh))
