"""How every layer above talks to the ledger's Redis: settings, a patient client, outage conversion.

The embedded server (``punchline.cluster.redis_server``) is started by the driver; this module is
all a worker or a scheduler needs, so they never import the cluster layer.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import msgspec
import redis
import redis.exceptions
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from punchline.data.errors import ConfigError, LedgerUnavailable

ENV_URL = "PUNCHLINE_REDIS_URL"
DEFAULT_URL = "redis://127.0.0.1:6379/0"


def redact_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (safe for logs and reprs)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


class RedisSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Where the ledger lives and how patient a client is.

    Timeouts are short on purpose: the ledger fails closed (``LedgerUnavailable``) rather than
    letting workers hang, and the caller decides whether to wait and retry.
    """

    url: str = DEFAULT_URL
    socket_timeout_s: float = 5.0
    connect_timeout_s: float = 3.0
    health_check_interval_s: int = 15
    retries: int = 3

    def __repr__(self) -> str:
        # The URL may carry a password; never let it reach a log line or a traceback.
        return (
            f"RedisSettings(url={redact_url(self.url)!r}, socket_timeout_s={self.socket_timeout_s}, "
            f"connect_timeout_s={self.connect_timeout_s}, health_check_interval_s={self.health_check_interval_s}, "
            f"retries={self.retries})"
        )

    __str__ = __repr__

    @classmethod
    def from_dsn(cls, url: str) -> RedisSettings:
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise ConfigError(
                f"not a Redis URL (want redis://host:port/db, rediss://... or unix:///path): {redact_url(url)!r}",
                field=ENV_URL,
            )
        return cls(url=url)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> RedisSettings:
        """``PUNCHLINE_REDIS_URL`` or the local default ``redis://127.0.0.1:6379/0``."""
        source = os.environ if env is None else env
        url = source.get(ENV_URL, "").strip()
        return cls.from_dsn(url) if url else cls()


def connect(url: str | RedisSettings, *, decode_responses: bool = False) -> redis.Redis:
    """A client with bounded timeouts, a few quick retries and periodic health checks.

    Connection errors surface as redis-py exceptions; wrap calls in ``redis_errors()`` to get
    ``LedgerUnavailable`` instead.
    """
    settings = url if isinstance(url, RedisSettings) else RedisSettings.from_dsn(url)
    retry = Retry(ExponentialBackoff(cap=1.0, base=0.05), settings.retries)
    client: redis.Redis = redis.Redis.from_url(
        settings.url,
        socket_timeout=settings.socket_timeout_s,
        socket_connect_timeout=settings.connect_timeout_s,
        health_check_interval=settings.health_check_interval_s,
        retry=retry,
        decode_responses=decode_responses,
    )
    return client


_UNAVAILABLE = (
    redis.exceptions.ConnectionError,  # includes BusyLoadingError (server replaying its AOF)
    redis.exceptions.TimeoutError,
)


@contextlib.contextmanager
def redis_errors(what: str = "redis") -> Iterator[None]:
    """Turn "cannot reach Redis" into ``LedgerUnavailable``; usable as ``with`` or as a decorator.

    Only reachability failures are converted: a ``ResponseError`` (a bug: wrong type, bad script)
    still propagates as itself so it is not mistaken for an outage and retried forever.
    """
    try:
        yield
    except _UNAVAILABLE as exc:
        raise LedgerUnavailable(f"{what}: {type(exc).__name__}: {exc}") from exc


def serves_dir(url: str, data_dir: str | os.PathLike[str], *, timeout_s: float = 2.0) -> bool:
    """Whether the Redis at ``url`` answers and keeps its files in ``data_dir``.

    Use before reusing a server recorded by an earlier (killed) driver: the port may since have
    been taken by another run's server, which must not be mistaken for ours.
    """
    client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    try:
        served = client.config_get("dir").get("dir")
    except (redis.exceptions.RedisError, OSError):
        return False
    finally:
        client.close()
    if isinstance(served, bytes):
        served = served.decode()
    return served is not None and Path(served).resolve() == Path(data_dir).resolve()
