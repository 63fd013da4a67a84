"""``punchline run | status | runs | retry-failed``: running, watching and resuming pipelines."""

from __future__ import annotations

import argparse
import math
import time

import msgspec
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table

from punchline.cluster.cli_shared import (
    Subcommands,
    add_run_options,
    batch_table,
    counters_table,
    exit_status,
    plan_cost_title,
    run_and_report,
    run_options,
)
from punchline.cluster.commands import summary
from punchline.cluster.commands._tables import print_whole, whole_table
from punchline.cluster.config import load_config
from punchline.cluster.driver import RunOptions
from punchline.cluster.retry_failed import drop_failed
from punchline.cluster.run_checks import check_environment, check_run
from punchline.cluster.runs import list_runs
from punchline.cluster.status import StatusView, run_status
from punchline.data.errors import InputError
from punchline.data.settings import RUNS_DIR_HELP, STORE, overlay, runs_dir


def register(sub: Subcommands) -> None:
    p = sub.add_parser(
        "run",
        help=summary("run"),
        description="Run a pipeline. With no services configured, starts an embedded redis-server, a local Ray "
        "and stores checkpoints under runs/<run-id>/. An existing --run-id resumes that run: finished stages "
        "are skipped, committed shards kept, cached answers never paid twice.",
    )
    p.add_argument("config", help="run config (TOML), e.g. configs/demo.toml")
    add_run_options(p)
    p.set_defaults(func=cmd_run)

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

    pl = sub.add_parser(
        "plan",
        help=summary("plan"),
        description="Expand the config's stages into provider requests and estimate input tokens "
        "(characters / 4), output tokens (max_tokens per choice, an upper bound), dollars from the "
        "configured prices, and the least wall time the configured rate limits allow.",
    )
    pl.add_argument("config")
    pl.add_argument("--json", action="store_true")
    pl.set_defaults(func=cmd_plan)

    r = sub.add_parser("runs", help=summary("runs"))
    r.add_argument("--runs-dir", help=RUNS_DIR_HELP)
    r.set_defaults(func=cmd_runs)

    f = sub.add_parser(
        "retry-failed",
        help=summary("retry-failed"),
        description="Drop the shards that hold failed units and resume the run: only those units are called again.",
    )
    f.add_argument("run_id")
    f.add_argument("--runs-dir", help=RUNS_DIR_HELP)
    f.add_argument("--no-progress", action="store_true")
    f.set_defaults(func=cmd_retry_failed)


def cmd_run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    return exit_status(run_and_report(args.config, run_options(args), args.no_progress or args.verbose, cfg))


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


def cmd_retry_failed(args: argparse.Namespace) -> int:
    runs = runs_dir(args.runs_dir)
    dropped = drop_failed(runs, args.run_id)
    Console(stderr=True).print(f"dropped {dropped.count} shards with failed units; resuming {dropped.run_id}")
    opts = overlay(RunOptions.from_env(), run_id=dropped.run_id, runs_dir=runs, store=dropped.store_url)
    return exit_status(run_and_report(dropped.config_path, opts, args.no_progress))


def cmd_plan(args: argparse.Namespace) -> int:
    check_environment()
    estimates = check_run(load_config(args.config))  # the checks `run` makes before anything starts
    if args.json:
        print(msgspec.json.encode(estimates).decode())
        return 0
    # one cost column: the price of the mode the config sends each stage's requests in
    table = Table(
        "stage", "requests", "input tokens", "output tokens", plan_cost_title(estimates), "least wall time", "note"
    )
    for e in estimates:
        table.add_row(
            e.stage,
            ("" if e.exact else "≤ ") + str(e.requests),
            str(e.input_tokens),
            str(e.output_tokens),
            f"{e.mode_cost_usd:.4f}",
            f"{e.min_wall_s:.0f}s",
            e.note or ("" if e.mode == "online" else e.mode),
        )
    table.add_row(
        "total",
        str(sum(e.requests for e in estimates)),
        str(sum(e.input_tokens for e in estimates)),
        str(sum(e.output_tokens for e in estimates)),
        f"{sum(e.mode_cost_usd for e in estimates):.4f}",
        f"{sum(e.min_wall_s for e in estimates):.0f}s",
        "",
    )
    Console(width=max(Console().width, 110)).print(table)
    return 0
