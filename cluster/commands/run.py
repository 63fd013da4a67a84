"""``punchline run | status | runs | retry-failed``: running, watching and resuming pipelines."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import time
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from punchline.data.errors import InputError, PunchlineError
from punchline.schedulers.batches import BatchRecord
from punchline.schedulers.ledger import StageCounters


def register(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="run (or resume) a pipeline from a TOML config",
        description="Run a pipeline. With no services configured, starts an embedded redis-server, a local Ray "
        "and stores checkpoints under runs/<run-id>/. An existing --run-id resumes that run: finished stages "
        "are skipped, committed shards kept, cached answers never paid twice.",
    )
    p.add_argument("config", help="run config (TOML), e.g. configs/demo.toml")
    add_run_options(p)
    p.set_defaults(func=cmd_run)

    s = sub.add_parser(
        "status",
        help="progress, cost and failures of a run",
        description="Per stage: units total / done / leased / failed, provider requests, cache "
        "hits, tokens, cost, rate and ETA. Live while the run is going, from its record afterwards.",
    )
    s.add_argument("run_id")
    s.add_argument("--runs-dir", default="runs")
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
        help="requests, tokens, cost and least wall time of a config, without calling",
        description="Expand the config's stages into provider requests and estimate input tokens "
        "(characters / 4), output tokens (max_tokens per choice, an upper bound), dollars from the "
        "configured prices, and the least wall time the configured rate limits allow.",
    )
    pl.add_argument("config")
    pl.add_argument("--json", action="store_true")
    pl.set_defaults(func=cmd_plan)

    r = sub.add_parser("runs", help="list runs under the runs folder")
    r.add_argument("--runs-dir", default="runs")
    r.set_defaults(func=cmd_runs)

    f = sub.add_parser(
        "retry-failed",
        help="retry the failed units of a run",
        description="Drop the shards that hold failed units and resume the run: only those units are called again.",
    )
    f.add_argument("run_id")
    f.add_argument("--runs-dir", default="runs")
    f.add_argument("--no-progress", action="store_true")
    f.set_defaults(func=cmd_retry_failed)


def add_run_options(p: argparse.ArgumentParser) -> None:
    """The options of every command that runs a pipeline (``run`` and its aliases)."""
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
    p.add_argument("--runs-dir", default=None, help="local folder for run state and logs (default: runs)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (e.g. in CI logs)")
    p.add_argument("-v", "--verbose", action="store_true", help="readable log lines on stderr instead of progress bars")


def run_options(args: argparse.Namespace, **overrides: Any) -> Any:
    """RunOptions from parsed :func:`add_run_options` arguments, over the environment."""
    from punchline.cluster.driver import RunOptions

    values = dict(
        verbose=args.verbose,
        run_id=args.run_id,
        redis_url=args.redis_url,
        store=args.store,
        ray_address=args.ray_address,
        max_cost_usd=args.max_cost_usd,
        max_workers=args.max_workers,
        offline=args.offline,
        runs_dir=args.runs_dir,
    )
    values.update(overrides)
    return RunOptions.from_env(**values)


class _Bars:
    """One progress bar per stage, fed from the ledger's counters."""

    def __init__(self, console: Console) -> None:
        self.progress = Progress(
            TextColumn("[bold]{task.description:<10}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[extra]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
        )
        self.tasks: dict[str, Any] = {}

    def __call__(self, stage: str, c: StageCounters) -> None:
        if stage not in self.tasks:
            self.tasks[stage] = self.progress.add_task(stage, total=c.units_total, extra="")
        extra = f"calls {c.provider_requests} cached {c.cache_hits} failed {c.units_failed} ${c.cost_usd:.4f}"
        self.progress.update(
            self.tasks[stage], completed=c.units_done + c.units_failed, total=c.units_total, extra=extra
        )


def run_and_report(config: str, opts: Any, no_progress: bool) -> int:
    """Run with progress bars, then print counters, artifacts and headlines; the exit status."""
    from punchline.cluster.driver import run

    console = Console(stderr=True)
    bars = None if no_progress else _Bars(console)
    if bars:
        bars.progress.start()
    try:
        record = run(config, opts, progress=bars)
    except KeyboardInterrupt as exc:  # Ctrl-C: the CLI prints how to resume exactly this run
        run_id = getattr(exc, "run_id", None) or opts.run_id
        if run_id:
            exc.resume_command = resume_command(config, opts, run_id)  # type: ignore[attr-defined]
        raise
    finally:
        if bars:
            bars.progress.stop()
    out = Console(width=max(Console().width, 110))
    out.print(f"run [bold]{record.run_id}[/bold]: {record.state}")
    _print_counters(out, with_batch_records(record)[0])
    store = record.services.store_url
    out.print(f"artifacts in {store}/{record.run_id}/artifacts/:")
    for name in record.artifacts:
        out.print(f"  {name}")
    _print_headlines(out, config, record)
    if record.failures:
        out.print(
            f"[red]{sum(len(v) for v in record.failures.values())} failed units[/red]; "
            f"see `punchline status {record.run_id}`, then `punchline retry-failed {record.run_id}`"
        )
        return 1
    return 0


def resume_command(config: str, opts: Any, run_id: str) -> str:
    """The command that resumes this run: the same config and the options that say where its state
    is (a --redis-url is shown with its password as ***)."""
    import shlex

    from punchline.schedulers.redis_client import redact_url

    parts = ["punchline", "run", config, "--run-id", run_id]
    env = os.environ
    if opts.runs_dir != env.get("PUNCHLINE_RUNS_DIR", "runs"):
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


def cmd_run(args: argparse.Namespace) -> int:
    return run_and_report(args.config, run_options(args), args.no_progress or args.verbose)


def _runs_dir(runs_dir: str) -> Path:
    if not runs_dir.strip():
        raise InputError("is empty; give a folder (default: runs)", field="--runs-dir")
    root = Path(runs_dir)
    if root.exists() and not root.is_dir():
        raise InputError("is a file, not a folder", file=runs_dir, field="--runs-dir")
    return root


def load_run_record(runs_dir: str, run_id: str, store: str | None = None) -> Any:
    """The run's record under the runs folder, else (a run submitted as a Ray job keeps its runs folder
    in the job's working dir on the head) the one the driver keeps in the store."""
    from punchline.cluster.config import check_run_id
    from punchline.cluster.driver import load_record

    check_run_id(run_id, field="run_id")  # a run id never names a path outside the runs folder
    path = _runs_dir(runs_dir) / run_id / "run.json"
    if path.is_file():
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise InputError(f"cannot read: {exc.strerror}", file=str(path)) from None
        return load_record(raw, str(path))
    if store:
        from punchline.data.stores import open_store

        found = open_store(store).get(f"{run_id}/run.json")
        if found is not None:
            return load_record(found, f"{store}/{run_id}/run.json")
    where = f"{runs_dir}/" + (f" or in {store}" if store else "")
    raise InputError(f"no run {run_id!r} under {where} (see `punchline runs`)", file=str(path))


def _ledger_client(record: Any) -> Any:
    """A client of the run's Redis; the password comes from this machine (file or environment)."""
    from punchline.schedulers.redis_client import connect, resolve_url

    services = record.services
    return connect(resolve_url(services.redis_url, services.redis_password_file))


def _live_counters(record: Any) -> tuple[dict[str, StageCounters], dict[str, int], dict[str, dict[str, str]]] | None:
    """Counters from the run's Redis if it is still up (a running run), else None."""
    try:
        from punchline.schedulers.ledger import Ledger

        ledger = Ledger(_ledger_client(record))
        ledger.ping()
        counters = {s: ledger.counters(record.run_id, s) for s in record.stages}
        leased = {s: ledger.leased_shards(record.run_id, s) for s in record.stages}
        failures = {s: f for s in record.stages if (f := ledger.failures(record.run_id, s))}
        return counters, leased, failures
    except Exception:
        return None


def _print_counters(console: Console, counters: dict[str, StageCounters], leased: dict[str, int] | None = None) -> None:
    console.print(_counters_table(counters, leased))


def _counters_table(counters: dict[str, StageCounters], leased: dict[str, int] | None = None) -> Table:
    table = Table(
        "stage",
        "units",
        "done",
        "leased",
        "failed",
        "calls",
        "cached",
        "tokens in/out",
        "cost $",
        "rate/s",
        "ETA",
    )
    now = time.time()
    for stage, c in counters.items():
        elapsed = max((c.updated_at or now) - (c.started_at or now), 1e-9)
        rate = c.units_done / elapsed if c.units_done else 0.0
        left = c.units_total - c.units_done - c.units_failed
        eta = f"{left / rate:.0f}s" if rate and left > 0 else "-"
        table.add_row(
            stage,
            str(c.units_total),
            str(c.units_done),
            str((leased or {}).get(stage, "-")),
            str(c.units_failed),
            str(c.provider_requests),
            str(c.cache_hits),
            f"{c.input_tokens}/{c.output_tokens}",
            f"{c.cost_usd:.4f}",
            f"{rate:.1f}",
            eta,
        )
    return table


class StatusView(msgspec.Struct, kw_only=True):
    """What ``status`` shows: live from the run's Redis while it runs, from its record afterwards."""

    run_id: str
    pipeline: str
    state: str
    live: bool
    counters: dict[str, StageCounters]
    leased: dict[str, int] | None
    failures: dict[str, dict[str, str]]
    usage: list[Any]
    batches: list[BatchRecord] = []  # provider batches of batch-mode providers, from the store


def _status(runs_dir: str, run_id: str, store: str | None = None) -> StatusView:
    record = load_run_record(runs_dir, run_id, store)
    live = _live_counters(record) if record.state == "running" else None
    if record.driver_gone():
        record.state = "interrupted"
    counters, leased, failures = live if live else (record.counters, None, record.failures)
    usage = record.usage
    if live:
        from punchline.schedulers.budget import Budget

        with contextlib.suppress(Exception):
            usage = Budget(_ledger_client(record), record.run_id, None).usage()
    counters, usage, batches = with_batch_records(record, counters, usage)
    return StatusView(
        run_id=record.run_id,
        pipeline=record.pipeline,
        state=record.state,
        live=live is not None,
        counters=counters,
        leased=leased,
        failures=failures,
        usage=usage,
        batches=batches,
    )


def with_batch_records(
    record: Any, counters: dict[str, StageCounters] | None = None, usage: list[Any] | None = None
) -> tuple[dict[str, StageCounters], list[Any], list[BatchRecord]]:
    """Counters and cost-per-model rows (the record's unless given) with every batch record of the run added
    (what batches cost is in their records, whichever driver ran them), and the records themselves."""
    from punchline.schedulers.batches import read_records, with_batch_costs

    batches: list[BatchRecord] = []
    with contextlib.suppress(PunchlineError):  # the store may be out of reach: status still shows the rest
        from punchline.data.stores import open_store

        batches = read_records(open_store(record.services.store_url), record.run_id)
    counters = record.counters if counters is None else counters
    usage = record.usage if usage is None else usage
    return (*with_batch_costs(counters, usage, batches), batches)


def _status_renderable(view: StatusView) -> Group:
    parts: list[Any] = [
        f"run [bold]{view.run_id}[/bold] ({view.pipeline}): {view.state}{' (live)' if view.live else ''}",
        _counters_table(view.counters, view.leased),
    ]
    if view.usage:
        table = Table("stage", "model", "tokens in", "tokens out", "cost $", title="cost per model")
        for row in view.usage:
            table.add_row(row.stage, row.model, str(row.input_tokens), str(row.output_tokens), f"{row.usd:.4f}")
        parts.append(table)
    if view.batches:
        from punchline.cluster.commands.batches import batch_table

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
    store = args.store or os.environ.get("PUNCHLINE_STORE")
    view = _status(args.runs_dir, args.run_id, store)
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
            view = _status(args.runs_dir, args.run_id, store)
            live.update(_status_renderable(view))
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    from punchline.cluster.commands._tables import print_whole, whole_table
    from punchline.cluster.driver import load_record

    root = _runs_dir(args.runs_dir)
    table = whole_table("run id", "pipeline", "state", "created", "units done", "cost $")
    for path in sorted(root.glob("*/run.json")):
        try:
            rec = load_record(path.read_bytes(), str(path))
        except (InputError, OSError) as exc:  # one bad record does not hide the others
            table.add_row(path.parent.name, "?", f"unreadable run.json: {str(exc)[:80]}", "", "", "")
            continue
        done = sum(c.units_done for c in rec.counters.values())
        cost = sum(c.cost_usd for c in with_batch_records(rec)[0].values())
        created = time.strftime("%Y-%m-%d %H:%M", time.gmtime(rec.created_at))
        state = rec.state
        if state == "running" and (rec.driver_gone() or _live_counters(rec) is None):
            state = "interrupted (resume with --run-id)"
        table.add_row(rec.run_id, rec.pipeline, state, created, str(done), f"{cost:.4f}")
    print_whole(table)  # whole run ids, to copy into status / --run-id
    return 0


def cmd_retry_failed(args: argparse.Namespace) -> int:
    from punchline.cluster.driver import RunOptions
    from punchline.data.stores import open_store
    from punchline.data.units import ShardOutput

    record = load_run_record(args.runs_dir, args.run_id)
    store = open_store(record.services.store_url)
    decoder = msgspec.msgpack.Decoder(ShardOutput)
    dropped = 0
    for stage in record.stages:
        prefix = f"{record.run_id}/stages/{stage}/shards/"
        for key in list(store.list(prefix)):
            raw = store.get(key)
            if raw is not None and any(r.error for r in decoder.decode(raw).results):
                store.delete(key)
                dropped += 1
    for stage in record.stages:  # later stages depend on the retried results
        if dropped:
            store.delete(f"{record.run_id}/stages/{stage}/manifest.json")
    Console(stderr=True).print(f"dropped {dropped} shards with failed units; resuming {record.run_id}")
    opts = RunOptions.from_env(run_id=record.run_id, runs_dir=args.runs_dir, store=record.services.store_url)
    return run_and_report(record.config_path, opts, args.no_progress)


def cmd_plan(args: argparse.Namespace) -> int:
    from punchline.cluster.config import load_config
    from punchline.cluster.run_checks import check_environment, check_run

    check_environment()
    estimates = check_run(load_config(args.config))  # the checks `run` makes before anything starts
    if args.json:
        print(msgspec.json.encode(estimates).decode())
        return 0
    from punchline.cluster.commands.batches import plan_cost_title

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


def _print_headlines(console: Console, config: str, record: Any) -> None:
    """The pipeline's own summary of a finished run (its ``headlines``, markdown)."""
    from rich.markdown import Markdown

    from punchline.cluster.config import load_config
    from punchline.cluster.registry import pipeline_of
    from punchline.data.stores import open_store

    cfg = load_config(config)
    for text in pipeline_of(cfg).headlines(cfg, open_store(record.services.store_url), record.run_id):
        console.print(Markdown(text))
