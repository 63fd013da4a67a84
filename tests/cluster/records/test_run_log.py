"""The run's log is copied into the store beside run.json (cluster/records/run_log.py)."""

from __future__ import annotations

from pathlib import Path

from punchline.cluster.records.run_log import LogShipper
from punchline.data.stores import open_store


def test_the_log_reaches_the_store_while_running_and_at_the_end(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    local = tmp_path / "job-working-dir" / "runs" / "r1" / "log.jsonl"
    local.parent.mkdir(parents=True)
    local.write_bytes(b'{"event":"run_start"}\n')
    shipper = LogShipper(store, "r1", local, interval_s=3600).start()  # the periodic copy, called by hand here
    assert shipper.ship() and store.get("r1/log.jsonl") == b'{"event":"run_start"}\n'
    assert not shipper.ship()  # nothing new: no copy
    with local.open("ab") as fh:
        fh.write(b'{"event":"run_end"}\n')
    shipper.close()  # the final copy carries the last line
    assert store.get("r1/log.jsonl") == b'{"event":"run_start"}\n{"event":"run_end"}\n'


def test_a_resumed_run_in_a_fresh_working_dir_keeps_the_earlier_sessions(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    store.put("r1/log.jsonl", b'{"session":1}\n')
    local = tmp_path / "second-job" / "log.jsonl"
    local.parent.mkdir()
    local.write_bytes(b'{"session":2}\n')
    LogShipper(store, "r1", local, interval_s=3600).start().close()
    assert store.get("r1/log.jsonl") == b'{"session":1}\n{"session":2}\n'
    # the same machine's runs folder still holds both sessions: nothing doubled
    local.write_bytes(b'{"session":1}\n{"session":2}\n{"session":3}\n')
    LogShipper(store, "r1", local, interval_s=3600).start().close()
    assert store.get("r1/log.jsonl") == b'{"session":1}\n{"session":2}\n{"session":3}\n'


def test_a_store_over_the_runs_folder_is_left_alone(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "runs"))
    local = tmp_path / "runs" / "r1" / "log.jsonl"
    local.parent.mkdir(parents=True)
    local.write_bytes(b"line\n")
    inode = local.stat().st_ino
    shipper = LogShipper(store, "r1", local, interval_s=3600)
    assert not shipper.needed
    shipper.start().close()
    assert local.stat().st_ino == inode  # never replaced under the logger's open file
