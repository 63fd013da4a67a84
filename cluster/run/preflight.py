"""Checks of a run's services before anything starts: mistakes stop the run at once, outages are waited out.

A wrong password or key, a TLS certificate that does not verify, an unknown host or a malformed URL
is a setting to fix, not an outage: waiting ten minutes cannot cure it. Each check raises
:class:`~punchline.data.errors.ServiceRejected` (one line naming the service and the setting, exit
2) for those, and waits only for refused connections and timeouts.

Providers get a cheap authenticated request that costs nothing (listing models), so a bad key is
found before the first paid call instead of failing every unit, and then the exact endpoint the run
will call gets a request without a model (every API refuses it for free, with 400): a 404 or 405
there means ``base_url`` points at the wrong path, which no unit could ever get past. Both go over
plain HTTP with the headers and URLs the SDKs use (importing an SDK only to check a key costs seconds
before the first call), and several providers are checked at once.

At the start of a run nothing is known to have worked yet, so "nothing answers" is waited out only
for ``PUNCHLINE_START_WAIT_S`` (60 s by default), then it is a mistake to fix (exit 2), not an
outage; so is a server that accepts the connection but never answers as Redis (an HTTP server, a
``rediss://`` URL for a server without TLS). A Redis address on this machine where nothing listens (refused on
the loopback or an address of its own, a unix socket missing or dead) is a wrong port or path, not a server
starting: it is final after ``LOCAL_GRACE_S`` (:func:`nothing_here`).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import httpx2
import structlog

from punchline.cluster.run.store_guard import check_unguarded, redis_identity
from punchline.data.backoff import Backoff, retry_sync
from punchline.data.errors import (
    ConfigError,
    LedgerUnavailable,
    ServiceRejected,
    StoreError,
    causes,
    permanent_network_reason,
)
from punchline.data.provider_settings import ProviderSettings
from punchline.data.settings import START_WAIT_S as START_WAIT
from punchline.data.store import Store
from punchline.schedulers.server.redis_client import ENV_URL, check_url, redact_url
from punchline.schedulers.server.server_checks import Pinger
from punchline.services.local_redis import redis_dir
from punchline.services.redis_folder import embedded_identity
from punchline.workers.providers import kind_of

log = structlog.get_logger("punchline.preflight")

PATIENCE_S = 600.0  # how long an outage (refused, timed out) is waited out before giving up
SERVICE_BACKOFF = Backoff(initial_s=0.5, max_s=10.0)
START_WAIT_ENV = START_WAIT.name
# a server on this machine that is starting accepts connections within this; refused after it, nothing is there
LOCAL_GRACE_S = 2.0


def start_wait_s(env: Mapping[str, str] | None = None) -> float:
    """``PUNCHLINE_START_WAIT_S`` (seconds, > 0), else 60: how long a service that does not answer at
    all is waited for at the start of a run."""
    return START_WAIT.get(env)


class _NoAnswer(Exception):
    """Nothing answered at all (refused, reset, timed out): waited out until the start wait ends."""


def _patiently(
    what: str, attempt: Callable[[], Any], patience_s: float, retry_on: tuple[type[BaseException], ...]
) -> Any:
    return retry_sync(
        attempt,
        retry_on=retry_on,
        backoff=SERVICE_BACKOFF,
        deadline_s=patience_s,
        on_retry=lambda exc, _n, delay: log.warning(
            "service_waiting", service=what, error=str(exc)[:300], retry_in_s=delay
        ),
    )


# --- Redis --------------------------------------------------------------------------------------


def check_redis(url: str, *, patience_s: float | None = None) -> None:
    """The ledger answers PING with these credentials; permanent failures raise at once, and nothing
    answering at all raises ServiceRejected after ``patience_s`` (``PUNCHLINE_START_WAIT_S``)."""
    check_url(url)
    wait_s = start_wait_s() if patience_s is None else patience_s
    where = f"Redis at {redact_url(url)}"
    pinger = Pinger(url)
    started = time.monotonic()

    def ping() -> None:
        try:
            pinger.ping(where)
        except LedgerUnavailable:
            if _listens(url):  # connected, yet no answer in time: not a Redis (or not speaking TLS)
                raise ServiceRejected(
                    f"{where}: something accepts connections there but does not answer as Redis"
                    f"{' over TLS (is the server without TLS? use redis://)' if url.startswith('rediss:') else ''}; "
                    "fix --redis-url",
                    field=ENV_URL,
                ) from None
            nothing = nothing_here(url)  # a wrong port or socket on this machine: final, not an outage
            if nothing is not None and time.monotonic() - started >= LOCAL_GRACE_S:
                raise ServiceRejected(
                    f"{where}: {nothing}; start the server or fix --redis-url", field=ENV_URL
                ) from None
            raise

    try:
        _patiently("redis", ping, wait_s, (LedgerUnavailable,))
    except ServiceRejected as exc:
        detail = exc.detail if exc.detail.startswith(where) else f"{where}: {exc.detail}"
        raise ServiceRejected(detail, field=ENV_URL) from None
    except LedgerUnavailable as exc:
        raise ServiceRejected(
            f"{where}: nothing answers there (waited {wait_s:.0f} s, {START_WAIT_ENV}): start the server or fix "
            f"--redis-url ({str(exc)[-160:]})",
            field=ENV_URL,
        ) from None
    finally:
        pinger.close()


def nothing_here(url: str, timeout_s: float = 2.0) -> str | None:
    """Why nothing can be answering at a Redis URL's address, when that address is on this machine: its unix
    socket is missing (or nobody listens on it), or its host is this machine's (the loopback, one of its own
    addresses) and the connection is refused. None otherwise: a remote server that refuses or times out may be
    restarting or unreachable for a while, and is waited for (``PUNCHLINE_START_WAIT_S``)."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        if not parts.path or not os.path.exists(parts.path):
            return f"no unix socket at {parts.path}"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_s)
            try:
                sock.connect(parts.path)
            except ConnectionRefusedError:
                return f"nothing listens on the unix socket {parts.path}"
            except OSError:
                return None
        return None
    if not parts.hostname or not _on_this_machine(parts.hostname):
        return None
    try:
        port = parts.port or 6379
        with socket.create_connection((parts.hostname, port), timeout=timeout_s):
            return None
    except ConnectionRefusedError:
        return f"connection refused at {parts.hostname}:{port} (this machine: nothing listens on that port)"
    except (OSError, ValueError):
        return None


