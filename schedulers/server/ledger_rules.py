"""The ledger's access rules as data, with no Redis client: the commands a run's user may send, the loader user
who alone loads the engine's scripts, and the scripts' texts. Why they are what they are is
:mod:`punchline.schedulers.server.ledger_access`'s story (which re-exports them, and speaks to a Redis with them).

Why a module of their own: the runs folder's keeper (``services/redis_keeper.py``, a process beside every local
run) writes the embedded server's config (its users' ACL lines) and loads these scripts at each start over a
bare socket (:mod:`punchline.schedulers.server.server_info`); importing them from ``ledger_access`` imported redis-py,
and the keeper stayed at 38 MB of RSS for a whole run for it (25 MB without).
"""

from __future__ import annotations

from collections.abc import Sequence

from punchline.schedulers import lua

# The only commands a run's client may send: those the engine issues (grep the engine and its Lua scripts,
# and run it against a server's INFO commandstats), by redis-py's handshake and by its Script and pipeline
# objects. An allow-list, not a deny-list: SWAPDB, FUNCTION FLUSH/DELETE/RESTORE, MOVE, COPY, RENAME,
# RESTORE, FLUSHALL, KEYS, MIGRATE and every command a later server version adds are refused without being
# named. A command the engine starts to use must be added here (tests/services/test_redis_server.py runs
# the engine's Lua and its ledger calls against a server with this list, and checks every script's calls).
RUN_COMMANDS = (
    # connection: redis-py's handshake (AUTH or HELLO, CLIENT SETINFO/SETNAME, SELECT for /n) and health checks
    "auth", "hello", "ping", "echo", "select", "client|setname", "client|setinfo", "quit", "reset",
    # server: the clock (in the Lua scripts too) and INFO (preflight's server checks, serves_dir's identity)
    "time", "info",
    # the loaded scripts only (redis-py's Script: EVALSHA; SCRIPT EXISTS before a pipeline that runs one)
    "evalsha", "script|exists",
    # pipelines as transactions
    "multi", "exec", "discard", "watch", "unwatch",
    # keys it can name: no DEL (PEXPIRE to 0 removes a key), no SCAN or KEYS
    "exists", "expire", "pexpire", "ttl", "pttl", "type",
    # strings, hashes, sorted sets: the types the ledger keeps
    "get", "mget", "set", "incr", "incrby", "incrbyfloat",
    "hget", "hmget", "hset", "hsetnx", "hdel", "hexists", "hgetall", "hkeys", "hvals", "hlen",
    "hincrby", "hincrbyfloat",
    "zadd", "zrem", "zrange", "zrangebyscore", "zpopmin", "zcard", "zcount", "zscore",
)  # fmt: skip

LOADER_USER = "loader"  # the second user: loads the engine's scripts, and nothing else the run's user may not do
LOADER_COMMANDS = (*RUN_COMMANDS, "script|load")
RUN_USER = "punchline"  # the run's user on a user's own Redis (the embedded server's is its default user)


def command_rule(commands: Sequence[str]) -> str:
    """An ACL command rule allowing ``commands`` and nothing else (``-@all`` first)."""
    return "-@all " + " ".join(f"+{c}" for c in commands)


def setuser_lines(run_password: str = "RUN_PASSWORD", loader_password: str = "LOADER_PASSWORD") -> list[str]:
    """The ``ACL SETUSER`` lines for a user's own Redis: the run's user (what ``--redis-url`` names) and the
    loader (what ``load`` is given). ``reset`` first, so a user set up before gets exactly these rules."""
    return [
        f"ACL SETUSER {RUN_USER} reset on >{run_password} ~* resetchannels {command_rule(RUN_COMMANDS)}",
        f"ACL SETUSER {LOADER_USER} reset on >{loader_password} ~* resetchannels {command_rule(LOADER_COMMANDS)}",
    ]


def engine_scripts() -> dict[str, str]:
    """Every script the engine runs (``schedulers/lua/<name>.lua`` with its libraries), by name: the files no
    other file names as a library."""
    names = lua.names()
    libraries = {lib for name in names for lib in lua.needs(name)}
    return {name: lua.script(name) for name in names if name not in libraries}
