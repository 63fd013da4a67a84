"""A run's record (``runs/<id>/run.json``, ``<store>/<id>/run.json``) and its id: what the read-only commands
(``status``, ``runs``, ``view``) read, without importing the engine that writes them (``cluster/run/driver.py``)."""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import msgspec

from punchline.data.errors import ConfigError, InputError
from punchline.data.storage.jsonio import decode_bytes
from punchline.data.storage.run_layout import RECORD
from punchline.data.units import RunState
from punchline.schedulers.budget import UsageRow
from punchline.schedulers.ledger import StageCounters

RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_run_id(run_id: str, *, field: str = "--run-id") -> str:
    """A run id names folders and keys: letters, digits, ``.``, ``_`` and ``-``, at most 128, no
    leading dot (so it can never climb out of the runs folder or hide there)."""
    if not RUN_ID.fullmatch(run_id):
        shown = run_id if len(run_id) <= 60 else run_id[:57] + "..."
        raise ConfigError(
            f"{shown!r} is not a run id: use 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit",
            field=field,
        )
    return run_id


class Services(msgspec.Struct, kw_only=True):
    """Where a run's services are; recorded in ``runs/<id>/run.json`` so ``status`` can find them."""

    redis_url: str  # with the password shown as *** (credentials never leave their process)
    store_url: str
    ray_address: str | None = None
    simulator_url: str | None = None
    redis_password_file: str | None = None  # where this machine keeps the ledger's password (0600)


class RunRecord(msgspec.Struct, kw_only=True):
    run_id: str
    pipeline: str
    config_path: str
    config_toml: str
    created_at: float
    services: Services
    stages: list[str]
    state: RunState = "running"
    finished_at: float | None = None
    counters: dict[str, StageCounters] = {}
    artifacts: list[str] = []
    failures: dict[str, dict[str, str]] = {}
    usage: list[UsageRow] = []  # tokens and dollars per (stage, model)
    driver_host: str = ""
    driver_pid: int = 0

    def driver_gone(self) -> bool:
        """A run still marked running whose driver process on this host no longer exists (killed)."""
        if self.state != "running" or self.driver_host != socket.gethostname() or not self.driver_pid:
            return False
        try:
            os.kill(self.driver_pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


def load_record(raw: bytes, where: str) -> RunRecord:
    """A run record, or one line naming the file when it is not one (truncated, edited, corrupt)."""
    try:
        return decode_bytes(raw, RunRecord, source=where)
    except InputError as exc:
        raise InputError(f"not a readable run record ({exc.detail})", file=where, field=exc.field) from None


def readable_records(runs_dir: Path) -> Iterator[RunRecord]:
    """The record of every run under a runs folder that can be read, in no order; an unreadable one is skipped
    (what reads them here estimates from earlier runs: a truncated record is one run fewer, not an error)."""
    if not runs_dir.is_dir():
        return
    for path in runs_dir.glob(f"*/{RECORD}"):
        try:
            yield load_record(path.read_bytes(), str(path))
        except (InputError, OSError):
            continue
