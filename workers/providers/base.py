"""The boundary helpers every provider implementation shares (kept apart from the package's factories,
which import the implementations, so that the implementations can import these without a cycle).

SDK exceptions never cross this package: each provider maps them to
:class:`~punchline.data.errors.RetryableProviderError` (429, 408, 409, 5xx, timeouts, connection errors,
malformed bodies) or :class:`~punchline.data.errors.FatalProviderError` (other 4xx), with a message that names
the provider, model and status but never the API key (any echo of it in a body is masked).
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, TypeVar

import httpx2
import msgspec

from punchline.data.errors import FatalProviderError, ProviderError, RetryableProviderError
from punchline.data.provider_settings import ProviderSettings
from punchline.data.requests import ProviderRequest, ProviderResponse, joined

RETRYABLE_STATUSES = frozenset({408, 409, 425, 429})
T = TypeVar("T")
CHOICE_OFFSET_HEADER = "X-Choice-Offset"  # understood by workers.fake.server; ignored by real providers


class MalformedResponse(RetryableProviderError):
    """A 200 whose body has no usable answer (bad JSON, no choices); retried a bounded few times."""


def parse_retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date)."""
    if not headers:
        return None
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def parse_quoted_rpm(headers: Mapping[str, str] | None) -> float | None:
    """The requests-per-minute limit a provider quotes (OpenAI's ``x-ratelimit-limit-requests``,
    Anthropic's ``anthropic-ratelimit-requests-limit``), if any."""
    if not headers:
        return None
    for name in ("x-ratelimit-limit-requests", "anthropic-ratelimit-requests-limit"):
        value = headers.get(name)
        if value:
            try:
                quoted = float(value)
            except ValueError:
                continue
            if quoted > 0:
                return quoted
    return None


def redact(text: str, secret: str) -> str:
    """``text`` with the secret and any recognisable fragment of it masked."""
    if secret and len(secret) >= 8:
        text = text.replace(secret, "***")
        for frag in (secret[:8], secret[-8:]):
            text = text.replace(frag, "***")
    return text


def api_error_message(exc: Any) -> str:
    """The provider's own error message from an SDK ``APIStatusError`` (same body shape for both SDKs)."""
    body = exc.body
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
    return str(exc.message)


def cause_text(exc: BaseException, secret: str) -> str:
    """The root cause of a transport or decoding error, redacted and short."""
    cause = exc.__cause__ or exc.__context__ or exc
    return redact(f"{type(cause).__name__}: {cause}", secret)[:200]


class SdkProvider:
    """What both SDK providers share: the key read once, a bound on calls in flight, a safe repr, and the
    call itself (:meth:`_post`)."""

    sdk: Any  # the SDK module (openai or anthropic): its error classes are converted at the boundary

    def __init__(self, name: str, settings: ProviderSettings) -> None:
        self.name = name
        self.settings = settings
        self._secret = settings.api_key(name)
        # at most ``max_concurrency`` HTTP calls in flight from this provider object (one per worker)
        self._slots = asyncio.Semaphore(max(1, settings.max_concurrency))
        self._client: Any = None
        self._wire: Wire | None = None  # built at the first call (the subclass makes the SDK client)

    def __repr__(self) -> str:  # never the key
        return f"{type(self).__name__}(name={self.name!r}, base_url={self.settings.base_url!r})"

    async def aclose(self) -> None:
        await self._client.close()

    async def _post(self, path: str, body: dict[str, Any], *, offset: int, where: str) -> bytes:
        """One call, its body as sent: straight through the SDK's own HTTP client (its connection pool, its
        timeouts) with the SDK's headers (auth, version, user agent), built once per provider. The SDK's
        ``post`` rebuilt all of that per call (options models, header merging, URL parsing, its auth retry
        layer): a third of a unit's CPU at 0 ms latency (BENCHMARKS.md, the peers' job). Nothing is retried
        here; errors become ours as the SDK's would (:func:`wire_error`). The caller decodes the fields it
        keeps with msgspec (:func:`decode_body`)."""
        wire = self._wire or self._make_wire()
        headers = wire.headers if not offset else {**wire.headers, CHOICE_OFFSET_HEADER: str(offset)}
        request = httpx2.Request(
            "POST", wire.url_of(path), headers=headers, content=_encode(body), extensions=wire.extensions
        )
        async with self._slots:
            try:
                response = await wire.http.send(request)
            except httpx2.TimeoutException:
                raise RetryableProviderError(f"{where}: timed out after {self.settings.timeout_s} s") from None
            except Exception as exc:  # as the SDK did: anything else on the way is a connection failure
                text = redact(f"{type(exc).__name__}: {exc}", self._secret)[:200]
                raise RetryableProviderError(f"{where}: connection failed: {text}") from None
        if response.status_code >= 400:
            message = error_body_message(response.status_code, response.content)
            raise status_error(where, response.status_code, message, response.headers, self._secret)
        return response.content

    def _make_wire(self) -> Wire:
        client = self._client
        headers = httpx2.Headers(client._client.headers)  # the HTTP client's own (accept-encoding...)
        sdk_headers = {**client.default_headers, **client.auth_headers}
        headers.update({k: v for k, v in sdk_headers.items() if isinstance(v, str)})  # not the SDK's Omit markers
        self._wire = Wire(client._client, str(client.base_url), dict(headers.items()), self.settings.timeout_s)
        return self._wire


