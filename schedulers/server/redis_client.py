"""How every layer above talks to the ledger's Redis: settings, a patient client, outage conversion.

The embedded server (``punchline.services.redis_server``) is started by the driver; this module is
all a worker or a scheduler needs, so they never import the cluster layer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote, urlsplit, urlunsplit

import msgspec
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
import redis.exceptions
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from punchline.data.errors import (
    ConfigError,
    LedgerUnavailable,
    ServiceRejected,
    causes,
    permanent_network_reason,
)
from punchline.data.redaction import (
    redact_url,
)
from punchline.data.settings import REDIS_URL

ENV_URL = REDIS_URL.name
DEFAULT_URL = "redis://127.0.0.1:6379/0"
SCRIPTS_MISSING = "the ledger's scripts are not loaded on its Redis (restarted and not given them again yet?)"

# What the layers above hold of Redis, by these names only: they pass a client to this layer's classes and catch its
# errors, and import no Redis library themselves (tests/test_redis_access.py).
LedgerClient = redis.Redis  # a synchronous client, as connect() makes one
ClientError = redis.RedisError  # any error of the client, a reply error too: what a reader of figures only swallows


class ScriptsNotLoaded(redis.exceptions.ConnectionError):
    """A script the engine runs is not on the server, and this client may not load it (a run's user may only run
    what the loader loaded: :mod:`punchline.schedulers.server.ledger_access`). A connection error, as redis-py's own
    ``BusyLoadingError`` is: the server is not ready yet (the embedded ledger loads its scripts right after a
    restart), so every caller waits it out as an outage, and one that cannot wait any longer says why."""


def _not_loaded(exc: redis.exceptions.NoPermissionError) -> ScriptsNotLoaded:
    return ScriptsNotLoaded(f"{SCRIPTS_MISSING}: {exc}")


class LedgerRedis(redis.Redis):
    """redis-py's client, but a ``SCRIPT LOAD`` the server refuses (redis-py's ``Script`` sends one when its
    ``EVALSHA`` finds nothing) raises :class:`ScriptsNotLoaded` instead of a reply error taken for a bug."""

    def script_load(self, script: Any) -> str:
        try:
            return str(super().script_load(script))
        except redis.exceptions.NoPermissionError as exc:
            raise _not_loaded(exc) from None


class AsyncLedgerRedis(redis.asyncio.Redis):
    """:class:`LedgerRedis` for an event loop."""

    async def script_load(self, script: Any) -> str:
        try:
            return str(await super().script_load(script))
        except redis.exceptions.NoPermissionError as exc:
            raise _not_loaded(exc) from None


class LedgerRedisCluster(redis.cluster.RedisCluster):
    """:class:`LedgerRedis` for a Redis Cluster (``SCRIPT LOAD`` goes to every master)."""

    def script_load(self, script: Any) -> str:
        try:
            return str(super().script_load(script))
        except redis.exceptions.NoPermissionError as exc:
            raise _not_loaded(exc) from None


class AsyncLedgerRedisCluster(redis.asyncio.cluster.RedisCluster):
    """:class:`LedgerRedisCluster` for an event loop."""

    async def script_load(self, script: Any) -> str:
        try:
            return str(await super().script_load(script))
        except redis.exceptions.NoPermissionError as exc:
            raise _not_loaded(exc) from None


def credentials_in_userinfo(url: str) -> str:
    """The same Redis URL with a ``?password=`` (and ``?username=``) query parameter moved into the userinfo,
    so every later step (redaction, the workers' password file) sees one form."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    pairs = [p for p in parts.query.split("&") if p] if parts.query else []
    named = (p.split("=", 1) if "=" in p else (p, "") for p in pairs)
    moved = {k: v for k, v in named if k in ("password", "username")}
    if "password" not in moved or parts.password is not None:
        return url
    rest = "&".join(p for p in pairs if p.split("=", 1)[0] not in ("password", "username"))
    host = parts.netloc.rsplit("@", 1)[-1]
    user = moved.get("username", parts.username or "")
    return urlunsplit(parts._replace(netloc=f"{user}:{moved['password']}@{host}", query=rest))


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
    def from_env(cls, env: Mapping[str, str] | None = None) -> RedisSettings:
        """``PUNCHLINE_REDIS_URL`` or the local default ``redis://127.0.0.1:6379/0``."""
        url = REDIS_URL.get(env)
        return cls.from_dsn(url) if url else cls()


# what each URL's server answered to ``INFO cluster`` (a server that answered: its mode does not change under a URL)
_CLUSTER_MODE: dict[str, bool] = {}


def cluster_mode(url: str | RedisSettings) -> bool:
    """Whether the server at ``url`` is a node of a Redis Cluster (``INFO cluster``: ``cluster_enabled:1``), so the
    engine speaks to it with redis-py's ``RedisCluster``: a user gives the plain URL of any node. Asked once per URL
    and process; a server that does not answer is taken for a single one (the caller's next command meets the
    same outage, and the next connect asks again)."""
    settings = url if isinstance(url, RedisSettings) else RedisSettings.from_dsn(url)
    if settings.url.startswith("unix:"):
        return False
    known = _CLUSTER_MODE.get(settings.url)
    if known is not None:
        return known
    probe = redis.Redis.from_url(
        settings.url, socket_timeout=settings.socket_timeout_s, socket_connect_timeout=settings.connect_timeout_s
    )
    try:
        enabled = str(probe.info("cluster").get("cluster_enabled", 0)) == "1"
    except (redis.RedisError, OSError):
        return False
    finally:
        probe.close()
    _CLUSTER_MODE[settings.url] = enabled
    return enabled


def is_cluster(client: object) -> bool:
    """Whether ``client`` (synchronous or asynchronous) speaks to a Redis Cluster: then a script's keys must share a
    slot, and the modules of this layer send one call per slot group where a single Redis takes one."""
    return isinstance(client, (redis.cluster.RedisCluster, redis.asyncio.cluster.RedisCluster))


def _cluster_url(url: str) -> str:
    """A node's URL as ``RedisCluster.from_url`` takes it: a cluster has database 0 only, so no path."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="")) if parts.path in ("/0", "/") else url


def _timeouts(settings: RedisSettings) -> dict[str, Any]:
    return {
        "socket_timeout": settings.socket_timeout_s,
        "socket_connect_timeout": settings.connect_timeout_s,
        "health_check_interval": settings.health_check_interval_s,
    }


def connect(url: str | RedisSettings, *, decode_responses: bool = False) -> redis.Redis:
    """A client with bounded timeouts, a few quick retries and periodic health checks: a ``RedisCluster`` when
    the URL names a node of a cluster (:func:`cluster_mode`), which the layers above use through the same calls
    (typed as a ``redis.Redis``: the commands they send are the ones both have).

    Connection errors surface as redis-py exceptions; wrap calls in ``redis_errors()`` to get
    ``LedgerUnavailable`` instead.
    """
    settings = url if isinstance(url, RedisSettings) else RedisSettings.from_dsn(url)
    options = _timeouts(settings)
    options.update(retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), settings.retries))
    options.update(decode_responses=decode_responses)
    if cluster_mode(settings):
        return cast(redis.Redis, LedgerRedisCluster.from_url(_cluster_url(settings.url), **options))
    client: redis.Redis = LedgerRedis.from_url(settings.url, **options)
    return client


def connect_async(url: str | RedisSettings) -> redis.asyncio.Redis:
    """The same client for an event loop (a worker's unit path): no thread hop per call."""
    settings = url if isinstance(url, RedisSettings) else RedisSettings.from_dsn(url)
    if cluster_mode(settings):
        cluster = AsyncLedgerRedisCluster.from_url(_cluster_url(settings.url), **_timeouts(settings))
        return cast(redis.asyncio.Redis, cluster)
    client: redis.asyncio.Redis = AsyncLedgerRedis.from_url(settings.url, **_timeouts(settings))
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
    Failures that waiting cannot fix (a wrong password, a TLS certificate that does not verify,
    an unknown host) raise :class:`ServiceRejected` instead, so nobody waits ten minutes for them.
    """
    try:
        yield
    except _UNAVAILABLE as exc:
        reason = permanent_reason(exc)
        if reason is not None:
            raise ServiceRejected(f"Redis: {reason}; fix --redis-url / {ENV_URL}", field=ENV_URL) from None
        raise LedgerUnavailable(f"{what}: {type(exc).__name__}: {exc}") from exc


def permanent_reason(exc: BaseException) -> str | None:
    """Why a Redis client error cannot be fixed by waiting, or None for an outage (refused
    connection, timeout, a server still loading) that retrying may cure."""
    for e in causes(exc):
        if isinstance(e, redis.exceptions.AuthenticationError) or (
            isinstance(e, redis.exceptions.ResponseError) and str(e).startswith(("WRONGPASS", "NOAUTH"))
        ):
            return "the server refused the password (authentication failed)"
    reason = permanent_network_reason(exc)
    if reason is not None and "certificate" in reason:
        return f"{reason}; give its CA with rediss://host:port/0?ssl_ca_certs=/path/ca.pem"
    if reason is not None and reason.startswith("TLS"):
        return f"{reason}; is the server speaking TLS (rediss://) or not (redis://)?"
    return reason


def control_characters(text: str) -> bool:
    """Whether ``text`` holds a control character (a newline, a tab, NUL, DEL...). Python's ``urlsplit`` drops
    newlines and tabs silently (as browsers do), so a URL with one would be used as another URL: refuse it."""
    return any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in text)


def check_url(url: str) -> None:
    """Refuse a malformed Redis URL (bad scheme, port, IPv6 literal, a control character) with one line;
    never shows the password."""
    if control_characters(url):
        raise ConfigError(
            f"malformed Redis URL {redact_url(url)!r}: it contains a control character (a newline, a tab...)",
            field=ENV_URL,
        )
    try:
        RedisSettings.from_dsn(url)
        redis.Redis.from_url(url)
    except ValueError as exc:
        raise ConfigError(f"malformed Redis URL {redact_url(url)!r}: {exc}", field=ENV_URL) from None


def resolve_url(public_url: str, password_file: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """The URL to connect with, for a process that was handed a redacted one (``redis://:***@h:p/0``).

    Credentials never travel with work: a worker (or ``status``) gets the URL with ``***`` for the
    password and finds the password itself, from the server's 0600 password file when it is on this
    machine (the embedded ledger), else from its own ``PUNCHLINE_REDIS_URL`` (set on the nodes, like
    the provider keys).
    """
    parts = urlsplit(public_url)
    if parts.password != "***":
        return public_url
    if password_file:
        try:
            password = Path(password_file).read_text().strip()
        except OSError:
            password = ""
        if password:
            user = parts.username or ""
            netloc = parts.netloc.replace(f"{user}:***@", f"{user}:{quote(password, safe='')}@", 1)
            return urlunsplit(parts._replace(netloc=netloc))
    own = REDIS_URL.get(env)
    if own:
        mine = urlsplit(own)
        if (mine.hostname, mine.port, mine.path) == (parts.hostname, parts.port, parts.path):
            return own
    raise ConfigError(
        f"the password of {public_url} is not available in this process: set {ENV_URL} "
        "(with the password) in this machine's environment",
        field=ENV_URL,
    )
