"""The ``punchline`` command line.

Each family of sub-commands lives in its own module under ``cluster/commands`` and registers itself
here; a :class:`~punchline.data.errors.PunchlineError` becomes one clear line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from punchline.data.errors import PunchlineError

COMMAND_MODULES = ("run", "puns", "providers", "humor", "batches")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="punchline",
        description="Fault-tolerant, resumable LLM data-collection and evaluation pipelines "
        "(Puns 205, Humor) on Ray, Redis and S3.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    import importlib

    for name in COMMAND_MODULES:
        module = importlib.import_module(f"punchline.cluster.commands.{name}")
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = args.func(args)
    except PunchlineError as exc:
        print(f"punchline: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("punchline: interrupted; everything committed so far is kept (re-run to resume)", file=sys.stderr)
        return 130
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