def _on_this_machine(host: str) -> bool:
    """Whether ``host`` names this machine: a loopback address, or an address one of its interfaces has (a
    socket binds to it)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return False
    for family, _, _, _, address in infos:
        ip = str(address[0])
        with contextlib.suppress(ValueError):
            if ipaddress.ip_address(ip.split("%")[0]).is_loopback:
                return True
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as sock:
                sock.bind((ip, 0))
                return True
        except OSError:
            continue
    return False


def _listens(url: str, timeout_s: float = 2.0) -> bool:
    """Whether a TCP server accepts connections at a redis(s):// URL's address (a unix socket: False)."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        return False
    try:
        with socket.create_connection((parts.hostname, parts.port or 6379), timeout=timeout_s):
            return True
    except OSError:
        return False


# --- the store ----------------------------------------------------------------------------------

# S3 error codes that no amount of waiting fixes, with the setting to look at
_S3_PERMANENT = {
    "InvalidAccessKeyId": "the access key id is unknown: fix AWS_ACCESS_KEY_ID",
    "SignatureDoesNotMatch": "the secret key is wrong: fix AWS_SECRET_ACCESS_KEY",
    "AccessDenied": "access denied: the credentials may not use this bucket (AWS_ACCESS_KEY_ID / the role's policy)",
    "AllAccessDisabled": "access to the bucket is disabled",
    "ExpiredToken": "the session token has expired: refresh AWS_SESSION_TOKEN",
    "InvalidToken": "the session token is invalid: fix AWS_SESSION_TOKEN",
    "TokenRefreshRequired": "the session token has expired: refresh AWS_SESSION_TOKEN",
    "NoSuchBucket": "no such bucket: fix --store / PUNCHLINE_STORE",
    "InvalidBucketName": "not a valid bucket name: fix --store / PUNCHLINE_STORE",
    "PermanentRedirect": "the bucket is in another region: set AWS_DEFAULT_REGION",
    "AuthorizationHeaderMalformed": "the region is wrong for this bucket: set AWS_DEFAULT_REGION",
}


