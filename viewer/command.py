"""``punchline view [RUN_ID]``: a local web page over the runs folder and the store (runs, a run, its units).

The server is :mod:`punchline.viewer.server`; this module parses, starts it and prints its URL.
"""

from __future__ import annotations

import argparse

from punchline.cluster.cli.commands import Subcommands, summary
from punchline.cluster.records.run_record import check_run_id
from punchline.data.errors import InputError
from punchline.data.settings import RUNS_DIR_HELP, runs_dir
from punchline.viewer.server import LOOPBACK, ViewServer, ViewSettings, new_token


def register(sub: Subcommands) -> None:
    p = sub.add_parser("view", help=summary("view"))
    p.add_argument("run_id", nargs="?", help="open this run (also one only the store has)")
    p.add_argument("--runs-dir", help=RUNS_DIR_HELP)
    p.add_argument("--store", help="the checkpoint store: a folder or s3://bucket/prefix (default: each run's own)")
    p.add_argument("--port", type=int, default=0, help="port to listen on (default: a free one)")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on; anything but 127.0.0.1 also needs --allow-remote, and pages then ask for a token",
    )
    p.add_argument("--allow-remote", action="store_true", help="allow --host beyond this machine (with a token)")
    p.set_defaults(func=cmd_view)


def cmd_view(args: argparse.Namespace) -> int:
    if args.run_id:
        check_run_id(args.run_id, field="run_id")
    if not 0 <= args.port <= 65535:
        raise InputError(f"{args.port} is not a port (0-65535)", field="--port")
    remote = args.host not in LOOPBACK
    if remote and not args.allow_remote:
        raise InputError("listening beyond 127.0.0.1 needs --allow-remote (pages then ask for a token)", field="--host")
    settings = ViewSettings(
        runs_dir=runs_dir(args.runs_dir),
        store=args.store,
        run_id=args.run_id,
        host=args.host,
        port=args.port,
        token=new_token() if remote else None,
    )
    server = ViewServer(settings)
    print(f"punchline view: {server.url}  (Ctrl-C stops it)", flush=True)
    server.serve_until_interrupted()
    return 0
