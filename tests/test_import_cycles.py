"""No import cycle inside the package: the module graph, read from every file's imports, is a DAG.

Every import that runs counts, wherever it sits (module top or inside a function): an import hidden in a
function still ties two modules together, and a cycle there is one refactor away from an ImportError at
start-up. Imports under ``if TYPE_CHECKING:`` never run, so they do not count (a Protocol naming the config
type it is handed, which itself names the Protocol, is the usual shape). ``from a.b import c`` is an edge
to ``a.b.c`` when that is a module, else to ``a.b``. A cycle fails with every module on it named.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import punchline

ROOT = Path(punchline.__file__).parent


def package_modules(root: Path) -> dict[str, Path]:
    """Every module of the package under ``root`` by dotted name (walking the layer folders' links)."""
    found = {}
    for folder, _, files in os.walk(root, followlinks=True):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = Path(folder) / name
            parts = list(path.relative_to(root.parent).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imported_modules(module: str, path: Path, known: set[str], *, type_only_too: bool = False) -> set[str]:
    """The package's modules that ``module`` imports, anywhere in its file (``type_only_too``: those under
    ``if TYPE_CHECKING:`` as well)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    type_only = (
        set()
        if type_only_too
        else {
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for stmt in node.body
            for inner in ast.walk(stmt)
        }
    )
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in known:
                    out.add(sub)
                elif target in known:
                    out.add(target)
    out.discard(module)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def import_graph(root: Path, *, type_only_too: bool = False) -> dict[str, set[str]]:
    modules = package_modules(root)
    known = set(modules)
    return {m: imported_modules(m, p, known, type_only_too=type_only_too) for m, p in modules.items()}


def test_the_package_has_no_import_cycle() -> None:
    graph = import_graph(ROOT)
    assert len(graph) > 100  # the walk found the package (through the layer links)
    found = cycles(graph)
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_config_and_the_pipeline_protocol_meet_in_no_cycle_even_type_only() -> None:
    """What a config is (``run_config``) sits below the Pipeline protocol whose methods are handed one, and the
    loader (``config``, which asks the registry) above it: no circle among them, ``TYPE_CHECKING`` imports counted."""
    graph = import_graph(ROOT, type_only_too=True)
    engine = ("config", "run_config", "pipeline", "pipeline_base", "registry")
    mine = {f"punchline.cluster.{m}" for m in engine}
    found = [c for c in cycles(graph) if mine & set(c)]
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_a_cycle_is_found_and_named(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub.impl import thing\n")
    (pkg / "sub" / "impl.py").write_text("def thing():\n    from pkg.sub import helper\n")
    (pkg / "a.py").write_text("def f():\n    from pkg import b\n")
    (pkg / "b.py").write_text("from . import a\n")
    (pkg / "c.py").write_text("import pkg.a\n")  # imports a cycle's member without being on it
    (pkg / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import e\n")
    (pkg / "e.py").write_text("from pkg import d\n")  # d <-> e only through a type-only import: no cycle
    assert cycles(import_graph(pkg)) == [["pkg.a", "pkg.b"], ["pkg.sub", "pkg.sub.impl"]]
    assert ["pkg.d", "pkg.e"] in cycles(import_graph(pkg, type_only_too=True))


def test_the_driver_and_the_provider_interfaces_meet_in_no_cycle_even_type_only() -> None:
    """The driver and its checks share ``RunOptions`` from below both (``run_options``); a provider kind, the kinds'
    registry and the batch parts share the batch protocol from below all three (``batch_interface``): no circle
    among them, ``TYPE_CHECKING`` imports counted."""
    graph = import_graph(ROOT, type_only_too=True)
    mine = {
        "punchline.cluster.run.driver",
        "punchline.cluster.run.run_checks",
        "punchline.workers.provider",
        "punchline.workers.batch_provider",
        "punchline.workers.providers.registry",
    }
    assert mine <= set(graph)
    found = [c for c in cycles(graph) if mine & set(c)]
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)
    assert "punchline.cluster.run.driver" not in graph["punchline.cluster.run.run_checks"]
    assert "punchline.workers.batch_provider" not in graph["punchline.workers.provider"]
    assert "punchline.workers.batch_provider" not in graph["punchline.workers.providers.registry"]