def store_failure(exc: BaseException) -> str | None:
    """Why a store operation failed for good (credentials, bucket, TLS, host), else None."""
    for e in causes(exc):
        name = type(e).__name__
        if name in ("NoCredentialsError", "PartialCredentialsError"):
            return "no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or a profile or role)"
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            code = str(response.get("Error", {}).get("Code", ""))
            if code in _S3_PERMANENT:
                return _S3_PERMANENT[code]
            status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
            if status in (401, 403):
                return f"the credentials were refused ({code or status}): fix AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"
        if isinstance(e, PermissionError):
            return f"permission denied: {getattr(e, 'filename', '') or e}"
        if isinstance(e, (NotADirectoryError, FileExistsError, IsADirectoryError)):
            return f"a file stands where a folder is needed: {getattr(e, 'filename', '') or e}"
    reason = permanent_network_reason(exc)
    if reason is not None:
        return f"{reason}: fix the endpoint (PUNCHLINE_S3_ENDPOINT_URL / AWS_ENDPOINT_URL) or AWS_CA_BUNDLE"
    return None


def _check_bucket(store: Store) -> None:
    """An S3 store's bucket exists and these credentials may use it (a GET of a missing key in a
    missing bucket looks like a missing key: ask about the bucket itself)."""
    client, bucket = getattr(store, "client", None), getattr(store, "bucket", None)
    if client is None or bucket is None:
        return
    import botocore.exceptions  # lazy: botocore takes a second to import; only an S3 store needs it

    try:
        client.head_bucket(Bucket=bucket)
    except botocore.exceptions.ClientError as exc:
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if status == 404:
            raise ServiceRejected(f"store {store.url}: {_S3_PERMANENT['NoSuchBucket']}", field="--store") from None
        raise StoreError(f"store {store.url}: cannot use bucket {bucket}: {exc}") from exc
    except botocore.exceptions.BotoCoreError as exc:
        raise StoreError(f"store {store.url}: cannot reach bucket {bucket}: {exc}") from exc


def read_store(store: Store, key: str, *, patience_s: float = PATIENCE_S) -> bytes | None:
    """``store.get(key)`` as the run's first touch of the store: permanent failures raise
    ServiceRejected at once, outages are waited out."""

    def attempt() -> bytes | None:
        try:
            _check_bucket(store)
            return store.get(key)
        except (StoreError, OSError) as exc:
            reason = store_failure(exc)
            if reason is not None:
                raise ServiceRejected(f"store {store.url}: {reason}", field="--store") from None
            raise StoreError(f"store {store.url}: {exc}") from exc

    return _patiently("store", attempt, patience_s, (StoreError,))


def check_store_ledger(store: Store, redis_url: str | None, runs_dir: str) -> None:
    """The store is not guarded by another ledger right now (``cluster/run/store_guard.py``), checked before the runs
    folder or the ledger is created: a refused run leaves nothing behind. ``redis_url`` None: the runs folder's own."""
    identity = redis_identity(redis_url) if redis_url else embedded_identity(redis_dir(runs_dir))
    check_unguarded(store, identity)


# --- providers ----------------------------------------------------------------------------------


