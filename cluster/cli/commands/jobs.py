"""``punchline submit | jobs | logs | stop``: runs as Ray jobs on a cluster (through its dashboard).

The work is done by :mod:`punchline.cluster.ray_cluster.ray_jobs`; this module parses and prints.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

from punchline.cluster.cli.commands import summary
from punchline.cluster.cli.commands._tables import print_whole, whole_table
from punchline.cluster.cli.shared import Subcommands, port
from punchline.cluster.config import load_config
from punchline.cluster.ray_cluster import ray_jobs
from punchline.cluster.run.driver import new_run_id

ADDRESS_HELP = (
    "the cluster's dashboard, e.g. http://HEAD:8265 (env PUNCHLINE_JOBS_ADDRESS or RAY_API_SERVER_ADDRESS; "
    "default http://127.0.0.1:8265, e.g. through `kubectl port-forward` or `ray dashboard`)"
)


def register(sub: Subcommands) -> None:
    _register_submit(sub)
    _register_job_commands(sub)


def _register_submit(sub: Subcommands) -> None:
    """``punchline submit``: a run as a Ray job, with what the job carries and may set."""
    s = sub.add_parser(
        "submit",
        help=summary("submit"),
        description="Submit `punchline run CONFIG` as a Ray job: the driver runs on the head node, managed by Ray, "
        "so it outlives this terminal. The job carries the config and the input files it names (nothing else from "
        "this folder, no environment, no secrets); the code is the punchline installed on the cluster. The store "
        "must be one every node sees (--store s3://bucket/prefix or a shared mount; env PUNCHLINE_STORE on the "
        "nodes). Prints the job id and the run id; submit the same config with --run-id RUN to resume.",
    )
    s.add_argument("config", help="run config (TOML)")
    s.add_argument("--address", help=ADDRESS_HELP)
    s.add_argument("--run-id", help="resume this run (or name a new one)")
    s.add_argument("--store", help="checkpoint store every node sees: s3://bucket/prefix or a shared folder")
    s.add_argument("--redis-url", help="the ledger, without a password (else PUNCHLINE_REDIS_URL on the nodes)")
    s.add_argument("--max-workers", type=int, help="ask the autoscaler for up to this many worker nodes")
    s.add_argument("--max-cost-usd", type=float, help="stop scheduling new units before this budget is exceeded")
    s.add_argument("--offline", action="store_true", help="never call a provider: cache misses fail")
    s.add_argument("--python", default="python", help="the interpreter on the cluster (default: python)")
    s.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set one of punchline's own variables for this job (repeatable), e.g. PUNCHLINE_S3_OUTAGE_S=1200; "
        "only PUNCHLINE_S3_*, PUNCHLINE_RATE_*, PUNCHLINE_MAX_WORKERS, PUNCHLINE_WORKER_NODE_CPUS, "
        "PUNCHLINE_STORE, PUNCHLINE_DEBUG: never a secret (Ray stores and shows a job's environment)",
    )
    s.add_argument(
        "--entrypoint-num-cpus", type=float, help="CPUs Ray reserves for the job's driver (default: none reserved)"
    )
    s.add_argument("--submission-id", help="the job id (default: punchline-<run id>-<random>)")
    s.add_argument(
        "--metrics-port",
        type=port,
        help="the job's driver serves the run's Prometheus metrics on the head's 127.0.0.1:PORT/metrics",
    )
    s.set_defaults(func=cmd_submit)


def _register_job_commands(sub: Subcommands) -> None:
    """``punchline jobs | logs | stop | delete``: the Ray jobs already submitted."""
    j = sub.add_parser("jobs", help=summary("jobs"))
    j.add_argument("--address", help=ADDRESS_HELP)
    j.add_argument("--all", action="store_true", help="every submitted Ray job, not only punchline runs")
    j.set_defaults(func=cmd_jobs)

    lg = sub.add_parser("logs", help=summary("logs"))
    lg.add_argument("job_id")
    lg.add_argument("--address", help=ADDRESS_HELP)
    lg.add_argument(
        "-f", "--follow", action="store_true", help="stream until the job ends; exit 0 only if it succeeded"
    )
    lg.set_defaults(func=cmd_logs)

    st = sub.add_parser(
        "stop",
        help=summary("stop"),
        description="Stop a job: its driver gets SIGTERM, its workers end with it; everything committed is kept.",
    )
    st.add_argument("job_id")
    st.add_argument("--address", help=ADDRESS_HELP)
    st.add_argument("--wait", action="store_true", help="wait until the job has stopped")
    st.set_defaults(func=cmd_stop)

    d = sub.add_parser(
        "delete",
        help=summary("delete"),
        description="Delete a job that has ended (SUCCEEDED, FAILED or STOPPED) and Ray's record of it; the run's "
        "store (artifacts, run.json, log.jsonl) is kept. A running job must be stopped first.",
    )
    d.add_argument("job_id")
    d.add_argument("--address", help=ADDRESS_HELP)
    d.set_defaults(func=cmd_delete)


def cmd_submit(args: argparse.Namespace) -> int:
    address = ray_jobs.jobs_address(args.address)
    opts = ray_jobs.SubmitOptions(
        store=args.store,
        redis_url=args.redis_url,
        max_workers=args.max_workers,
        max_cost_usd=args.max_cost_usd,
        offline=args.offline,
        python=args.python,
        env=ray_jobs.parse_env(args.env),
        entrypoint_num_cpus=args.entrypoint_num_cpus,
        submission_id=args.submission_id,
        metrics_port=args.metrics_port,
    )
    ray_jobs.check_submit_options(opts)
    run_id = args.run_id or new_run_id(load_config(args.config))
    with tempfile.TemporaryDirectory(prefix="punchline-job-") as staging:
        job_id = ray_jobs.submit(address, args.config, run_id, opts, staging=Path(staging))
    print(job_id)
    err = Console(stderr=True)
    err.print(f"submitted run [bold]{run_id}[/bold] as job [bold]{job_id}[/bold] to {address}")
    err.print(f"  watch:  punchline logs {job_id} --follow")
    err.print(f"  stop:   punchline stop {job_id}")
    err.print(f"  resume: punchline submit {args.config} --run-id {run_id} …(same options)")
    return 0


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts)) if ts else "-"


def cmd_jobs(args: argparse.Namespace) -> int:
    rows = ray_jobs.list_jobs(ray_jobs.jobs_address(args.address), everything=args.all)
    table = whole_table("job id", "run id", "status", "started (UTC)", "ended (UTC)", "message", box=None)
    for row in rows:
        message = ray_jobs.shorten(row.message)  # one line per job; `punchline logs JOB` shows the rest
        table.add_row(row.job_id, row.run_id, row.status, _when(row.start_time_s), _when(row.end_time_s), message)
    print_whole(table)
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    address = ray_jobs.jobs_address(args.address)
    if not args.follow:
        sys.stdout.write(ray_jobs.logs(address, args.job_id))
        return 0

    async def stream() -> None:
        async for chunk in ray_jobs.follow(address, args.job_id):
            sys.stdout.write(chunk)
            sys.stdout.flush()

    asyncio.run(stream())
    state = ray_jobs.wait_until_ended(address, args.job_id)
    Console(stderr=True).print(f"job {args.job_id}: {state}")
    return 0 if state == "SUCCEEDED" else 1


def cmd_stop(args: argparse.Namespace) -> int:
    address = ray_jobs.jobs_address(args.address)
    ray_jobs.stop(address, args.job_id)
    state = ray_jobs.wait_until_ended(address, args.job_id) if args.wait else ray_jobs.status(address, args.job_id)
    Console(stderr=True).print(f"job {args.job_id}: {state} (resume with `punchline submit CONFIG --run-id RUN`)")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    ray_jobs.delete(ray_jobs.jobs_address(args.address), args.job_id)
    Console(stderr=True).print(f"job {args.job_id}: deleted (the run's store is kept)")
    return 0
