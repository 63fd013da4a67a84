"""The Lua scripts live in ``schedulers/lua/*.lua``: every file is run by some module, each one (with its
libraries) compiles in Redis, and the package ships them (``pyproject.toml``'s package data)."""

from __future__ import annotations

import ast
import fnmatch
import os
import tomllib
from importlib import resources
from pathlib import Path

import redis

import punchline
from punchline.schedulers import lua

ROOT = Path(punchline.__file__).parent
REPO = Path(__file__).resolve().parents[2]


def _scripts_run_by_modules() -> set[str]:
    """The names the engine's modules pass to ``lua.script``."""
    found: set[str] = set()
    for layer in ("cluster", "workers", "schedulers", "data"):
        for folder, _, files in os.walk(ROOT / layer, followlinks=True):
            for f in files:
                if not f.endswith(".py"):
                    continue
                tree = ast.parse((Path(folder) / f).read_text())
                for node in ast.walk(tree):
                    if (
                        isinstance(node, ast.Call)
                        and isinstance(node.func, ast.Attribute)
                        and node.func.attr == "script"
                        and isinstance(node.func.value, ast.Name)
                        and node.func.value.id == "lua"
                    ):
                        found |= {
                            a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                        }
    return found


def _libraries() -> set[str]:
    return {lib for name in lua.names() for lib in lua.needs(name)}


def test_every_lua_file_is_run_by_a_module_or_included_by_a_script() -> None:
    run = _scripts_run_by_modules()
    assert len(lua.names()) >= 20, "the package lists its scripts"
    assert run - set(lua.names()) == set(), "a module runs a script that has no file"
    assert set(lua.names()) - run - _libraries() == set(), "a .lua file nobody runs"
    assert _libraries() == {"gcra", "budget"}


def test_a_script_is_its_libraries_then_its_code_without_its_header() -> None:
    take = lua.script("lease_take")
    assert take.startswith(lua.script("gcra") + lua.script("budget"))
    assert "local n = #KEYS - 8" in take
    for name in lua.names():
        text = lua.script(name)
        assert not text.startswith("--") and "-- needs:" not in text, name
        assert "redis.call" in text, name


def test_every_script_compiles_in_redis(redis_client: redis.Redis) -> None:
    """SCRIPT LOAD compiles without running: a script broken by the move (a lost library, a cut line) fails."""
    for name in lua.names():
        sha = redis_client.script_load(lua.script(name))
        assert redis_client.script_exists(sha) == [True], name


def test_the_package_data_holds_every_lua_file() -> None:
    """Installed from a wheel, the scripts are read with importlib.resources: they must be package data."""
    listed = sorted(p.name for p in resources.files("punchline.schedulers.lua").iterdir() if p.name.endswith(".lua"))
    on_disk = sorted(p.name for p in (REPO / "schedulers" / "lua").glob("*.lua"))
    assert listed == on_disk and len(on_disk) == len(lua.names())
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["punchline.schedulers.lua"]
    assert all(any(fnmatch.fnmatch(name, p) for p in patterns) for name in on_disk)
