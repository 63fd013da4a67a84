"""Sub-command families of the punchline CLI (one module each), and the index of their commands.

The index is what ``punchline --help`` lists without importing a single command module (they import the
engine: about half a second on a quiet machine, several on a busy one); ``punchline CMD`` imports only the
module that registers CMD. Each module takes its commands' one-line help from here (:func:`summary`), so the
line is spelled once; ``tests/cluster/cli/test_cli.py`` checks that every module registers exactly its entries.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.metadata
import warnings
from typing import NamedTuple, TypeAlias

from punchline.data.plugins import COMMANDS

#: what ``build_parser`` hands each command family's ``register``: ``add_parser`` makes one sub-command
Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


class Command(NamedTuple):
    module: str  # the module that registers it: a name under punchline.cluster.cli.commands, or a pipeline's (dotted)
    help: str  # the line `punchline --help` shows


INDEX: dict[str, Command] = {
    "run": Command("run", "run (or resume) a pipeline from a TOML config"),
    "status": Command("runs", "progress, cost and failures of a run"),
    "plan": Command("run", "requests, tokens, cost and least wall time of a config, without calling"),
    "runs": Command("runs", "list runs under the runs folder"),
    "retry-failed": Command("run", "retry the failed units of a run"),
    "init": Command("init", "write runnable example configs and their sample data into a folder"),
    "submit": Command("jobs", "run (or resume) a pipeline as a Ray job on a cluster"),
    "jobs": Command("jobs", "punchline runs submitted to a cluster, with their state"),
    "logs": Command("jobs", "the output of a submitted run (its driver's log lines)"),
    "stop": Command("jobs", "stop a submitted run (resume it later with submit --run-id)"),
    "delete": Command("jobs", "delete a finished job from the cluster's job list"),
    "batches": Command("batches", "a run's provider batches: state, request counts, age; --cancel cancels them"),
    "fake-provider": Command("providers", "serve the simulated LLM provider (OpenAI + Anthropic APIs) on 127.0.0.1"),
    "settings": Command(
        "settings", "every config key and environment variable: type, default, range, description (markdown)"
    ),
}


#: the entry-point group a package declares its pipelines' commands in: ``<name> = "package.module:COMMANDS"``, a dict
#: of command -> (the module that registers it, its one-line help) in a module light enough for ``--help`` to import
COMMANDS_GROUP = COMMANDS.name


@functools.cache
def index() -> dict[str, Command]:
    """Every command: the engine's (:data:`INDEX`) and every installed package's (:data:`COMMANDS_GROUP`: the
    built-in pipelines' too); a plug-in's that cannot be read is left out with a warning, and never shadows ours."""
    out = dict(INDEX)
    for ep in importlib.metadata.entry_points(group=COMMANDS_GROUP):
        try:
            table = ep.load()
            found = {name: Command(module, line) for name, (module, line) in table.items()}
        except Exception as exc:  # a broken plug-in must not take the whole CLI down
            warnings.warn(f"punchline: commands of {ep.value!r} not loaded: {exc}", stacklevel=2)
            continue
        out.update({name: command for name, command in found.items() if name not in INDEX})
    return out


def module_path(module: str) -> str:
    """The importable name of a command module (``run`` -> ``punchline.cluster.cli.commands.run``)."""
    return module if "." in module else f"punchline.cluster.cli.commands.{module}"


def summary(name: str) -> str:
    """The one-line help of command ``name`` (what its module passes as ``help=``): the engine's and an entry
    point's commands alike, so a family's line is spelled once, where ``--help`` reads it."""
    return index()[name].help
