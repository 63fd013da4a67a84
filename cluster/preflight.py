"""Checks of a run's services before anything starts: mistakes stop the run at once, outages are waited out.

A wrong password or key, a TLS certificate that does not verify, an unknown host or a malformed URL
is a setting to fix, not an outage: waiting ten minutes cannot cure it. Each check raises
:class:`~punchline.data.errors.ServiceRejected` (one line naming the service and the setting, exit
2) for those, and waits only for refused connections and timeouts.

Providers get a cheap authenticated request that costs nothing (listing models), so a bad key is
found before the first paid call instead of failing every unit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog

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
from punchline.data.store import Store

log = structlog.get_logger("punchline.preflight")

PATIENCE_S = 600.0  # how long an outage (refused, timed out) is waited out before giving up
SERVICE_BACKOFF = Backoff(initial_s=0.5, max_s=10.0)


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


def check_redis(url: str, *, patience_s: float = PATIENCE_S) -> None:
    """The ledger answers PING with these credentials; permanent failures raise at once."""
    from punchline.schedulers.redis_client import ENV_URL, check_url, connect, redact_url, redis_errors

    check_url(url)
    client = connect(url)

    def ping() -> None:
        with redis_errors(f"Redis at {redact_url(url)}"):
            client.ping()

    try:
        _patiently("redis", ping, patience_s, (LedgerUnavailable,))
    except ServiceRejected as exc:
        raise ServiceRejected(f"Redis at {redact_url(url)}: {exc.detail}", field=ENV_URL) from None
    except LedgerUnavailable as exc:
        raise LedgerUnavailable(f"gave up after {patience_s:.0f} s: {exc}") from None
    finally:
        client.close()


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
    import botocore.exceptions

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


# --- providers ----------------------------------------------------------------------------------


def key_setting(name: str, settings: ProviderSettings) -> str:
    """Where the provider's key comes from, as a user would fix it."""
    if settings.api_key_env:
        return f"providers.{name}.api_key_env ({settings.api_key_env})"
    if settings.api_key_file:
        return f"providers.{name}.api_key_file ({settings.api_key_file})"
    return f"providers.{name}.api_key_env"


def check_provider(
    name: str, settings: ProviderSettings, *, key_required: bool, file: str | None = None, timeout_s: float = 10.0
) -> str:
    """Key present and accepted: one authenticated request that costs nothing (listing models).

    Returns a note when the endpoint could not be asked (no model listing, down for the moment):
    the run goes on and waits out outages itself. ``key_required`` is false when the workers read
    keys from other machines' environments (a Ray cluster): a key missing here is then not an error.
    """
    try:
        key = settings.api_key(name)
    except ConfigError:
        if key_required:
            raise
        return "key not available on the driver; not checked"
    where = f"provider {name} ({settings.base_url or 'the default endpoint'})"
    try:
        _list_models(settings, key, timeout_s)
    except Exception as exc:
        status = getattr(exc, "status_code", None)
        if status in (401, 403):
            raise ServiceRejected(
                f"{where} refused the API key (HTTP {status}): fix {key_setting(name, settings)}",
                file=file,
                record=f"providers.{name}",
            ) from None
        reason = permanent_network_reason(exc)
        if reason is not None:
            raise ServiceRejected(
                f"{where}: {reason}: fix base_url", record=f"providers.{name}", field="base_url"
            ) from None
        return f"not checked ({type(exc).__name__}{f' {status}' if status else ''})"
    return "ok"


def _list_models(settings: ProviderSettings, key: str, timeout_s: float) -> None:
    if settings.kind == "anthropic":
        import anthropic

        with anthropic.Anthropic(api_key=key, base_url=settings.base_url, max_retries=0, timeout=timeout_s) as client:
            client.models.list(limit=1)
        return
    import openai

    with openai.OpenAI(api_key=key, base_url=settings.base_url, max_retries=0, timeout=timeout_s) as client:
        client.models.list()
