"""``punchline batches RUN_ID [--cancel]``: a run's provider batches (state, counts, age, cost), and cancelling them.

The list comes from the store's batch records (``<run>/batches/*.json``), so it works after a crash and
without Redis; ``--cancel`` asks each provider to cancel the batches still open. A resumed run reconciles
cancelled batches like any other: answers that came back are kept, the rest is submitted again.
"""

from __future__ import annotations

import argparse
from typing import Any

import msgspec
from rich.console import Console

from punchline.cluster.cli_shared import batch_table
from punchline.cluster.driver import RunRecord
from punchline.cluster.runs import load_run_record
from punchline.data.provider_settings import ProviderSettings
from punchline.data.stores import open_store
from punchline.schedulers.batches import BatchRecord, read_records
from punchline.workers.providers import make_batch_provider


def register(sub: Any) -> None:
    p = sub.add_parser("batches", help="a run's provider batches: state, request counts, age; --cancel cancels them")
    p.add_argument("run_id")
    p.add_argument("--runs-dir", default="runs")
    p.add_argument("--cancel", action="store_true", help="cancel every batch of the run still open at its provider")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_batches)


def cmd_batches(args: argparse.Namespace) -> int:
    run = load_run_record(args.runs_dir, args.run_id)
    records = read_records(open_store(run.services.store_url), args.run_id)
    if args.cancel:
        _cancel(run, records)
    if args.json:
        print(msgspec.json.encode(records).decode())
        return 0
    Console(width=max(Console().width, 130)).print(batch_table(records))
    return 0


def _cancel(run: RunRecord, records: list[BatchRecord]) -> None:
    providers = msgspec.toml.decode(run.config_toml.encode()).get("providers", {})
    for r in records:
        if r.state == "collected" or not r.batch_id:
            continue
        settings = msgspec.convert(providers[r.provider], ProviderSettings)
        client = make_batch_provider(r.provider, settings)
        try:
            info = client.cancel(r.batch_id)
        finally:
            client.close()
        r.provider_status = info.provider_status
        print(f"cancelled {r.batch_id} ({r.provider}): {info.provider_status}")
