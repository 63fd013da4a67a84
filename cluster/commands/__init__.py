"""Sub-command families of the punchline CLI (one module each), and the index of their commands.

The index is what ``punchline --help`` lists without importing a single command module (they import the
engine: about half a second on a quiet machine, several on a busy one); ``punchline CMD`` imports only the
module that registers CMD. Each module takes its commands' one-line help from here (:func:`summary`), so the
line is spelled once; ``tests/cluster/test_cli.py`` checks that every module registers exactly its entries.
"""

from __future__ import annotations

import argparse
from typing import NamedTuple, TypeAlias

#: what ``build_parser`` hands each command family's ``register``: ``add_parser`` makes one sub-command
Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


class Command(NamedTuple):
    module: str  # the module under punchline.cluster.commands that registers it
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
    "humor": Command("humor", "Humor benchmark (MERA): validate data, score answers, run a model"),
    "fake-provider": Command("providers", "serve the simulated LLM provider (OpenAI + Anthropic APIs) on 127.0.0.1"),
    "import-legacy": Command(
        "providers", "load upstream checkpoints (completions, verdicts, cloze answers) into the response cache"
    ),
    "puns": Command("puns", "Puns 205: validate, rank (tiers), build cloze tests, score cloze answers"),
    "settings": Command(
        "settings", "every config key and environment variable: type, default, range, description (markdown)"
    ),
    "view": Command("view", "a local web page: runs, a run's progress and artifacts, every unit's answers"),
}


def summary(name: str) -> str:
    """The one-line help of command ``name`` (what its module passes as ``help=``)."""
    return INDEX[name].help
