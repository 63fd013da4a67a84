"""No import cycle inside the package: the module graph, read from every file's imports, is a DAG.

Every import that runs counts, wherever it sits (module top or inside a function): an import hidden in a
function still ties two modules together, and a cycle there is one refactor away from an ImportError at
start-up. Imports under ``if TYPE_CHECKING:`` count too: they never run, but a circle closed through one is a
circle of concepts all the same (a Protocol naming the config type it is handed, which itself names the
Protocol, was the usual shape); the protocol a module needs lives below it. ``from a.b import c`` is an edge
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


def imported_modules(module: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that ``module`` imports, anywhere in its file (under ``if TYPE_CHECKING:`` too)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
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


def import_graph(root: Path) -> dict[str, set[str]]:
    modules = package_modules(root)
    known = set(modules)
    return {m: imported_modules(m, p, known) for m, p in modules.items()}


def test_the_package_has_no_import_cycle() -> None:
    graph = import_graph(ROOT)
    assert len(graph) > 100  # the walk found the package (through the layer links)
    found = cycles(graph)
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
    (pkg / "e.py").write_text("from pkg import d\n")  # d <-> e through a type-only import: a cycle too
    assert cycles(import_graph(pkg)) == [["pkg.a", "pkg.b"], ["pkg.d", "pkg.e"], ["pkg.sub", "pkg.sub.impl"]]
