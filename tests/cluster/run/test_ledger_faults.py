"""When punchline's own parts fail (issue 21), without Ray: the runs folder's ledger comes back after a
``kill -9``, a full disk stops the run with one line, the keeper is never missing, the ledger folder
trusts no link, the dangerous commands are refused, and a store keeps one ledger.

The engine-level versions (a real run, provider calls counted) are in ``test_engine_faults.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from punchline.cluster.run.store_guard import OtherLedger, StoreGuard, redis_identity
from punchline.data.errors import LedgerFailed, LedgerUnavailable
from punchline.data.stores import open_store
from punchline.services.local_redis import LocalRedis, redis_dir
from punchline.services.redis_server import EmbeddedRedis

ROOT = Path(__file__).resolve().parents[3]


def wait_for(cond: Callable[[], bool], timeout_s: float = 30.0) -> float:
    """Seconds it took."""
    started = time.monotonic()
    while not cond():
        assert time.monotonic() - started < timeout_s, "condition not reached in time"
        time.sleep(0.05)
    return time.monotonic() - started


def _server_pid(runs: Path) -> int:
    return int(json.loads((redis_dir(runs) / "redis.lock").read_text())["pid"])


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[LocalRedis]:
    member = LocalRedis(tmp_path).join()
    try:
        yield member
    finally:
        member.leave()


def test_a_killed_server_is_restarted_from_its_aof_on_the_same_url(tmp_path: Path, ledger: LocalRedis) -> None:
    client = redis.Redis.from_url(ledger.url)
    client.set("pl:kept", "1")  # acknowledged, so in the AOF (appendfsync always)
    old = _server_pid(tmp_path)
    os.kill(old, signal.SIGKILL)
    took = wait_for(lambda: EmbeddedRedis.find_running(redis_dir(tmp_path)) is not None, timeout_s=10)
    assert took < 10 and _server_pid(tmp_path) != old
    assert EmbeddedRedis.find_running(redis_dir(tmp_path)) == ledger.url  # same port and password
    assert client.get("pl:kept") == b"1"
    assert ledger.restarts == 1 and ledger.failure is None


def test_the_ledger_refuses_commands_that_wipe_or_walk_it(ledger: LocalRedis) -> None:
    client = redis.Redis.from_url(ledger.url)
    client.set("pl:x", "1")
    for command in (("FLUSHALL",), ("FLUSHDB",), ("SCRIPT", "FLUSH"), ("KEYS", "*"), ("SWAPDB", "0", "1"),
                    ("FUNCTION", "FLUSH"), ("MIGRATE", "127.0.0.1", "1", "pl:x", "0", "100"), ("SCAN", "0"),
                    ("DEL", "pl:x"), ("EVAL", "return 1", "0"), ("SCRIPT", "LOAD", "return 1")):  # fmt: skip
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.execute_command(*command)
    assert client.get("pl:x") == b"1"


# every file the ledger's folder holds: the drivers' and keeper's, the server's config and log, its multi-part AOF
# (Valkey 7+: appendonlydir/ with a manifest, a base and an incr file, and a rewrite's temp files)
LEDGER_FILES = ["server.conf", "redis.lock", "password", "join.lock", "keeper.lock", "redis.log", "appendonlydir",
                "appendonlydir/appendonly.aof.manifest", "appendonlydir/appendonly.aof.1.base.rdb",
                "appendonlydir/appendonly.aof.1.incr.aof", "appendonlydir/temp-rewriteaof-bg-1.aof",
                "clients/planted"]  # fmt: skip


@pytest.mark.parametrize("name", LEDGER_FILES)
def test_a_symlink_planted_in_the_ledger_folder_is_refused(tmp_path: Path, name: str) -> None:
    target = tmp_path / "victim.txt"
    target.write_text("precious\n")
    folder = redis_dir(tmp_path / "runs")
    folder.mkdir(parents=True, mode=0o700)
    (folder / name).parent.mkdir(mode=0o700, exist_ok=True)
    (folder / name).symlink_to(target)
    with pytest.raises(LedgerUnavailable, match="symbolic link"):
        LocalRedis(tmp_path / "runs").join()
    assert target.read_text() == "precious\n"  # never written through the link
    assert EmbeddedRedis.find_running(folder) is None


@pytest.mark.parametrize("name", ["appendonlydir/appendonly.aof.2.incr.aof", "appendonlydir/temp-rewriteaof-bg-9.aof"])
def test_a_link_planted_while_the_ledger_runs_stops_it_before_it_writes_through(tmp_path: Path, name: str) -> None:
    """Issue 34: the server opens its AOF files by name at a rewrite (the next incr file's name can be guessed), so
    a link planted in the folder while it runs is found by the driver's watcher within a watch or two: the server
    is stopped (nothing written through the link), the run stops with one line naming the entry, and the ledger
    starts again, with everything it acknowledged, once the link is gone."""
    target = tmp_path / "victim.txt"
    target.write_text("precious\n")
    member = LocalRedis(tmp_path / "runs").join()
    folder = redis_dir(tmp_path / "runs")
    redis.Redis.from_url(member.url).set("pl:kept", "1")
    try:
        with pytest.raises(LedgerFailed) as caught:
            (folder / name).symlink_to(target)
            wait_for(lambda: False, timeout_s=30)  # the watcher's LedgerFailed ends this wait (SIGUSR2)
    finally:
        member.leave()
    message = str(caught.value)
    assert f"{name} is a symbolic link" in message and "resume the run" in message and "\n" not in message
    assert EmbeddedRedis.find_running(folder) is None and target.read_text() == "precious\n"
    with pytest.raises(LedgerUnavailable, match="symbolic link"):
        LocalRedis(tmp_path / "runs").join()  # refused until the link is removed
    (folder / name).unlink()
    again = LocalRedis(tmp_path / "runs").join()
    try:
        assert redis.Redis.from_url(again.url).get("pl:kept") == b"1"
    finally:
        again.leave()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 3 MB tmpfs (we run as root; the issue's reproduction used the same)."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True)
    assert done.returncode == 0, f"cannot mount a tmpfs (the fault tests run as root): {done.stderr!r}"
    try:
        yield mount
    finally:
        with contextlib.suppress(Exception):
            EmbeddedRedis.stop_running(redis_dir(mount / "runs"))
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_a_full_disk_stops_the_driver_with_one_line_and_resumes_once_freed(small_disk: Path) -> None:
    """Filling the runs folder's disk ends the driver's wait at once with LedgerFailed (raised in its
    main thread, naming disk space) instead of minutes of "connection refused"; with space freed the
    ledger starts again from its AOF with everything acknowledged."""
    ballast = small_disk / "ballast"
    ballast.write_bytes(b"\0" * 1_200_000)
    member = LocalRedis(small_disk / "runs").join()
    client = redis.Redis.from_url(member.url)
    acknowledged = 0
    started = time.monotonic()
    with pytest.raises(LedgerFailed) as caught:
        for i in range(10_000):
            with contextlib.suppress(redis.exceptions.RedisError):
                client.set(f"pl:big:{i}", b"x" * 20_000)
                acknowledged = i + 1
            time.sleep(0.01)
    took = time.monotonic() - started
    message = str(caught.value)
    assert "no space left on the disk" in message and str(small_disk) in message and "\n" not in message
    assert took < 20 and acknowledged > 10
    member.leave()
    ballast.unlink()  # space freed: the next driver starts the ledger again, nothing acknowledged is lost
    again = LocalRedis(small_disk / "runs").join()
    try:
        fresh = redis.Redis.from_url(again.url)
        assert fresh.exists(*[f"pl:big:{i}" for i in range(acknowledged)]) == acknowledged
    finally:
        again.leave()


def test_a_full_disk_refuses_to_start_the_ledger(small_disk: Path) -> None:
    (small_disk / "ballast").write_bytes(b"\0" * (3 * 1024 * 1024 - 100 * 1024))
    with pytest.raises(LedgerFailed, match="cannot start the ledger: no space left"):
        LocalRedis(small_disk / "runs").join()


_JOINER = textwrap.dedent(
    """
    import sys, time
    from punchline.services.local_redis import LocalRedis
    ledger = LocalRedis(sys.argv[1]).join()
    print(ledger.public_url, flush=True)
    time.sleep(600)
    """
)


def _keepers(folder: Path) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                argv = (proc / "cmdline").read_bytes().split(b"\0")
                if b"punchline.services.redis_keeper" in argv and str(folder).encode() in argv:
                    found.append(int(proc.name))
    return found


def test_keeper_killed_then_driver_killed_leaves_no_server(tmp_path: Path) -> None:
    """The driver starts a new keeper when its keeper is killed, so killing both never orphans the server."""
    driver = subprocess.Popen([sys.executable, "-c", _JOINER, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE)
    try:
        assert driver.stdout is not None and b":***@" in driver.stdout.readline()
        folder = redis_dir(tmp_path)
        wait_for(lambda: len(_keepers(folder)) == 1)
        first = _keepers(folder)[0]
        os.kill(first, signal.SIGKILL)

        def replaced() -> bool:
            keepers = _keepers(folder)  # read once: the list can change between two reads
            return bool(keepers) and keepers[0] != first

        wait_for(replaced, timeout_s=20)
    finally:
        driver.kill()
        driver.wait()
    server = _server_pid(tmp_path)
    wait_for(lambda: EmbeddedRedis.find_running(redis_dir(tmp_path)) is None, timeout_s=30)
    wait_for(lambda: _exited(server), timeout_s=15)


def _exited(pid: int) -> bool:
    """Gone, or a zombie waiting for a reaper (it has exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] in ("Z", "X")
    except OSError:
        return True


# --- one ledger per store -----------------------------------------------------------------------------


def test_a_store_refuses_a_second_ledger_while_the_first_is_in_use(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    embedded = "embedded ledger /x/runs/_ledger on host"
    with StoreGuard(store, embedded):
        with StoreGuard(store, embedded):  # a second driver of the same ledger: fine
            pass
        other = redis_identity("redis://:s3cret@10.0.0.5:6380/2")
        assert other == "redis://10.0.0.5:6380/2"
        with pytest.raises(OtherLedger) as caught:
            StoreGuard(store, other).acquire()
        line = str(caught.value)
        assert embedded in line and "pay for requests twice" in line and "\n" not in line
        assert not any(b"s3cret" in (store.get(k) or b"") for k in store.list("_ledgers/"))
    StoreGuard(store, other).acquire().release()  # the first ledger's drivers are gone: the store is free


def test_a_dead_drivers_mark_does_not_hold_the_store(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    guard = StoreGuard(store, "embedded ledger A")
    guard.mark.pid = int(dead.stdout)
    guard._write()  # a driver killed with -9 never removed its mark
    StoreGuard(store, "redis://other:6379/0").acquire().release()
    assert list(store.list("_ledgers/")) == []