def key_setting(name: str, settings: ProviderSettings) -> str:
    """Where the provider's key comes from, as a user would fix it."""
    if settings.api_key_env:
        return f"providers.{name}.api_key_env ({settings.api_key_env})"
    if settings.api_key_file:
        return f"providers.{name}.api_key_file ({settings.api_key_file})"
    return f"providers.{name}.api_key_env"


def _list_models_once(
    name: str, settings: ProviderSettings, key: str, timeout_s: float, where: str, file: str | None
) -> str:
    """One try at listing the provider's models: ``ok``, a note when it answers without a listing, a
    :class:`ServiceRejected` when the answer says the run cannot work, :class:`_NoAnswer` when nothing answers
    (tried again until the start wait is over)."""
    try:
        _list_models(settings, key, timeout_s)
    except (httpx2.InvalidURL, httpx2.UnsupportedProtocol) as exc:  # nothing to wait for: the URL is wrong
        raise ServiceRejected(
            f"{where}: not a usable URL ({exc}): fix base_url", record=f"providers.{name}", field="base_url"
        ) from None
    except Exception as exc:
        status = getattr(exc, "status_code", None)
        _reject_status(name, settings, where, status, file, "GET models")
        reason = permanent_network_reason(exc)
        if reason is not None:
            raise ServiceRejected(
                f"{where}: {reason}: fix base_url", record=f"providers.{name}", field="base_url"
            ) from None
        if status is None:  # no HTTP answer at all: refused, reset or timed out
            raise _NoAnswer(type(exc).__name__) from exc
        return f"models not listed (HTTP {status})"
    return "ok"


def check_provider(
    name: str,
    settings: ProviderSettings,
    *,
    key_required: bool,
    file: str | None = None,
    timeout_s: float = 10.0,
    wait_s: float | None = None,
) -> str:
    """Key present and accepted (listing models, free), the endpoint the run calls exists (a request
    without a model, refused for free), and something answers at all within ``wait_s``
    (``PUNCHLINE_START_WAIT_S``).

    Returns a note when the endpoint could not be asked fully (no model listing): the run goes on.
    ``key_required`` is false when the workers read keys from other machines' environments (a Ray
    cluster): a key missing here is then not an error.
    """
    try:
        key = settings.api_key(name)
    except ConfigError:
        if key_required:
            raise
        return "key not available on the driver; not checked"
    where = f"provider {name} ({settings.base_url or 'the default endpoint'})"
    if not key.isascii() or not key.isprintable():  # no HTTP header can carry it: no API could accept it
        raise ServiceRejected(
            f"{where}: the API key has characters no HTTP header can carry (a second line? non-ASCII?): "
            f"fix {key_setting(name, settings)}",
            file=file,
            record=f"providers.{name}",
        )
    if kind_of(settings.kind).models_path is None:  # a kind that routes by model (litellm): no one endpoint
        return f"kind {settings.kind} has no free check; key read, endpoint not asked"
    wait = start_wait_s() if wait_s is None else wait_s

    def list_models() -> str:
        return _list_models_once(name, settings, key, timeout_s, where, file)

    try:
        note = retry_sync(
            list_models,
            retry_on=(_NoAnswer,),
            backoff=SERVICE_BACKOFF,
            deadline_s=wait,
            on_retry=lambda exc, _n, delay: log.warning(
                "service_waiting", service=f"provider {name}", error=str(exc), retry_in_s=delay
            ),
        )
    except _NoAnswer as exc:
        raise ServiceRejected(
            f"{where}: nothing answers there (waited {wait:.0f} s, {START_WAIT_ENV}; {exc}): start it or fix base_url",
            record=f"providers.{name}",
            field="base_url",
        ) from None
    _reject_status(name, settings, where, _probe_endpoint(settings, key, timeout_s), file, "POST")
    return note


