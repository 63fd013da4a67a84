"""The package's layers, read from its own imports: every import goes downwards (or sideways).

commands -> pipelines/driver -> coordinator -> workers -> schedulers -> data. A module may import
its own floor and the floors below it; an import of a higher floor fails this test with the file,
the line and both floors named, so a shortcut that would tangle the layers is caught in review.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

import punchline

ROOT = Path(punchline.__file__).parent

# (module prefix, floor): the longest matching prefix wins.
FLOORS: dict[str, int] = {
    "punchline": 5,  # the package itself is its Python API (punchline.run), so the top floor
    "punchline.api": 5,
    "punchline.data": 0,
    "punchline.schedulers": 1,
    "punchline.workers": 2,
    "punchline.services": 2,  # the runs folder's embedded ledger and local Ray head, and their keepers
    "punchline.cluster": 3,  # config, ray_runtime, redis_server, coordinator, pipeline (the Stage interface)
    "punchline.cluster.run.driver": 4,
    "punchline.cluster.run.run_services": 4,  # the services one run holds open (the driver opens them)
    "punchline.cluster.run.planner": 4,
    "punchline.cluster.run.run_checks": 4,
    "punchline.pipelines": 4,
    "punchline.viewer": 4,  # `punchline view`: pages over a run's store files
    "punchline.viewer.command": 5,
    "punchline.pipelines.puns.commands": 5,  # a pipeline's own command family (`punchline puns ...`)
    "punchline.pipelines.humor.commands": 5,
    "punchline.cluster.records.runs": 4,  # a run's record and the list of runs (commands print them)
    "punchline.cluster.records.status": 4,
    "punchline.cluster.records.retry_failed": 4,
    "punchline.cluster.records.run_batches": 4,  # a run's provider batches, and cancelling them
    "punchline.cluster.cli.shared": 5,  # what several command families share (commands never import each other)
    "punchline.cluster.cli.commands": 5,
    "punchline.cluster.cli.main": 5,
    "punchline.__main__": 5,
}
NAMES = {0: "data", 1: "schedulers", 2: "workers", 3: "coordinator", 4: "pipelines/driver", 5: "commands"}


def floor_of(module: str) -> int:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in FLOORS:
            return FLOORS[prefix]
    raise KeyError(module)


def modules() -> list[tuple[str, Path]]:
    found = []
    # The layer folders are linked into punchline/: walk through the links, as the import system does.
    paths = [Path(d) / f for d, _, files in os.walk(ROOT, followlinks=True) for f in files if f.endswith(".py")]
    for path in sorted(paths):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        found.append((".".join(parts), path))
    return found


def imports_of(module: str, path: Path) -> list[tuple[int, str]]:
    """Every ``punchline.*`` module imported anywhere in the file (also inside functions and
    ``TYPE_CHECKING`` blocks: a type-only upward import still ties the layers together)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith("punchline")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target.startswith("punchline"):
                out.append((node.lineno, target))
    return out


def test_every_import_goes_downwards() -> None:
    found = modules()
    assert len(found) > 60, "the walk found the package's modules"
    upward = []
    for module, path in found:
        mine = floor_of(module)
        for line, target in imports_of(module, path):
            theirs = floor_of(target)
            if theirs > mine:
                where = f"{path.relative_to(ROOT)}:{line}"
                upward.append(f"{where}: {module} ({NAMES[mine]}) imports {target} ({NAMES[theirs]})")
    assert upward == [], "upward imports:\n" + "\n".join(upward)


def test_command_modules_do_not_import_each_other() -> None:
    """A command family parses, calls and prints; what two families share lives in cluster/cli/shared.py
    (or a ``_``-named helper module beside them, which the CLI does not register as a command)."""
    prefix = "punchline.cluster.cli.commands."
    tangled = [
        f"{path.relative_to(ROOT)}:{line}: imports {target}"
        for module, path in modules()
        if module.startswith(prefix)
        for line, target in imports_of(module, path)
        if target.startswith(prefix) and target != module and not target.removeprefix(prefix).startswith("_")
    ]
    assert tangled == []


def test_command_modules_pass_no_any() -> None:
    """What a command hands on and gets back is typed (a struct, ``Subcommands``), never ``typing.Any``."""
    untyped = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for module, path in modules()
        if module.startswith("punchline.cluster.cli.commands.")
        for node in ast.walk(ast.parse(path.read_text()))
        if (isinstance(node, ast.Name) and node.id == "Any") or (isinstance(node, ast.Attribute) and node.attr == "Any")
    ]
    assert untyped == [], "Any in command modules:\n" + "\n".join(untyped)


def test_the_walk_sees_an_upward_import(tmp_path: Path) -> None:
    """The checker itself: a data module importing a worker is reported."""
    bad = tmp_path / "bad.py"
    bad.write_text("from punchline.workers.provider import Provider\n")
    (target,) = imports_of("punchline.data.bad", bad)
    assert floor_of(target[1]) > floor_of("punchline.data.bad")


@pytest.mark.parametrize("name", ["cluster", "workers", "schedulers", "data", "pipelines", "services", "viewer"])
def test_layers_are_not_top_level_packages(name: str) -> None:
    """Installed, the project is one package: the layer folders are reachable only as ``punchline.<name>``."""
    import subprocess
    import sys

    probe = (
        "import importlib.util, sys; sys.path = [p for p in sys.path if p not in ('', '.')];"
        f" spec = importlib.util.find_spec({name!r});"
        " origin = getattr(spec, 'origin', None) or '';"
        " sys.exit(1 if 'punchline' in origin or (spec and '/site-packages/' not in origin) else 0)"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd="/", capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"`import {name}` reaches the project: {done.stdout}{done.stderr}"


PIPELINES = "punchline.pipelines"  # the built-in pipelines: one package each, found through entry points
# imports between two pipelines, each with its reason: curate writes Puns' input file (puns_205.json), so its records
# are Puns' schema and it checks the file with Puns' own reader
BETWEEN_PIPELINES = {
    ("punchline.pipelines.curate", "punchline.pipelines.puns.data.schemas"),
    ("punchline.pipelines.curate", "punchline.pipelines.puns.data.puns_io"),
}


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _pipeline_of(module: str) -> str | None:
    """``punchline.pipelines.<name>`` of a module inside a built-in pipeline's package, else None."""
    parts = module.split(".")
    return ".".join(parts[:3]) if _within(module, PIPELINES) and len(parts) > 2 else None


def test_the_engine_imports_no_pipeline() -> None:
    """Each built-in pipeline is one package under ``pipelines/`` (its stages, data code, simulator hooks, commands
    and report), registered through the same entry points a plug-in uses. Nothing outside ``pipelines/`` imports
    one (not even under ``TYPE_CHECKING``), and one pipeline imports another only where ``BETWEEN_PIPELINES`` says
    why: a workload's logic cannot leak into the engine, or into another workload, by an import."""
    found = modules()
    assert any(_pipeline_of(m) for m, _ in found), "the walk found the pipelines' packages"
    leaks = []
    for module, path in found:
        own = _pipeline_of(module)
        for line, target in imports_of(module, path):
            theirs = _pipeline_of(target)
            if theirs is None or theirs == own or (own, target) in BETWEEN_PIPELINES:
                continue
            leaks.append(f"{path.relative_to(ROOT)}:{line}: {module} imports {target}")
    assert leaks == [], "a pipeline imported outside its package:\n" + "\n".join(leaks)