class Wire:
    """What every call of one provider shares: the SDK's HTTP client, the base URL, headers and timeouts."""

    __slots__ = ("base", "extensions", "headers", "http", "urls")

    def __init__(self, http: httpx2.AsyncClient, base_url: str, headers: dict[str, str], timeout_s: float) -> None:
        self.http = http
        self.base = base_url.rstrip("/")
        self.headers = headers
        self.extensions = {"timeout": httpx2.Timeout(timeout_s).as_dict()}
        self.urls: dict[str, httpx2.URL] = {}

    def url_of(self, path: str) -> httpx2.URL:
        url = self.urls.get(path)
        if url is None:
            url = self.urls[path] = httpx2.URL(f"{self.base}/{path.lstrip('/')}")
        return url


_encode = msgspec.json.Encoder().encode


def error_body_message(status: int, content: bytes) -> str:
    """The provider's own message in an error body (``{"error": {"message": ...}}``, both APIs), else the
    body itself, as the SDKs' ``APIStatusError`` says it."""
    text = content.decode("utf-8", "replace").strip()
    try:
        body: Any = json.loads(text)
    except ValueError:
        body = text
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
    return f"Error code: {status} - {body}"


def decode_body(decoder: msgspec.json.Decoder[T], where: str, body: bytes) -> T:
    """An answer's body decoded into the fields we keep; a body that is not one is a retryable malformed answer."""
    try:
        return decoder.decode(body)
    except msgspec.DecodeError as exc:
        raise MalformedResponse(f"{where}: malformed response: {exc}") from None


def status_error(
    where: str, status: int, message: str, headers: Mapping[str, str] | None, secret: str
) -> ProviderError:
    """The error for an HTTP error status (message from the body, redacted and shortened)."""
    if status in (401, 403):
        detail = "authentication failed: check the API key env var / file of this provider"
    else:
        detail = redact(message, secret)[:200]
    text = f"{where}: HTTP {status}: {detail}"
    if status in RETRYABLE_STATUSES or status >= 500:
        return RetryableProviderError(
            text, status=status, retry_after_s=parse_retry_after(headers), quoted_rpm=parse_quoted_rpm(headers)
        )
    return FatalProviderError(text, status=status)


def _sdk_base(sdk: Any) -> type[Exception]:
    base: type[Exception] = getattr(sdk, "AnthropicError", None) or sdk.OpenAIError
    return base


@contextlib.contextmanager
def sdk_errors(sdk: Any, where: str, secret: str, timeout_s: float) -> Iterator[None]:
    """Both official SDKs raise the same family of errors (``APIStatusError``, ``APITimeoutError``,
    ``APIConnectionError`` under one base class): turn them into ours at the boundary, redacted."""
    try:
        yield
    except sdk.APIStatusError as exc:
        raise status_error(where, exc.status_code, api_error_message(exc), exc.response.headers, secret) from None
    except sdk.APITimeoutError:
        raise RetryableProviderError(f"{where}: timed out after {timeout_s} s") from None
    except sdk.APIConnectionError as exc:
        raise RetryableProviderError(f"{where}: connection failed: {cause_text(exc, secret)}") from None
    except (_sdk_base(sdk), ValueError) as exc:
        raise RetryableProviderError(f"{where}: {redact(str(exc), secret)[:200]}") from None


class SdkBatches:
    """What both SDK batch clients share: the key read once, a client with the SDK's own retries off (a
    create must never be repeated behind our back), a repr without the key, one error boundary."""

    sdk: Any  # the SDK module (openai or anthropic)
    client_class: Any  # its synchronous client
    label = "batches"

    def __init__(self, name: str, settings: ProviderSettings) -> None:
        self.name = name
        self.settings = settings
        self._secret = settings.api_key(name)
        self._client = self.client_class(
            base_url=settings.base_url, api_key=self._secret, max_retries=0, timeout=settings.timeout_s
        )

    def __repr__(self) -> str:  # never the key
        return f"{type(self).__name__}(name={self.name!r}, base_url={self.settings.base_url!r})"

    def _errors(self, what: str) -> contextlib.AbstractContextManager[None]:
        return sdk_errors(self.sdk, f"{self.name} {self.label} ({what})", self._secret, self.settings.timeout_s)

    def close(self) -> None:
        self._client.close()


async def choices(
    request: ProviderRequest, supports_n: bool, call: Callable[[int, int], Awaitable[ProviderResponse]]
) -> ProviderResponse:
    """``request``'s ``n`` choices through ``call(n, choice_offset)``: one call asking for ``n`` where the endpoint
    takes ``n``, else ``n`` calls of one, one after another, each with its own choice offset (``sample_slot * n +
    i``: the simulator's samples differ by it), their texts and tokens concatenated (a failure of any fails all)."""
    if request.n > 1 and not supports_n:
        return joined([await call(1, request.sample_slot * request.n + i) for i in range(request.n)])
    return await call(request.n, request.sample_slot * request.n)
