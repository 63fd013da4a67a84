"""Imports sit at module top, so a module's first lines show everything it depends on.

An import inside a function hides an edge of the module graph (three import cycles once lived
there). The one reason to keep one is start-up time: ``punchline --help``, ``runs``, ``status`` and
``plan`` import every command module, and the heavy optional libraries below take seconds to import.
So a function-level import must name one of them (or a module of ours that imports one at its top),
and say so on its line with ``# lazy: <why>``. Anything else fails here with the file and line named.
"""

from __future__ import annotations

import ast
from pathlib import Path

import punchline
from tests.test_import_cycles import package_modules

ROOT = Path(punchline.__file__).parent

# The libraries an import may wait for (first part of the module name), and why.
HEAVY = {
    "ray": "seconds to import; only a run on the engine needs it",
    "matplotlib": "a second to import; only a plot needs it",
    "boto3": "a second to import; only an S3 store needs it",
    "botocore": "as boto3",
    "openai": "the provider SDKs take seconds to import; only a provider call needs one",
    "anthropic": "as openai",
    "pyarrow": "a second to import; only Parquet input or output needs it",
    "jinja2": "only a prompt template needs it",
}

# Our own modules that import a heavy library at their top: importing one of them is importing it.
HEAVY_OURS = {
    "punchline.pipelines.puns.data.plots": "matplotlib",
    "punchline.data.stores.s3": "boto3",
    "punchline.workers.providers.openai_compat": "openai",
    "punchline.workers.providers.batch_openai": "openai",
    "punchline.workers.providers.anthropic": "anthropic",
    "punchline.workers.providers.batch_anthropic": "anthropic",
}

# ``import punchline`` must not import the engine: the package's root loads its Python API on first use
# (PEP 562 ``__getattr__``), as every ``import punchline.<layer>`` runs the root first.
ROOT_API = ("__init__.py", "punchline.api")

# Function-level imports still waiting to move (none: keep it empty; never add one).
PENDING: dict[str, set[str]] = {}


def function_imports(path: Path) -> list[tuple[int, str, str]]:
    """``(line, module, source text)`` of every import inside a function of the file."""
    text = path.read_text()
    lines = text.splitlines()
    found: list[tuple[int, str, str]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom) and in_function:
                source = "\n".join(lines[child.lineno - 1 : child.end_lineno])
                if isinstance(child, ast.Import):
                    found.extend((child.lineno, alias.name, source) for alias in child.names)
                else:
                    found.append((child.lineno, "." * child.level + (child.module or ""), source))
            visit(child, in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef))

    visit(ast.parse(text, filename=str(path)), False)
    return found


def may_wait(module: str) -> bool:
    return module.partition(".")[0] in HEAVY or module in HEAVY_OURS


def misplaced(root: Path, pending: dict[str, set[str]]) -> list[str]:
    """Every function-level import under ``root`` that is neither a marked heavy one nor pending."""
    bad = []
    for path in sorted(package_modules(root).values()):
        rel = path.relative_to(root).as_posix()
        for line, module, source in function_imports(path):
            where = f"{rel}:{line}: {module}"
            if module in pending.get(rel, set()) or (rel, module) == ROOT_API:
                continue
            if not may_wait(module):
                bad.append(f"{where}: move it to the module's top (only {', '.join(HEAVY)} may wait)")
            elif "# lazy:" not in source:
                bad.append(f"{where}: say why it waits with a `# lazy: <why>` comment on its line")
    return bad


def test_imports_sit_at_module_top() -> None:
    assert len(package_modules(ROOT)) > 100  # the walk sees the package through the layer links
    bad = misplaced(ROOT, PENDING)
    assert bad == [], "function-level imports:\n" + "\n".join(bad)


def test_our_heavy_modules_are_heavy() -> None:
    """A module of ours may wait only while it imports its heavy library at its top."""
    modules = package_modules(ROOT)
    for name, library in HEAVY_OURS.items():
        tree = ast.parse(modules[name].read_text())
        tops = {a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names}
        tops |= {n.module or "" for n in tree.body if isinstance(n, ast.ImportFrom)}
        assert any(t.partition(".")[0] == library for t in tops), f"{name} no longer imports {library} at its top"


def test_the_check_finds_a_hidden_import(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import json\n")  # at the top: fine
    (pkg / "a.py").write_text(
        "def f():\n"
        "    import json\n"  # hidden: reported
        "    import ray  # lazy: seconds to import\n"  # marked heavy: fine
        "    import matplotlib\n"  # heavy but unmarked: reported
        "    class C:\n"
        "        def g(self):\n"
        "            from pkg import b\n"  # deep inside: reported
        "    import socket\n"  # pending: fine
    )
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import json\n")
    bad = misplaced(pkg, {"a.py": {"socket"}})
    assert [b.split(": ")[0:2] for b in bad] == [["a.py:2", "json"], ["a.py:4", "matplotlib"], ["a.py:7", "pkg"]]
    assert "# lazy:" in bad[1]
