"""``punchline run | plan | retry-failed``: running, pricing and resuming pipelines (``status`` and ``runs``, which
only read, are in ``commands/runs.py``)."""

from __future__ import annotations

import argparse
import sys

import msgspec
from rich.console import Console
from rich.table import Table

from punchline.cluster.cli.commands import summary
from punchline.cluster.cli.shared import (
    Subcommands,
    add_run_command,
    exit_status,
    plan_cost_title,
    run_and_report,
    run_config,
)
from punchline.cluster.config import load_config
from punchline.cluster.estimate.latencies import measured_latencies
from punchline.cluster.estimate.machine_load import sample_runnable
from punchline.cluster.estimate.request_ratios import request_ratios
from punchline.cluster.estimate.wall_estimate import cache_lookup, estimate_wall, store_of
from punchline.cluster.records.retry_failed import drop_failed
from punchline.cluster.run.driver import RunOptions
from punchline.cluster.run.planner import HASHED, StageEstimate
from punchline.cluster.run.run_checks import cap_warning, check_environment, check_run
from punchline.cluster.run.run_services import check_ledger
from punchline.data.redaction import redact_url
from punchline.data.settings import RUNS_DIR_HELP, overlay, runs_dir


def register(sub: Subcommands) -> None:
    add_run_command(
        sub,
        "run",
        cmd_run,
        help=summary("run"),
        description="Run a pipeline. With no services configured, starts an embedded redis-server, a local Ray "
        "and stores checkpoints under runs/<run-id>/. An existing --run-id resumes that run: finished stages "
        "are skipped, committed shards kept, cached answers never paid twice.",
        config_help="run config (TOML), e.g. configs/demo.toml",
    )

    pl = sub.add_parser(
        "plan",
        help=summary("plan"),
        description="Expand the config's stages into provider requests and estimate, as upper bounds (what "
        "--max-cost-usd holds before a call or batch), input tokens (each UTF-8 byte of a message one token, plus "
        "the chat template's), output tokens (max_tokens per choice) and dollars from the configured prices; "
        "the least wall time the configured rate limits allow, and the run's wall time: "
        "its calls (only the requests it will send: identical requests once, not those the response cache "
        "answers; a stage whose prompts depend on earlier answers at the share an earlier run here sent, else "
        "every unit, an upper bound) and its fixed costs (start, plans, "
        "reduces), as the runs folder's latest finished runs of the pipeline measured them, stretched by how "
        "busy the machine is now against then (tasks runnable besides, from /proc/loadavg).",
    )
    pl.add_argument("config")
    pl.add_argument("--json", action="store_true")
    pl.add_argument("--runs-dir", help=RUNS_DIR_HELP + "; its cache and earlier runs time the estimate")
    pl.add_argument(
        "--redis-url",
        help="the Redis the run would use (env PUNCHLINE_REDIS_URL; config [run] redis_url; none: the runs "
        "folder's embedded one, not started by plan), checked as run checks it: it answers, takes the password, "
        "holds the engine's scripts or lets this user load them",
    )
    pl.set_defaults(func=cmd_plan)

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
    return run_config(args)


def cmd_retry_failed(args: argparse.Namespace) -> int:
    runs = runs_dir(args.runs_dir)
    dropped = drop_failed(runs, args.run_id)
    Console(stderr=True).print(f"dropped {dropped.count} shards with failed units; resuming {dropped.run_id}")
    opts = overlay(RunOptions.from_env(), run_id=dropped.run_id, runs_dir=runs, store=dropped.store_url)
    return exit_status(run_and_report(dropped.config_path, opts, args.no_progress))


def cmd_plan(args: argparse.Namespace) -> int:
    check_environment()
    cfg = load_config(args.config)
    runs = runs_dir(args.runs_dir)
    latencies = measured_latencies(runs)  # the real endpoints' calls as this runs folder timed them
    ratios = request_ratios(runs, cfg.run.pipeline)  # the requests earlier runs sent per unit of each stage
    cached = cache_lookup(store_of(cfg, runs))  # each exact request looked up in the response cache
    # the checks `run` makes before anything starts, and the plan: every exact request hashed (identical ones once)
    estimates = check_run(cfg, latencies, cached, ratios, distinct=True)
    redis_url = overlay(RunOptions.from_env(), redis_url=args.redis_url).redis_url or cfg.run.redis_url
    if redis_url:  # the run's order: the flag, PUNCHLINE_REDIS_URL, [run] redis_url
        check_ledger(redis_url)
    wall = estimate_wall(cfg, estimates, runs, sample_runnable())
    warning = cap_warning(cfg, estimates)
    if warning is not None:  # on stderr, so --json stays one document
        print(f"punchline: warning: {warning}", file=sys.stderr)
    if args.json:
        print(msgspec.json.encode(estimates).decode())
        return 0
    # one cost column: the price of the mode the config sends each stage's requests in
    table = Table(
        "stage",
        "units",
        "requests",
        "to send",
        "input tokens",
        "output tokens",
        plan_cost_title(estimates),
        "least wall time",
        "calls time",
        "note",
    )
    for e in estimates:
        bound = "" if e.exact else "≤ "
        sent_bound = "≤ " if e.sent_bound else ("~" if not e.exact else "")
        calls_s = wall.stages_calls_s.get(e.stage, 0.0)
        table.add_row(
            e.stage,
            bound + str(e.units),
            bound + str(e.requests),
            sent_bound + str(e.to_send),
            str(e.input_tokens),
            str(e.output_tokens),
            f"{e.mode_cost_usd:.4f}",
            f"{e.min_wall_s:.0f}s",
            ("≤ " if e.sent_bound else "") + f"{calls_s:.1f}s",
            "; ".join(filter(None, [e.note or ("" if e.mode == "online" else e.mode), _cached(e), _sent(e)])),
        )
    table.add_row(
        "total",
        str(sum(e.units for e in estimates)),
        str(sum(e.requests for e in estimates)),
        ("≤ " if wall.sent_bound else "") + str(wall.to_send),
        str(sum(e.input_tokens for e in estimates)),
        str(sum(e.output_tokens for e in estimates)),
        f"{sum(e.mode_cost_usd for e in estimates):.4f}",
        f"{sum(e.min_wall_s for e in estimates):.0f}s",
        ("≤ " if wall.sent_bound else "") + f"{wall.calls_s:.1f}s",
        "",
    )
    Console(width=max(Console().width, 150)).print(table)
    print(wall.describe())
    if redis_url:
        print(f"ledger: {redact_url(redis_url)} answers and holds the engine's scripts")
    return 0


def _cached(e: StageEstimate) -> str:
    return f"{e.cached_requests} cached" if e.cached_requests else ""


def _sent(e: StageEstimate) -> str:
    """How the requests to send were counted: identical prompts once, an earlier run's share, or every unit."""
    if e.sent_from == HASHED:
        same = e.requests - e.distinct_requests
        return f"{same} identical requests sent once" if same else ""
    if e.sent_bound:
        return f"to send: {e.sent_from}"
    return f"to send: as {e.sent_from}" if e.sent_from else ""
