"""The run's log in the store, beside ``run.json``: copied there while the run goes and when it ends.

The driver writes ``runs/<run-id>/log.jsonl`` on its own machine. For a run submitted as a Ray job
that folder is inside the job's temporary working dir on the head, gone with the job (or the head),
so the log is copied to ``<store>/<run-id>/log.jsonl`` every ``interval_s`` and once more at the end;
``punchline logs`` shows the job's output, the store keeps the run's structured log for good.

A resumed run on another machine (a new job) starts a fresh local log: what the store already held
is kept in front of it, so the store's copy spans every session of the run. When the store *is* the
runs folder (the default), the file is already there and nothing is copied.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

import structlog

from punchline.data.storage.run_layout import RunLayout
from punchline.data.store import Store

log = structlog.get_logger("punchline.run_log")
INTERVAL_S = 30.0


class LogShipper:
    """Copies a run's local log into its store now and then (a daemon thread) and at :meth:`close`."""

    def __init__(self, store: Store, run_id: str, path: Path, *, interval_s: float = INTERVAL_S) -> None:
        self.store, self.key, self.path, self.interval_s = store, RunLayout(run_id).log, path, interval_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._prefix = b""
        self._shipped = -1  # bytes of the local log last copied

    @property
    def needed(self) -> bool:
        """False when the store's key is the local file itself (a local store over the runs folder)."""
        if "://" in self.store.url:
            return True
        with contextlib.suppress(OSError):
            return (Path(self.store.url) / self.key).resolve() != self.path.resolve()
        return True

    def start(self) -> LogShipper:
        if not self.needed:
            return self
        with contextlib.suppress(Exception):  # the store was checked already; a hiccup here costs only a copy
            earlier = self.store.get(self.key) or b""
            local = self.path.read_bytes() if self.path.is_file() else b""
            self._prefix = b"" if local.startswith(earlier) else earlier
        self._thread = threading.Thread(target=self._loop, name="punchline-log-shipper", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.ship()

    def ship(self) -> bool:
        """Copy the local log if it grew since the last copy; whether it copied."""
        with self._lock:
            try:
                data = self.path.read_bytes()
            except OSError:
                return False
            if len(data) == self._shipped:
                return False
            try:
                self.store.put(self.key, self._prefix + data)
            except Exception as exc:  # an outage: the next copy (or the final one) carries it
                log.warning("log_copy_failed", key=self.key, error=f"{type(exc).__name__}: {exc}"[:200])
                return False
            self._shipped = len(data)
            return True

    def close(self) -> None:
        """Stop copying and make the last copy (after the run's last log line)."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=self.interval_s + 5)
        self._thread = None
        self.ship()
