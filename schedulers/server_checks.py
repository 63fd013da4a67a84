"""What the engine asks a Redis before it is used as a ledger: a server just started answers and is ours, its
scripts are loaded, a user's server answers PING.

Why here and not beside whoever asks: the embedded server's process (starting ``valkey-server``, its config,
its keeper) is the runs folder's (``services/redis_server.py``) and the checks before a run are the
driver's (``cluster/run/preflight.py``), but what either says to a server over the protocol goes through this
layer, the only one that speaks to Redis (``tests/test_redis_access.py``). The keeper's bare-socket ``INFO`` is
:mod:`punchline.schedulers.server_info` (it must not import a client library).
"""

from __future__ import annotations

import redis
import redis.exceptions

from punchline.data.errors import ServiceRejected
from punchline.schedulers.ledger_access import load_scripts
from punchline.schedulers.redis_client import ENV_URL, RedisSettings, connect, redis_errors

ANSWER_TIMEOUT_S = 1.0  # one question to a server that is starting: it answers at once or is not ready yet
LOAD_TIMEOUT_S = 5.0  # loading every script: a few milliseconds, on a machine busy with a run's start


class StartingServer:
    """A server process just started at ``url``, asked until it answers: one connection, reused."""

    def __init__(self, url: str, pid: int) -> None:
        self.pid = pid
        self._client = redis.Redis.from_url(url, socket_timeout=ANSWER_TIMEOUT_S, socket_connect_timeout=1.0)

    def server_id(self) -> str | None:
        """The server's id (``INFO server``'s ``run_id``) once the server at the URL is our process (another may
        own the port) and answers PING; None while it does not yet (not listening, replaying its AOF, or
        another server there that does not know our password)."""
        try:
            info = self._client.info("server")
            if int(info["process_id"]) == self.pid and self._client.ping():
                return str(info.get("run_id", ""))
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
            pass  # not listening yet, still replaying the AOF (LOADING), or another server
        except redis.exceptions.ResponseError:
            pass  # another server on the port that does not know our password
        return None

    def close(self) -> None:
        self._client.close()


def load_scripts_as(url: str) -> str:
    """Load the engine's scripts on the server at ``url`` (its loader user's URL): '' once done, else why not."""
    loader = redis.Redis.from_url(url, socket_timeout=LOAD_TIMEOUT_S, socket_connect_timeout=1.0)
    try:
        load_scripts(loader)
    except redis.exceptions.RedisError as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        loader.close()
    return ""


class Pinger:
    """A user's Redis asked PING before a run, one try per :meth:`ping` (no client-side retries: a TLS handshake
    nobody answers costs one timeout, not four); the caller decides how long to keep asking."""

    def __init__(self, url: str, timeout_s: float = 3.0) -> None:
        self._client = connect(
            RedisSettings(url=url, retries=0, socket_timeout_s=timeout_s, connect_timeout_s=timeout_s)
        )

    def ping(self, where: str) -> None:
        """PING once: :class:`~punchline.data.errors.LedgerUnavailable` when nothing answers (yet),
        :class:`~punchline.data.errors.ServiceRejected` for what waiting cannot fix (a wrong password, a server
        that does not speak Redis)."""
        try:
            with redis_errors(where):
                self._client.ping()
        except (redis.exceptions.InvalidResponse, redis.exceptions.ResponseError) as exc:
            raise ServiceRejected(
                f"{where} does not speak the Redis protocol ({type(exc).__name__}): fix --redis-url", field=ENV_URL
            ) from None

    def close(self) -> None:
        self._client.close()
