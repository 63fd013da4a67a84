"""``punchline batches RUN_ID [--cancel] [--not-ours BATCH_ID]``: a run's provider batches (state, counts, age,
cost), cancelling them, and telling a waiting run that a look-alike batch is not its own.

The work (reading the store's batch records, the cancel) is :mod:`punchline.cluster.records.run_batches`; this module
parses and prints.
"""

from __future__ import annotations

import argparse

import msgspec
from rich.console import Console

from punchline.cluster.cli.commands import summary
from punchline.cluster.cli.commands._tables import batch_table, waiting_lines
from punchline.cluster.cli.shared import Subcommands
from punchline.cluster.records.run_batches import run_batches
from punchline.data.settings import RUNS_DIR_HELP, runs_dir


def register(sub: Subcommands) -> None:
    p = sub.add_parser("batches", help=summary("batches"))
    p.add_argument("run_id")
    p.add_argument("--runs-dir", help=RUNS_DIR_HELP)
    p.add_argument(
        "--cancel",
        action="store_true",
        help="cancel every batch of the run still open at its provider (a live run stops sending more)",
    )
    p.add_argument(
        "--not-ours",
        action="append",
        default=[],
        metavar="BATCH_ID",
        help="a batch on the account that is not this run's (an intent whose create call was cut off waits on an "
        "open batch with its request count created meanwhile until its results tell; this ends the wait)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_batches)


def cmd_batches(args: argparse.Namespace) -> int:
    batches = run_batches(runs_dir(args.runs_dir), args.run_id, cancel=args.cancel, not_ours=args.not_ours)
    for batch_id in args.not_ours:
        print(f"{batch_id}: not run {batches.run_id}'s (a waiting intent no longer waits on it)")
    if batches.cancelled is not None:
        for done in batches.cancelled:
            print(done.describe())
        if not batches.cancelled:
            print(f"run {batches.run_id} has no open batches")
    if args.json:
        print(msgspec.json.encode(batches.records).decode())
        return 0
    console = Console(width=max(Console().width, 150))
    console.print(batch_table(batches.records))
    for line in waiting_lines(batches.records, batches.not_ours):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    return 0
