"""One driver per run id: a second driver for a run that is already running refuses at once.

Two drivers of one run id would share its shards and records, and the one that finished first
would stop services under the other. The claim is a key in the ledger (``pl:run:<id>:driver``)
holding the driver's host, pid and a token, with a TTL renewed by a heartbeat thread: a driver
killed on another machine frees its run after ``ttl_ms``, one killed on this machine at once (its
pid is gone), so a resume right after a ``kill -9`` is not refused.

The claim is also how workers know their driver is alive: a worker stops taking units once the key no
longer holds its driver's value (``workers/driver_watch.py``), so killing a driver stops the spending.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import threading
from typing import Any

from punchline.data.errors import InputError, LedgerUnavailable
from punchline.schedulers import keys as redis_keys
from punchline.schedulers import lua
from punchline.schedulers.server.redis_client import redis_errors

# schedulers/lua/run_claim_*.lua: renew the claim (taking it again when it lapsed), release it if ours
_RENEW = lua.script("run_claim_renew")
_RELEASE = lua.script("run_claim_release")


class RunAlreadyRunning(InputError):
    """Another live driver holds the run id."""


# the key workers watch too (``workers/driver_watch.py``), in the default namespace
claim_key = redis_keys.driver_claim


def _dead_here(holder: dict[str, Any]) -> bool:
    """The holder ran on this machine and its process is gone (killed)."""
    if holder.get("host") != socket.gethostname():
        return False
    try:
        os.kill(int(holder.get("pid", 0)), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, ValueError, OverflowError):
        return False
    return False


class RunClaim:
    def __init__(self, client: Any, run_id: str, *, ttl_ms: int = 30_000) -> None:
        self.r = client
        self.run_id = run_id
        self.key = claim_key(run_id)
        self.ttl_ms = ttl_ms
        self.value = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "token": secrets.token_hex(8)})
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._renew_script = client.register_script(_RENEW)  # EVALSHA: a run's user may not EVAL
        self._release_script = client.register_script(_RELEASE)

    def acquire(self) -> RunClaim:
        with redis_errors("run claim"):
            for _ in range(3):
                if self.r.set(self.key, self.value, nx=True, px=self.ttl_ms):
                    break
                raw = self.r.get(self.key)
                try:
                    holder = json.loads(raw) if raw else {}
                except ValueError:
                    holder = {}
                if raw is not None and not _dead_here(holder):
                    raise RunAlreadyRunning(
                        f"run {self.run_id} is already running (driver pid {holder.get('pid', '?')} on "
                        f"{holder.get('host', '?')}); watch it with `punchline status {self.run_id}`, "
                        "or start another --run-id",
                        field="--run-id",
                    )
                if raw is not None:
                    self._release_script(keys=[self.key], args=[raw])  # a killed driver's claim: take it over
            else:
                raise RunAlreadyRunning(f"run {self.run_id} is being started by another driver", field="--run-id")
        self._thread = threading.Thread(target=self._renew, name="run-claim", daemon=True)
        self._thread.start()
        return self

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl_ms / 3000):
            with contextlib.suppress(LedgerUnavailable, Exception), redis_errors("run claim"):
                self._renew_script(keys=[self.key], args=[self.value, self.ttl_ms])

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        with contextlib.suppress(Exception), redis_errors("run claim"):
            self._release_script(keys=[self.key], args=[self.value])

    def __enter__(self) -> RunClaim:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
