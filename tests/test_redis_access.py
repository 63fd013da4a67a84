"""Redis is spoken to from ``schedulers/`` only: no module outside it imports a Redis client library or speaks
the protocol itself; the rest of the engine calls a ``schedulers`` module that says what it does.

Why: what may be sent to the ledger is an allow-list (``schedulers/server/ledger_access.py``), its keys are spelled in
one module (``schedulers/keys.py``) and its scripts in ``schedulers/lua/``; a command sent from elsewhere is one
nobody reviewing those would see. The layers above hold a client only to hand it to this layer's classes, and
name its type and errors by this layer's names (``redis_client.LedgerClient``, ``ClientError``). Read from the
code: an ``import redis`` (``redis.asyncio``, ``from redis...``), a RESP request spelled by hand (``*<n>\\r\\n``,
``$<n>\\r\\n``), or a client's script or raw-command entry points (``register_script``, ``execute_command``)
outside ``punchline.schedulers`` fail this test with the file and line. No exception is needed today.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import punchline

ROOT = Path(punchline.__file__).parent
LAYER = "punchline.schedulers"
EXCEPTIONS: dict[str, str] = {}  # module -> why it may speak to Redis itself (none)
# an array or bulk-string header as a request spells it: *3\r\n, $%d\r\n, f"*{n}\r\n" (read as *0\r\n), "${}\r\n"
RESP = re.compile(r"^[*$](\d+|%d|\{\w*\})\r\n|\r\n\$(\d+|%d|\{\w*\})\r\n")
RAW_CALLS = {"register_script", "execute_command"}


def modules() -> list[tuple[str, Path]]:
    """Every module of the package by dotted name (walking the layer folders' links, as the import system does)."""
    found = []
    for folder, _, files in os.walk(ROOT, followlinks=True):
        for name in files:
            if name.endswith(".py"):
                path = Path(folder) / name
                parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
                if parts[-1] == "__init__":
                    parts.pop()
                found.append((".".join(parts), path))
    return sorted(found)


def _text_parts(node: ast.AST) -> list[str]:
    """A constant's text, or the literal parts of an f-string (``f"*{n}\\r\\n"`` reads as ``*`` and ``\\r\\n``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes):
        value = node.value
        return [value.decode("latin-1") if isinstance(value, bytes) else value]
    if isinstance(node, ast.JoinedStr):
        return ["".join(p.value if isinstance(p, ast.Constant) else "0" for p in node.values)]
    return []


def redis_talk(path: Path) -> list[tuple[int, str]]:
    """(line, what) for every way ``path`` speaks to Redis itself."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names if a.name.split(".")[0] == "redis"]
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "redis":
            found.append((node.lineno, f"from {node.module} import ..."))
        elif isinstance(node, ast.Attribute) and node.attr in RAW_CALLS:
            found.append((node.lineno, f".{node.attr}"))
        else:
            found += [(node.lineno, f"RESP {text[:20]!r}") for text in _text_parts(node) if RESP.search(text)]
    return found


def test_no_module_outside_schedulers_speaks_to_redis() -> None:
    found = modules()
    assert len(found) > 100, "the walk found the package's modules"
    outside = [
        f"{path.relative_to(ROOT)}:{line}: {module}: {what}"
        for module, path in found
        if module != LAYER and not module.startswith(f"{LAYER}.") and module not in EXCEPTIONS
        for line, what in redis_talk(path)
    ]
    assert outside == [], "Redis spoken to outside schedulers/ (call a schedulers module instead):\n" + "\n".join(
        outside
    )


def test_schedulers_is_where_redis_is_spoken_to() -> None:
    """The check finds what it looks for where it is allowed: the layer's client, its scripts, the keeper's socket."""
    mine = {module: redis_talk(path) for module, path in modules() if module.startswith(f"{LAYER}.")}
    assert any(what.startswith("import redis") for talk in mine.values() for _, what in talk)
    assert any(what.startswith("RESP") for _, what in mine[f"{LAYER}.server.server_info"])
    assert any(what == ".register_script" for _, what in mine[f"{LAYER}.run_claim"])


def test_the_check_sees_each_way_of_speaking(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import redis.asyncio\n"
        "from redis.exceptions import ResponseError\n"
        "def f(client, n, sock):\n"
        "    client.register_script('return 1')\n"
        "    client.execute_command('FLUSHALL')\n"
        "    sock.sendall(b'*1\\r\\n$4\\r\\nPING\\r\\n')\n"
        "    sock.sendall(b'$%d\\r\\n%s\\r\\n' % (n, n))\n"
        "    return f'*{n}\\r\\n'\n"
    )
    assert sorted(line for line, _ in redis_talk(bad)) == [1, 2, 4, 5, 6, 7, 8]
    fine = tmp_path / "fine.py"
    fine.write_text("import redis_like\nheaders = b'Content-Type: text/plain\\r\\n\\r\\n'\nredis = 'a word'\n")
    assert redis_talk(fine) == []
