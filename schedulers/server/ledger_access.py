"""Who may do what on the ledger's Redis: the commands a run's clients may send, and the engine's scripts, which
only a second user loads.

Why: every worker holds the run's Redis password (and so may anyone who looks at the ledger with ``redis-cli``).
With ``EVAL`` and ``SCAN`` allowed, that password ran Lua of its own that walked every key and deleted it: a
review wiped 334 keys mid-run and four requests were paid twice (issue 39). So the run's user may send only
:data:`RUN_COMMANDS`: ``EVALSHA`` of a script already loaded, never ``EVAL`` or ``SCRIPT LOAD``; no command that
lists keys (``SCAN``, ``KEYS``, ``RANDOMKEY``) or deletes them (``DEL``, ``UNLINK``, ``FLUSHALL``). Redis checks
the commands a script calls against the caller's ACL too, so the engine's scripts delete nothing with ``DEL``
either (``schedulers/lua/__init__.py`` says how they remove a key). The scripts are loaded by
:data:`LOADER_USER`, whose password only the process that starts a server has (``services/redis_server.py``:
a new one at every start, kept nowhere), right after the server answers and before anyone is told it runs. A server
forgets its scripts when it restarts, so every start loads them again.

What the run's password still allows, said plainly: reading and writing a key it can name (the run's own keys
follow :mod:`punchline.schedulers.keys`; a request's lease is named by the hash of the request, which only one who
knows the request can compute), expiring one (``PEXPIRE``, which the engine needs), and calling the engine's own
scripts with keys it chooses. It cannot list the ledger's keys, run code of its own, or reach the server's files.

A user's own Redis (``--redis-url``) is not ours to configure: :func:`setuser_lines` are the ``ACL SETUSER`` lines
``docs/deploy.md`` shows (a test holds the two to the same text), and ``python -m
punchline.schedulers.server.ledger_access load`` loads the scripts as that Redis's loader user, its URL read from stdin.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Sequence

import redis
import redis.exceptions

from punchline.data.errors import ConfigError
from punchline.schedulers.server.ledger_rules import (  # the rules as data, without redis-py (the keeper's)
    LOADER_COMMANDS,
    LOADER_USER,
    RUN_COMMANDS,
    RUN_USER,
    command_rule,
    engine_scripts,
    setuser_lines,
)
from punchline.schedulers.server.redis_client import (
    ENV_URL,
    SCRIPTS_MISSING,
    connect,
    is_cluster,
    redact_url,
    redis_errors,
)

__all__ = [
    "LOADER_COMMANDS",
    "LOADER_USER",
    "RUN_COMMANDS",
    "RUN_USER",
    "check_loaded",
    "command_rule",
    "engine_scripts",
    "load_scripts",
    "missing_scripts",
    "setuser_lines",
]


def load_scripts(client: redis.Redis) -> int:
    """Load every engine script (as a user that may: the loader); returns how many."""
    scripts = engine_scripts()
    if is_cluster(client):  # a cluster's SCRIPT LOAD goes to every master, one script at a time
        for text in scripts.values():
            client.script_load(text)
        return len(scripts)
    pipe = client.pipeline(transaction=False)
    for text in scripts.values():
        pipe.script_load(text)
    pipe.execute()
    return len(scripts)


def missing_scripts(client: redis.Redis) -> list[str]:
    """The engine scripts the server does not hold (by name)."""
    scripts = engine_scripts()
    held = client.script_exists(*(hashlib.sha1(text.encode()).hexdigest() for text in scripts.values()))
    return [name for name, ok in zip(scripts, held, strict=True) if not ok]


def check_loaded(client: redis.Redis, url: str) -> None:
    """Before a run on a user's own Redis: its scripts are there, or loaded now when the run's user may load them
    (a Redis without our ACL), else a :class:`ConfigError` saying how to load them."""
    with redis_errors("ledger scripts"):
        missing = missing_scripts(client)
        if not missing:
            return
        try:
            load_scripts(client)
        except redis.exceptions.NoPermissionError:
            raise ConfigError(
                f"{SCRIPTS_MISSING} ({len(missing)} missing on {redact_url(url)}, among them {missing[0]}), and "
                f"this user may not load them: load them as the {LOADER_USER!r} user: echo "
                f"redis://{LOADER_USER}:PASSWORD@HOST:PORT/0 | "
                "python -m punchline.schedulers.server.ledger_access load "
                "(docs/deploy.md)",
                field=ENV_URL,
            ) from None


def main(argv: Sequence[str]) -> int:
    """``acl``: print the ACL SETUSER lines; ``load``: load the scripts as the URL read from stdin (a URL on the
    command line would show its password to ``ps``)."""
    if list(argv) == ["acl"]:
        print("\n".join(setuser_lines()))
        return 0
    if list(argv) == ["load"]:
        url = sys.stdin.readline().strip()
        client = connect(url)
        try:
            with redis_errors("ledger scripts"):
                n = load_scripts(client)
        finally:
            client.close()
        print(f"{n} scripts loaded on {redact_url(url)}")
        return 0
    print("usage: python -m punchline.schedulers.server.ledger_access acl | load  (load reads the URL from stdin)")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
