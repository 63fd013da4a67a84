"""The checkpoint store on S3 (or any S3-compatible server: MinIO, moto, R2...).

``put(..., if_absent=True)`` is a conditional write (``If-None-Match: *``): S3 decides atomically
which of several concurrent writers wins (the losers get 412). Servers that do not implement
conditional writes (older MinIO/Ceph) answer 501/NotImplemented; then we fall back to HEAD-then-PUT,
which has a race window: two writers that both HEAD before either PUTs both "win", and the later
PUT replaces the earlier. Shard outputs are deterministic for a unit, so that costs a duplicate
write, not a wrong result, but the ledger (Redis), not the store, must then be the referee.

One more corner of conditional writes: if a PUT times out after S3 stored it, botocore's retry
gets 412 and ``put`` reports False although our bytes are there. Callers that care compare the
stored bytes with theirs (``get(key) == data``) instead of trusting the flag alone.

**Outages are waited out**, as Redis outages are: a connection error, a timeout or a 5xx (after
botocore's own few quick retries) makes the operation retry with backoff for up to
``S3Settings.outage_s`` (``PUNCHLINE_S3_OUTAGE_S``, 10 minutes by default) before it raises
:class:`StoreError`. The caller blocks meanwhile, so a worker that has paid for an answer holds it
in memory, its leases kept alive by their heartbeats, until the store accepts it: an outage costs
time, not calls. Errors that waiting cannot fix (403, 404 bucket, bad keys) raise at once.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

import boto3
import botocore.exceptions
import msgspec
import structlog
from botocore.config import Config

from punchline.data.backoff import Backoff, retry_sync
from punchline.data.errors import ConfigError, StoreError
from punchline.data.settings import S3_ADDRESSING_STYLE, S3_ENDPOINT_URL, S3_OUTAGE_S, EnvVar, env_values
from punchline.data.store import Store
from punchline.data.stores.local import validate_key, validate_prefix

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client

_NOT_IMPLEMENTED = {"NotImplemented", "InvalidArgument", "InvalidRequest"}
_MISSING = {"404", "NoSuchKey", "NotFound"}
# Answers that mean "the service is unwell, ask again later" (besides any 5xx).
_TRANSIENT_CODES = {"SlowDown", "InternalError", "ServiceUnavailable", "RequestTimeout", "RequestTimeTooSkewed"}

log = structlog.get_logger("punchline.store.s3")
T = TypeVar("T")
# the fields of S3Settings the environment sets (the variables are defined in punchline.data.settings)
S3_ENV: dict[str, EnvVar[Any]] = {
    "endpoint_url": S3_ENDPOINT_URL,
    "addressing_style": S3_ADDRESSING_STYLE,
    "outage_s": S3_OUTAGE_S,
}


class S3Settings(msgspec.Struct, frozen=True, kw_only=True):
    """How to reach S3. Secrets are never stored here: only the *names* of the environment
    variables holding them (defaults: the standard AWS ones, which boto3's own chain also reads,
    together with ~/.aws, SSO and instance/pod roles)."""

    endpoint_url: str | None = None
    region: str | None = None
    access_key_id_env: str = "AWS_ACCESS_KEY_ID"
    secret_access_key_env: str = "AWS_SECRET_ACCESS_KEY"
    session_token_env: str = "AWS_SESSION_TOKEN"
    addressing_style: str = S3_ADDRESSING_STYLE.default
    max_attempts: int = 5  # botocore's own quick retries of one operation
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 30.0
    outage_s: float = S3_OUTAGE_S.default  # how long an operation waits out connection errors and 5xx before it fails
    retry_initial_s: float = 0.5  # first pause between those retries, doubled up to retry_max_s
    retry_max_s: float = 10.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> S3Settings:
        """``PUNCHLINE_S3_ENDPOINT_URL`` (else ``AWS_ENDPOINT_URL``), ``AWS_DEFAULT_REGION``
        (else ``AWS_REGION``), ``PUNCHLINE_S3_ADDRESSING_STYLE``, ``PUNCHLINE_S3_OUTAGE_S``
        (:mod:`punchline.data.settings`)."""
        source = os.environ if env is None else env
        region = source.get("AWS_DEFAULT_REGION") or source.get("AWS_REGION") or None
        return cls(region=region, **env_values(S3_ENV, env))

    def make_client(self) -> S3Client:
        config = Config(
            retries={"mode": "standard", "max_attempts": self.max_attempts},
            connect_timeout=self.connect_timeout_s,
            read_timeout=self.read_timeout_s,
            s3={"addressing_style": self.addressing_style},  # type: ignore[arg-type]
        )
        kwargs: dict[str, Any] = {}
        key_id = os.environ.get(self.access_key_id_env)
        secret = os.environ.get(self.secret_access_key_env)
        if key_id and secret:
            kwargs = {"aws_access_key_id": key_id, "aws_secret_access_key": secret}
            token = os.environ.get(self.session_token_env)
            if token:
                kwargs["aws_session_token"] = token
        # else: boto3's default chain (profiles, SSO, IMDS, IRSA/pod identity).
        session = boto3.session.Session()  # sessions are not thread-safe; clients are
        try:
            return session.client(
                "s3", endpoint_url=self.endpoint_url, region_name=self.region, config=config, **kwargs
            )
        except (botocore.exceptions.BotoCoreError, ValueError) as exc:
            raise ConfigError(f"cannot create an S3 client: {exc}") from exc


def _code(exc: botocore.exceptions.ClientError) -> tuple[str, int]:
    error = exc.response.get("Error", {})
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    return str(error.get("Code", "")), int(status or 0)


def transient(exc: BaseException) -> bool:
    """Whether waiting may help: S3 unreachable (connection refused/reset, timeouts, a body cut
    short) or unwell (5xx, SlowDown). Credentials, permissions and missing buckets are not."""
    if isinstance(exc, botocore.exceptions.ClientError):
        code, status = _code(exc)
        return status >= 500 or code in _TRANSIENT_CODES
    return isinstance(
        exc,
        (
            botocore.exceptions.ConnectionError,  # EndpointConnectionError, ConnectionClosedError, timeouts, proxy
            botocore.exceptions.HTTPClientError,
            botocore.exceptions.IncompleteReadError,
            botocore.exceptions.ResponseStreamingError,
        ),
    )


class S3Store(Store):
    """Keys live under ``s3://bucket/prefix/``. Picklable (the client is rebuilt on the other side),
    so a store can be handed to Ray actors as-is."""

    def __init__(self, bucket: str, prefix: str, settings: S3Settings) -> None:
        if not bucket:
            raise ConfigError("S3 store URL needs a bucket: s3://bucket/prefix")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.settings = settings
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self._client: S3Client | None = None
        self._lock = threading.Lock()
        self._conditional_puts = True  # until the server says it cannot do them

    @classmethod
    def from_url(cls, url: str, settings: S3Settings) -> S3Store:
        parts = urlsplit(url)
        if parts.scheme != "s3":
            raise ConfigError(f"not an s3:// URL: {url!r}")
        return cls(parts.netloc, parts.path, settings)

    def __repr__(self) -> str:
        return f"S3Store({self.url!r}, endpoint={self.settings.endpoint_url!r})"

    def __reduce__(self) -> tuple[type[S3Store], tuple[str, str, S3Settings]]:
        return (S3Store, (self.bucket, self.prefix, self.settings))

    @property
    def client(self) -> S3Client:
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = self.settings.make_client()
        return self._client

    def _object_key(self, key: str) -> str:
        validate_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _fail(self, action: str, key: str, exc: Exception) -> StoreError:
        return StoreError(f"{self.url}: cannot {action} {key!r}: {exc}")

    def _patiently(self, action: str, key: str, op: Callable[[], T]) -> T:
        """Run ``op``, retrying transient failures with backoff for up to ``settings.outage_s``."""
        started = time.monotonic()

        def warn(exc: BaseException, attempts: int, _delay_s: float) -> None:
            if attempts == 1 or attempts % 10 == 0:
                log.warning("s3_unavailable", store=self.url, action=action, key=key, error=str(exc)[:300])

        try:
            return retry_sync(
                op,
                retry_on=(botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError),
                when=transient,
                backoff=Backoff(initial_s=self.settings.retry_initial_s, max_s=self.settings.retry_max_s),
                deadline_s=self.settings.outage_s,
                on_retry=warn,
            )
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
            if not transient(exc):
                raise self._fail(action, key, exc) from exc
            waited = time.monotonic() - started
            raise StoreError(
                f"{self.url}: cannot {action} {key!r}: S3 unreachable or failing for "
                f"{waited:.0f}s (PUNCHLINE_S3_OUTAGE_S={self.settings.outage_s:g}): {exc}"
            ) from exc

    # -- Store --

    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> bool:
        name = self._object_key(key)
        body = bytes(data)
        return self._patiently("write", key, lambda: self._put(name, body, if_absent))

    def _put(self, name: str, body: bytes, if_absent: bool) -> bool:
        if not if_absent:
            self.client.put_object(Bucket=self.bucket, Key=name, Body=body)
            return True
        if self._conditional_puts:
            result = self._put_if_none_match(name, body)
            if result is not None:
                return result
            self._conditional_puts = False
        # Fallback for servers without conditional writes; racy, see the module docstring.
        if self._head(name):
            return False
        self.client.put_object(Bucket=self.bucket, Key=name, Body=body)
        return True

    def _put_if_none_match(self, name: str, body: bytes) -> bool | None:
        """True if we wrote, False if someone was first, None if the server cannot do it."""
        for _ in range(5):
            try:
                self.client.put_object(Bucket=self.bucket, Key=name, Body=body, IfNoneMatch="*")
                return True
            except botocore.exceptions.ClientError as exc:
                code, status = _code(exc)
                if status == 412 or code == "PreconditionFailed":
                    return False
                if status == 409 and code == "ConditionalRequestConflict":
                    continue  # a concurrent conditional write is in flight: ask again
                if status == 501 or code in _NOT_IMPLEMENTED:
                    return None
                raise
        # Still conflicting after retries: whoever is writing will win, so we did not.
        return False

    def _head(self, name: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=name)
            return True
        except botocore.exceptions.ClientError as exc:
            code, status = _code(exc)
            if status == 404 or code in _MISSING:
                return False
            raise

    def get(self, key: str) -> bytes | None:
        name = self._object_key(key)

        def read() -> bytes | None:
            try:
                response = self.client.get_object(Bucket=self.bucket, Key=name)
                return response["Body"].read()
            except botocore.exceptions.ClientError as exc:
                code, status = _code(exc)
                if status == 404 or code in _MISSING:
                    return None
                raise

        return self._patiently("read", key, read)

    def exists(self, key: str) -> bool:
        name = self._object_key(key)
        return self._patiently("check", key, lambda: self._head(name))

    def list(self, prefix: str = "") -> Iterator[str]:
        """Keys under ``prefix``, sorted (S3 lists in UTF-8 byte order, which is code point order)."""
        validate_prefix(prefix)
        root = f"{self.prefix}/" if self.prefix else ""

        def listing() -> list[str]:
            keys: list[str] = []
            paginator = self.client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=root + prefix):
                for item in page.get("Contents", []):
                    keys.append(item["Key"][len(root) :])
            return keys

        keys = self._patiently("list", prefix, listing)
        keys.sort()
        return iter(keys)

    def delete(self, key: str) -> None:
        name = self._object_key(key)
        self._patiently("delete", key, lambda: self.client.delete_object(Bucket=self.bucket, Key=name))
