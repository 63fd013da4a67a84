"""A scratch ``valkey-server`` for a benchmark: the binary the project ships (``services/redis_binary.py``), on a
free loopback port, no persistence (as the embedded ledger runs: the figures are the commands', not the disk's), so
its ``INFO`` is the benchmark's alone. Imported by the bench scripts beside it (their folder is on ``sys.path``)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from punchline.services.redis_binary import find_redis_server
from punchline.services.redis_server import free_port


def start_valkey(folder: Path, *extra: str) -> tuple[subprocess.Popen[bytes], int]:
    """The server (its files in ``folder``; ``extra``: more of its arguments) and its port, once it answers."""
    port = free_port()
    argv = [find_redis_server(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen([*argv, "--dir", str(folder), *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port)
    for _ in range(100):
        try:
            client.ping()
            return proc, port
        except redis.exceptions.ConnectionError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("valkey-server did not answer")
