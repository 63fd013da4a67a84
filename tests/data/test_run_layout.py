"""One place spells a run's store paths (``data/storage/run_layout.py``): no other module of the package does."""

from __future__ import annotations

import ast
from pathlib import Path

import punchline
from punchline.data.storage.run_layout import RunLayout
from punchline.data.units import plan_page_key, shard_key, stage_prefix
from tests.test_import_cycles import package_modules

ROOT = Path(punchline.__file__).parent
# as a path spells them (a message may name run.json in prose)
SPELLINGS = ("/run.json", "/manifest.json", "/plan.sha256", "/stages/", "/artifacts/", "/shards/", "/batches/")
WHOLE = ("run.json", "log.jsonl", "manifest.json", "plan.sha256", "spool", "sentinels")


def _strings(tree: ast.AST) -> list[tuple[int, str]]:
    """Every string the code builds (not docstrings): constants, and the literal parts of f-strings."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_no_module_but_the_layout_spells_a_runs_store_paths() -> None:
    found = []
    for path in sorted(package_modules(ROOT).values()):
        rel = path.relative_to(ROOT).as_posix()
        if rel.endswith("data/storage/run_layout.py"):
            continue
        for line, text in _strings(ast.parse(path.read_text())):
            hits = [s for s in SPELLINGS if s in text] + [w for w in WHOLE if text == w]
            if hits and not text.startswith(("http", "/v1")):
                found.append(f"{rel}:{line}: {text[:60]!r}")
    assert not found, "store paths spelled outside data/storage/run_layout.py:\n" + "\n".join(found)


def test_the_layouts_keys() -> None:
    layout = RunLayout("r1")
    assert layout.record == "r1/run.json" and layout.log == "r1/log.jsonl"
    assert layout.artifact("a/b.png") == "r1/artifacts/a/b.png" and layout.artifacts == "r1/artifacts/"
    assert layout.manifest("s") == "r1/stages/s/manifest.json" and layout.plan_digest("s") == "r1/stages/s/plan.sha256"
    assert shard_key("r1", "s", 7) == layout.shard("s", 7) == "r1/stages/s/shards/000007.msgpack"
    assert plan_page_key("r1", "s", 2) == layout.plan_page("s", 2) == "r1/stages/s/plan/000002.msgpack"
    assert stage_prefix("r1", "s") == layout.stage("s") and layout.shards("s") == "r1/stages/s/shards/"
    assert layout.local("/x/runs").record == Path("/x/runs/r1/run.json")