def check_providers(
    providers: Mapping[str, ProviderSettings], *, key_required: bool, file: str | None = None
) -> dict[str, str]:
    """:func:`check_provider` for each provider, at once (threads: each check mostly waits on the
    network); their notes by name. The first provider's failure in config order is raised, so the one
    line a user sees does not depend on which answer came first."""
    if len(providers) <= 1:
        return {n: check_provider(n, s, key_required=key_required, file=file) for n, s in providers.items()}
    with ThreadPoolExecutor(max_workers=len(providers), thread_name_prefix="preflight") as pool:
        futures = {
            n: pool.submit(check_provider, n, s, key_required=key_required, file=file) for n, s in providers.items()
        }
        return {n: f.result() for n, f in futures.items()}


def _reject_status(
    name: str, settings: ProviderSettings, where: str, status: int | None, file: str | None, what: str
) -> None:
    """ServiceRejected for an answer that says the settings are wrong: a refused key, a wrong path."""
    if status in (401, 403):
        raise ServiceRejected(
            f"{where} refused the API key (HTTP {status}): fix {key_setting(name, settings)}",
            file=file,
            record=f"providers.{name}",
        )
    if status == 400 and what == "GET models":  # no API refuses a plain GET of its models as malformed
        raise ServiceRejected(
            f"{where} answers HTTP 400 to GET models: is base_url an API of kind {settings.kind!r}? fix base_url",
            file=file,
            record=f"providers.{name}",
            field="base_url",
        )
    if status in (404, 405) and what == "POST":
        raise ServiceRejected(
            f"{where} answers HTTP {status} at POST {kind_of(settings.kind).call_path}, the endpoint every unit calls: "
            "fix base_url",
            file=file,
            record=f"providers.{name}",
            field="base_url",
        )


def _probe_endpoint(settings: ProviderSettings, key: str, timeout_s: float) -> int | None:
    """The HTTP status the run's endpoint gives a request without a model (free: refused before any
    work), or None when it could not be asked."""
    try:
        with _client(settings, key, timeout_s) as client:
            return client.post(_url(settings, kind_of(settings.kind).call_path or ""), json={}).status_code
    except (httpx2.HTTPError, httpx2.InvalidURL):
        return None


def base_url(settings: ProviderSettings) -> str:
    """The base URL the provider's SDK would call: ``base_url``, else the SDK's environment variable (the
    kind's ``base_url_env``), else its public API (``default_base_url``)."""
    kind = kind_of(settings.kind)
    env = os.environ.get(kind.base_url_env) if kind.base_url_env else None
    return settings.base_url or env or kind.default_base_url or ""


def _url(settings: ProviderSettings, path: str) -> str:
    """``path`` under the base URL, joined as the SDKs join it (the base's path kept, one slash)."""
    return base_url(settings).rstrip("/") + "/" + path.lstrip("/")


def _headers(settings: ProviderSettings, key: str) -> dict[str, str]:
    """The authentication headers the provider's SDK sends."""
    return kind_of(settings.kind).headers(key)


def _client(settings: ProviderSettings, key: str, timeout_s: float) -> httpx2.Client:
    """A plain HTTP client with the SDK's headers: loading an SDK only to check a key costs seconds."""
    return httpx2.Client(headers=_headers(settings, key), timeout=timeout_s, follow_redirects=True)


class _HttpStatus(Exception):
    """A non-2xx answer to GET models (``status_code`` as the SDKs' errors carry it)."""

    def __init__(self, status_code: int) -> None:
        super().__init__(f"HTTP {status_code}")
        self.status_code = status_code


def _list_models(settings: ProviderSettings, key: str, timeout_s: float) -> None:
    """GET the provider's models (free, authenticated); a non-2xx answer raises with its status."""
    with _client(settings, key, timeout_s) as client:
        status = client.get(_url(settings, kind_of(settings.kind).models_path or "")).status_code
    if not 200 <= status < 300:
        raise _HttpStatus(status)
