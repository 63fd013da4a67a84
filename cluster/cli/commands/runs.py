"""``punchline status | runs``: what a run is doing or did, read from its record, the ledger and the store.

Read-only, so they import none of the engine that writes runs (the driver, the pipelines, the providers' code):
``punchline status`` starts in about half the time ``punchline run`` takes to import (BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import math
import time

import msgspec
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from punchline.cluster.cli.commands import Subcommands, summary
from punchline.cluster.cli.commands._tables import batch_table, counters_table, print_whole, waiting_lines, whole_table
from punchline.cluster.records.runs import list_runs
from punchline.cluster.records.status import StatusView, run_status
from punchline.data.errors import InputError
from punchline.data.settings import RUNS_DIR_HELP, STORE, runs_dir


def register(sub: Subcommands) -> None:
    s = sub.add_parser(
        "status",
        help=summary("status"),
        description="Per stage: units total / done / leased / failed, provider requests, cache "
        "hits, tokens, cost, rate and ETA. Live while the run is going, from its record afterwards.",
    )
    s.add_argument("run_id")
    s.add_argument("--runs-dir", help=RUNS_DIR_HELP)
    s.add_argument(
        "--store",
        help="read the run's record from this store when it is not under --runs-dir (a run submitted as a "
        "Ray job; env PUNCHLINE_STORE)",
    )
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.add_argument("--watch", type=float, metavar="SECONDS", help="refresh every SECONDS until the run ends")
    s.set_defaults(func=cmd_status)

    r = sub.add_parser("runs", help=summary("runs"))
    r.add_argument("--runs-dir", help=RUNS_DIR_HELP)
    r.set_defaults(func=cmd_runs)


def _status_renderable(view: StatusView) -> Group:
    parts: list[RenderableType] = [
        f"run [bold]{view.run_id}[/bold] ({view.pipeline}): {view.state}{' (live)' if view.live else ''}",
        counters_table(view.counters, view.leased),
    ]
    if view.usage:
        table = Table("stage", "model", "tokens in", "tokens out", "cost $", title="cost per model")
        for row in view.usage:
            table.add_row(row.stage, row.model, str(row.input_tokens), str(row.output_tokens), f"{row.usd:.4f}")
        parts.append(table)
    if view.batches:
        table = batch_table(view.batches)
        table.title = "provider batches"
        parts.append(table)
        parts += [Text(line) for line in waiting_lines(view.batches)]  # an intent waiting on a look-alike
    for stage, fails in view.failures.items():
        parts.append(f"[red]{len(fails)} failed units in {stage}:[/red]")
        parts += [f"  {uid}: {reason}" for uid, reason in sorted(fails.items())]
    return Group(*parts)


def cmd_status(args: argparse.Namespace) -> int:
    if args.watch is not None and not (math.isfinite(args.watch) and 0.1 <= args.watch <= 3600):
        raise InputError(f"must be between 0.1 and 3600 seconds, got {args.watch}", field="--watch")
    store = args.store or STORE.get()
    runs = runs_dir(args.runs_dir)
    view = run_status(runs, args.run_id, store)
    if args.json:
        print(msgspec.json.encode(view).decode())
        return 0
    console = Console(width=max(Console().width, 110))
    if not args.watch:
        console.print(_status_renderable(view))
        return 0
    with Live(_status_renderable(view), console=console, refresh_per_second=4) as live:
        while view.state == "running":
            time.sleep(args.watch)
            view = run_status(runs, args.run_id, store)
            live.update(_status_renderable(view))
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    table = whole_table("run id", "pipeline", "state", "created", "units done", "cost $")
    for row in list_runs(runs_dir(args.runs_dir)):
        if row.error is not None:
            table.add_row(row.run_id, row.pipeline, row.error, "", "", "")
        else:
            table.add_row(row.run_id, row.pipeline, row.state, row.created, str(row.units_done), f"{row.cost_usd:.4f}")
    print_whole(table)  # whole run ids, to copy into status / --run-id
    return 0
