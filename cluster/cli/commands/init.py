"""``punchline init [DIR]``: runnable example configs and their sample data, from the installed package."""

from __future__ import annotations

import argparse

from punchline.cluster.cli.commands import summary
from punchline.cluster.cli.shared import Subcommands
from punchline.cluster.cli.starter import CONFIGS, write_starter


def register(sub: Subcommands) -> None:
    p = sub.add_parser(
        "init",
        help=summary("init"),
        description="Write configs/{" + ",".join(n.removesuffix(".toml") for n in CONFIGS) + "}.toml and the "
        "sample data they read (data/samples/) into DIR, so `punchline run configs/demo.toml` works there "
        "with nothing else installed: the offline simulated provider, a local ledger and a local runs folder. "
        "Files already there are kept unless --force.",
    )
    p.add_argument("dir", nargs="?", default=".", help="the folder to write into (default: the current one)")
    p.add_argument("--force", action="store_true", help="overwrite files that are already there")
    p.set_defaults(func=cmd_init)


def cmd_init(args: argparse.Namespace) -> int:
    starter = write_starter(args.dir, force=args.force)
    for rel in starter.written:
        print(f"wrote {rel}")
    for rel in starter.kept:
        print(f"kept  {rel} (already there; --force overwrites)")
    print(f"next: {starter.next_command}")
    print("      (then try configs/prompts_demo.toml, configs/humor_demo.toml, configs/curate_demo.toml;")
    print("       `punchline plan CONFIG` prices a config without calling)")
    return 0
