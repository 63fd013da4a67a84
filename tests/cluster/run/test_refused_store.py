"""A store the run refuses creates nothing first (issue 39, item 8c): no runs folder, no ledger started.

A local store with a file where the run keeps keys, or a store guarded by another ledger right now, was refused
(exit 2) only once the runs folder's ledger had started: ``runs/`` held 13 paths and a server ran. The checks now
run in the preflight (``cluster/run/run_checks.py`` ``check_store_folders``, ``cluster/run/preflight.py``
``check_store_ledger``), before anything is created.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from punchline.cluster.cli.main import main
from punchline.cluster.run.store_guard import PREFIX, LedgerMark
from punchline.data.storage.response_cache import CACHE_PREFIX
from punchline.data.stores.local import TMP_DIR
from punchline.services.keeper import cmdline

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "configs" / "demo.toml"  # offline (the simulated provider): nothing else is needed to run it


def _file_at(name: str) -> Callable[[Path], None]:
    def plant(store: Path) -> None:
        (store / name).write_text("not a folder\n")

    return plant


def _other_ledgers_mark(store: Path) -> None:
    """A fresh mark of another ledger, its driver alive (this process): a run with its own ledger must refuse."""
    mark = LedgerMark(identity="redis://10.0.0.5:6380/0", host=socket.gethostname(), pid=os.getpid(), at=time.time())
    (store / PREFIX).mkdir()
    (store / PREFIX / "other.json").write_bytes(msgspec.json.encode(mark))


@pytest.mark.parametrize(
    ("plant", "named"),
    [
        (_file_at(PREFIX.rstrip("/")), PREFIX.rstrip("/")),  # the ledgers' marks
        (_file_at(CACHE_PREFIX.rstrip("/")), CACHE_PREFIX.rstrip("/")),  # the response cache
        (_file_at(TMP_DIR), TMP_DIR),  # the store's temp files
        (_file_at("refused"), "refused"),  # the run's own folder
        (_other_ledgers_mark, "guarded by another ledger"),
    ],
    ids=["marks", "cache", "tmp", "run-folder", "other-ledger"],
)
def test_a_refused_store_creates_no_runs_folder_and_starts_no_ledger(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    plant: Callable[[Path], None],
    named: str,
) -> None:
    for name in ("PUNCHLINE_REDIS_URL", "PUNCHLINE_STORE", "PUNCHLINE_RAY_ADDRESS", "PUNCHLINE_RUNS_DIR"):
        monkeypatch.delenv(name, raising=False)
    store, runs = tmp_path / "store", tmp_path / "runs"
    store.mkdir()
    plant(store)
    argv = ["run", str(CONFIG), "--store", str(store), "--runs-dir", str(runs), "--run-id", "refused"]
    code = main([*argv, "--no-progress"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("punchline: error: "), lines
    assert named in lines[0]
    assert not runs.exists(), f"the refused run created {sorted(str(p) for p in runs.rglob('*'))}"
    keepers = [p for p in os.listdir("/proc") if p.isdigit() and str(runs) in " ".join(cmdline(int(p)))]
    assert not keepers, "a process of the refused run is running"
