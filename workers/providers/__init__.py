"""Provider implementations, and the boundary helpers they share.

SDK exceptions never cross this package: each provider maps them to
:class:`~data.errors.RetryableProviderError` (429, 408, 409, 5xx, timeouts, connection errors,
malformed bodies) or :class:`~data.errors.FatalProviderError` (other 4xx), with a message that names
the provider, model and status but never the API key (any echo of it in a body is masked).
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping

from data.errors import ConfigError, FatalProviderError, ProviderError, RetryableProviderError
from workers.provider import Provider, ProviderRequest, ProviderSettings

RETRYABLE_STATUSES = frozenset({408, 409, 425, 429})
CHOICE_OFFSET_HEADER = "X-Choice-Offset"  # understood by workers.fake.server; ignored by real providers


class MalformedResponse(RetryableProviderError):
    """A 200 whose body has no usable answer (bad JSON, no choices); retried a bounded few times."""


def make_provider(name: str, settings: ProviderSettings) -> Provider:
    """The provider of ``settings.kind`` named ``name`` (the ``[providers.<name>]`` table)."""
    if settings.kind == "openai":
        from workers.providers.openai_compat import OpenAICompatProvider

        return OpenAICompatProvider(name, settings)
    if settings.kind == "anthropic":
        from workers.providers.anthropic import AnthropicProvider

        return AnthropicProvider(name, settings)
    raise ConfigError(f"unknown provider kind {settings.kind!r}", record=f"providers.{name}", field="kind")


def wire_calls(settings: ProviderSettings, request: ProviderRequest) -> int:
    """How many HTTP calls one ``complete(request)`` makes: ``n`` when the provider cannot return
    ``n`` choices in one call (``supports_n = false``, or any Anthropic provider), else 1."""
    if request.n > 1 and (not settings.supports_n or settings.kind == "anthropic"):
        return request.n
    return 1


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


def redact(text: str, secret: str) -> str:
    """``text`` with the secret and any recognisable fragment of it masked."""
    if secret and len(secret) >= 8:
        text = text.replace(secret, "***")
        for frag in (secret[:8], secret[-8:]):
            text = text.replace(frag, "***")
    return text


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
        return RetryableProviderError(text, status=status, retry_after_s=parse_retry_after(headers))
    return FatalProviderError(text, status=status)


__all__ = [
    "CHOICE_OFFSET_HEADER",
    "MalformedResponse",
    "make_provider",
    "parse_retry_after",
    "redact",
    "status_error",
    "wire_calls",
]
