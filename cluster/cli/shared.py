"""What several command families share: the options of every command that runs a pipeline, running one
with progress bars and printing its end-of-run summary, and the tables of counters and batches.

Command modules (cluster/cli/commands/) never import each other; what two of them need lives here, so
each command stays: parse, call, print.
"""

from __future__ import annotations

import argparse
import os
import shlex
from collections.abc import Callable, Sequence

from rich.console import Console
from rich.markdown import Markdown
from rich.text import Text

from punchline.cluster.cli.commands import Subcommands as Subcommands
from punchline.cluster.cli.commands._progress import Bars, Notices, Warnings
from punchline.cluster.cli.commands._tables import counters_table
from punchline.cluster.config import RunConfig, load_config
from punchline.cluster.pipeline import StageContext
from punchline.cluster.records.runs import with_batch_records
from punchline.cluster.registry import pipeline_of
from punchline.cluster.run.driver import RunOptions, RunRecord, run
from punchline.cluster.run.planner import StageEstimate
from punchline.data.errors import ConfigError, PluginError
from punchline.data.settings import RUNS_DIR_HELP, overlay, runs_dir
from punchline.data.storage.run_layout import RunLayout
from punchline.data.stores import open_store
from punchline.schedulers.server.redis_client import redact_url


def port(text: str) -> int:
    """A TCP port for a flag (0: a free one), checked before anything starts."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port (0-65535)")
    return value


def add_run_command(
    sub: Subcommands,
    name: str,
    func: Callable[[argparse.Namespace], int],
    *,
    help: str,
    description: str,
    config_help: str,
) -> argparse.ArgumentParser:
    """A command that runs a pipeline from a config: ``run``, and and a pipeline family's alias of it (``<family> run``)
    (whose ``func`` calls :func:`run_config` naming its pipeline). The config argument and the run options are
    spelled here once, so the alias and ``run`` cannot drift apart."""
    p = sub.add_parser(name, help=help, description=description)
    p.add_argument("config", help=config_help)
    add_run_options(p)
    p.set_defaults(func=func)
    return p


def run_config(args: argparse.Namespace, *, pipeline: str | None = None, command: str = "run") -> int:
    """What a command of :func:`add_run_command` does: load ``args.config``, run it with progress bars and print
    its summary (:func:`run_and_report`); the exit status is :func:`exit_status`'s. With ``pipeline``, a config
    of another pipeline is refused before anything starts, naming run.pipeline and pointing at ``punchline run``
    (``command`` is the alias's name in that message)."""
    cfg = load_config(args.config)
    if pipeline is not None and pipeline_of(cfg).name != pipeline:
        raise ConfigError(
            f'run.pipeline is {cfg.run.pipeline!r}; `{command}` needs pipeline = "{pipeline}" (use `punchline run`)',
            file=args.config,
            field="run.pipeline",
        )
    return exit_status(run_and_report(args.config, run_options(args), no_bars(args), cfg))


def no_bars(args: argparse.Namespace) -> bool:
    """No progress bars for parsed :func:`add_run_options` arguments: --no-progress, or --verbose (whose log
    lines on stderr take the bars' place)."""
    return bool(args.no_progress or args.verbose)


def add_run_options(p: argparse.ArgumentParser) -> None:
    """The options of every command that runs a pipeline (``run``, its aliases, a family's run commands)."""
    p.add_argument("--run-id", help="resume this run (or name a new one)")
    p.add_argument("--redis-url", help="use this Redis instead of an embedded one (env PUNCHLINE_REDIS_URL)")
    p.add_argument("--store", help="checkpoint store: a folder or s3://bucket/prefix (env PUNCHLINE_STORE)")
    p.add_argument("--ray-address", help="connect to this Ray cluster (env PUNCHLINE_RAY_ADDRESS)")
    p.add_argument("--max-cost-usd", type=float, help="stop scheduling new units before this budget is exceeded")
    p.add_argument(
        "--max-workers",
        type=int,
        help="ask the autoscaler for up to this many worker nodes while shards outnumber workers "
        "(env PUNCHLINE_MAX_WORKERS; config [run] max_workers; default 0: never ask)",
    )
    p.add_argument("--offline", action="store_true", default=None, help="never call a provider: cache misses fail")
    p.add_argument("--runs-dir", help=RUNS_DIR_HELP)
    p.add_argument("--no-progress", action="store_true", help="no progress bars (e.g. in CI logs)")
    p.add_argument("--metrics-port", type=port, help="serve the run's Prometheus metrics on 127.0.0.1:PORT/metrics")
    p.add_argument(
        "--ray-dashboard",
        dest="ray_dashboard_port",
        nargs="?",
        const=0,
        type=port,
        metavar="PORT",
        help="serve Ray's dashboard of the runs folder's local head on 127.0.0.1:PORT (no PORT or 0: a free one) "
        "and print its URL; a head already running keeps what it has (env PUNCHLINE_LOCAL_RAY_DASHBOARD_PORT)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="readable log lines on stderr instead of progress bars")


def run_options(args: argparse.Namespace, **overrides: str | bool | None) -> RunOptions:
    """RunOptions from parsed :func:`add_run_options` arguments, over the environment."""
    values: dict[str, object] = dict(
        verbose=args.verbose,
        run_id=args.run_id,
        redis_url=args.redis_url,
        store=args.store,
        ray_address=args.ray_address,
        max_cost_usd=args.max_cost_usd,
        max_workers=args.max_workers,
        offline=args.offline,
        runs_dir=args.runs_dir,
        metrics_port=getattr(args, "metrics_port", None),
        ray_dashboard_port=getattr(args, "ray_dashboard_port", None),
    )
    values.update(overrides)
    return overlay(RunOptions.from_env(), **values)


def run_and_report(config: str, opts: RunOptions, no_progress: bool, cfg: RunConfig | None = None) -> RunRecord:
    """Run with progress bars, then print counters, artifacts and headlines (``cfg``: the config already
    loaded from ``config``, if the caller has it). See :func:`exit_status`."""
    console = Console(stderr=True)
    bars = None if no_progress else Bars(console)
    shown = bars or (None if opts.verbose else Notices(console))  # --no-progress: a wait only its user ends, said
    warnings = Warnings()  # said again at the end, after the counters and headlines
    warnings.start()
    if shown:
        shown.start()
    try:
        record = run(config, opts, progress=bars)
    except (KeyboardInterrupt, PluginError) as exc:  # Ctrl-C, the pipeline's own bug: how to resume exactly this run
        run_id = getattr(exc, "run_id", None) or opts.run_id
        if run_id:
            exc.resume_command = resume_command(config, opts, run_id)  # type: ignore[union-attr]
        raise
    finally:
        warnings.stop()
        if shown:
            shown.stop()
    out = Console(width=max(Console().width, 110))
    out.print(f"run [bold]{record.run_id}[/bold]: {record.state}")
    out.print(counters_table(with_batch_records(record)[0]))
    out.print(f"artifacts in {record.services.store_url}/{RunLayout(record.run_id).artifacts}:")
    for name in record.artifacts:
        out.print(f"  {name}")
    cfg = cfg if cfg is not None else load_config(config)
    ctx = StageContext(cfg, record.run_id, open_store(record.services.store_url))
    for text in pipeline_of(cfg).headlines(ctx):
        out.print(Markdown(text))
    for line in warnings.lines:
        out.print(Text.assemble(("warning: ", "yellow"), line), soft_wrap=True)  # a regex is no markup
    if record.failures:
        out.print(
            f"[red]{sum(len(v) for v in record.failures.values())} failed units[/red]; "
            f"see `punchline status {record.run_id}`, then `punchline retry-failed {record.run_id}`"
        )
    return record


def resume_command(config: str, opts: RunOptions, run_id: str) -> str:
    """The command that resumes this run: the same config and the options that say where its state
    is (a --redis-url is shown with its password as ***)."""
    parts = ["punchline", "run", config, "--run-id", run_id]
    env = os.environ
    if opts.runs_dir != runs_dir(None):
        parts += ["--runs-dir", opts.runs_dir]
    for flag, value, var in (
        ("--store", opts.store, "PUNCHLINE_STORE"),
        ("--redis-url", opts.redis_url and redact_url(opts.redis_url), "PUNCHLINE_REDIS_URL"),
        ("--ray-address", opts.ray_address, "PUNCHLINE_RAY_ADDRESS"),
    ):
        if value and not env.get(var):
            parts += [flag, value]
    if opts.max_cost_usd is not None:
        parts += ["--max-cost-usd", str(opts.max_cost_usd)]
    if opts.max_workers is not None:
        parts += ["--max-workers", str(opts.max_workers)]
    if opts.offline:
        parts.append("--offline")
    return shlex.join(parts)


def exit_status(record: RunRecord) -> int:
    """1 when units failed (they can be retried), else 0."""
    return 1 if record.failures else 0


def plan_cost_title(estimates: Sequence[StageEstimate]) -> str:
    """The title of ``plan``'s one cost column: the price of the mode the config sends requests in."""
    modes = {m for e in estimates if e.requests for m in e.mode.split("+")}
    if modes == {"batch"}:
        return "batch cost $"
    return "cost $ (online + batch)" if "batch" in modes else "cost $"
