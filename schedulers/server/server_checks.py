"""What the engine asks a Redis before it is used as a ledger: a user's server answers PING (whether a server just
started answers and is ours, and the loading of its scripts, are :mod:`punchline.schedulers.server.server_info`'s: the
keeper that starts it imports no client library).

Why here and not beside whoever asks: the embedded server's process (starting ``valkey-server``, its config,
its keeper) is the runs folder's (``services/redis_server.py``) and the checks before a run are the
driver's (``cluster/run/preflight.py``), but what either says to a server over the protocol goes through this
layer, the only one that speaks to Redis (``tests/test_redis_access.py``).
"""

from __future__ import annotations

import redis
import redis.exceptions

from punchline.data.errors import ServiceRejected
from punchline.schedulers.server.redis_client import ENV_URL, RedisSettings, connect, redis_errors


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
