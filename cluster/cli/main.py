"""The ``punchline`` command line.

Each family of sub-commands lives in its own module under ``cluster/commands`` and registers itself
here; a :class:`~punchline.data.errors.PunchlineError` becomes one clear line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib
import os
import pkgutil
import sys
import threading
from collections.abc import Sequence
from importlib import metadata
from typing import Any, NoReturn

from punchline.cluster.cli import commands
from punchline.data.errors import PluginError, PunchlineError
from punchline.data.redaction import redact_text
from punchline.data.settings import DEBUG

FIRST_COMMANDS = ("run", "init", "jobs")  # the engine's own families lead `punchline --help`; then the rest by name


def command_modules() -> list[str]:
    """Every module under ``cluster/commands``, then every installed pipeline's command module (each registers its
    family of sub-commands)."""
    found = sorted(m.name for m in pkgutil.iter_modules(commands.__path__) if not m.name.startswith("_"))
    plugins = sorted({c.module for c in commands.index().values() if "." in c.module})
    return [*FIRST_COMMANDS, *(n for n in found if n not in FIRST_COMMANDS), *plugins]


class _Version(argparse.Action):
    """``--version``: the installed distribution's version, looked up only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        print(f"punchline {package_version()}")
        parser.exit()


def package_version() -> str:
    try:
        return metadata.version("punchline")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def build_parser(command: str | None = None, *, lazy: bool = False) -> argparse.ArgumentParser:
    """The parser of every command; with ``command`` (a name from the index) only its module is imported and
    registered, and with ``lazy`` and no command none is: the others stand as entries of the index (enough for
    ``--help`` and for a mistyped name)."""
    parser = argparse.ArgumentParser(
        prog="punchline",
        description="Fault-tolerant, resumable LLM data-collection and evaluation pipelines on Ray, Redis and S3.",
    )
    parser.add_argument("--version", action=_Version, help="print the installed version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    if command is not None:
        modules = [commands.index()[command].module]
    else:
        modules = [] if lazy else command_modules()
    registered: set[str] = set()
    for name in modules:
        module = importlib.import_module(commands.module_path(name))
        module.register(sub)
        registered |= set(sub.choices)
    order = {m: i for i, m in enumerate(command_modules())}
    for name, entry in sorted(commands.index().items(), key=lambda kv: order.get(kv[1].module, len(order))):
        if name not in registered:
            sub.add_parser(name, help=entry.help, add_help=False)
    return parser


def _command_of(argv: Sequence[str]) -> str | None:
    """The sub-command named in ``argv`` (the first word that is not an option), if the index knows it."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return word if word in commands.index() else None


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(_command_of(words), lazy=True)
    args = parser.parse_args(words)
    try:
        code = args.func(args)
    except PluginError as exc:  # the pipeline's own code failed: not ours to fix, so not a usage error either
        resume = getattr(exc, "resume_command", None)
        hint = f"; fix it, then resume with: {resume}" if resume else ""
        print(f"punchline: error: {_one_line(redact_text(str(exc)))}{hint}", file=sys.stderr)
        return 1
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


def entry() -> NoReturn:
    """The ``punchline`` script: :func:`main`, then the interpreter's own shutdown steps that matter (its other
    threads joined, the ``atexit`` handlers: logging's flush, a server's stop), then the end of the process.
    What it skips is tearing down the objects a run leaves (300,000 of them after the demo, with matplotlib and
    the SDKs loaded): 1-1.5 s after every run, while every file was flushed and closed already."""
    code = main()
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed pipe: nothing more to say anyway
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()
