"""The ``punchline`` command line.

Each family of sub-commands lives in its own module under ``cluster/commands`` and registers itself
here; a :class:`~punchline.data.errors.PunchlineError` becomes one clear line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

from punchline.cluster import commands
from punchline.data.errors import PunchlineError
from punchline.data.settings import DEBUG
from punchline.workers.logs import redact_text

FIRST_COMMANDS = ("run", "jobs")  # the engine's own families lead `punchline --help`; then the rest by name


def command_modules() -> list[str]:
    """Every module under ``cluster/commands`` (each registers its family of sub-commands)."""
    found = sorted(m.name for m in pkgutil.iter_modules(commands.__path__) if not m.name.startswith("_"))
    return [*FIRST_COMMANDS, *(n for n in found if n not in FIRST_COMMANDS)]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="punchline",
        description="Fault-tolerant, resumable LLM data-collection and evaluation pipelines on Ray, Redis and S3.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in command_modules():
        module = importlib.import_module(f"punchline.cluster.commands.{name}")
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = args.func(args)
    except PunchlineError as exc:
        print(f"punchline: error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        resume = getattr(exc, "resume_command", None)
        hint = f"resume with: {resume}" if resume else "re-run to resume"
        print(f"punchline: interrupted; everything committed so far is kept ({hint})", file=sys.stderr)
        return 130
    except OSError as exc:  # a path we were given cannot be read or written (permissions, a full disk)
        where = f": {exc.filename}" if exc.filename else ""
        print(f"punchline: error: {exc.strerror or type(exc).__name__}{where}", file=sys.stderr)
        return 2
    except Exception as exc:  # a bug: still one line (the traceback goes to the log with PUNCHLINE_DEBUG=1)
        if _debug():
            raise
        print(
            f"punchline: internal error: {type(exc).__name__}: {_one_line(redact_text(str(exc)))[:300]} "
            "(set PUNCHLINE_DEBUG=1 to see where)",
            file=sys.stderr,
        )
        return 1
    return int(code or 0)


def _debug() -> bool:
    """``PUNCHLINE_DEBUG``: a value that is not a boolean still asks for the traceback."""
    try:
        return DEBUG.get()
    except PunchlineError:
        return True


def _one_line(text: str) -> str:
    return " ".join(text.split())


if __name__ == "__main__":
    sys.exit(main())
