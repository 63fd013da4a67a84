"""Provider implementations, and the factories that pick one by ``kind``.

SDK exceptions never cross this package: each provider maps them to
:class:`~punchline.data.errors.RetryableProviderError` (429, 408, 409, 5xx, timeouts, connection errors,
malformed bodies) or :class:`~punchline.data.errors.FatalProviderError` (other 4xx), with a message that names
the provider, model and status but never the API key (any echo of it in a body is masked). The helpers the
implementations share live in :mod:`punchline.workers.providers.base` (so they never import this module).

The factories import an implementation only when asked for it: the openai and anthropic SDKs take
seconds to import (measured: 2-9 s of `punchline --help` on a loaded 2-core machine), which every command,
the fake provider and the planner would otherwise pay without calling a provider.
"""

from __future__ import annotations

from punchline.data.errors import ConfigError
from punchline.data.provider_settings import ProviderSettings
from punchline.workers.batch_provider import BatchProvider
from punchline.workers.provider import Provider
from punchline.workers.providers.base import (
    CALL_PATHS,
    CHOICE_OFFSET_HEADER,
    MalformedResponse,
    SdkBatches,
    SdkProvider,
    decode_body,
    parse_retry_after,
    redact,
    sdk_errors,
    status_error,
    wire_calls,
)

# each kind's implementation module (it imports the kind's SDK)
IMPLEMENTATIONS = {
    "openai": "punchline.workers.providers.openai_compat",
    "anthropic": "punchline.workers.providers.anthropic",
}


def make_provider(name: str, settings: ProviderSettings) -> Provider:
    """The provider of ``settings.kind`` named ``name`` (the ``[providers.<name>]`` table)."""
    if settings.kind == "openai":
        from punchline.workers.providers.openai_compat import OpenAICompatProvider  # lazy: the openai SDK

        return OpenAICompatProvider(name, settings)
    if settings.kind == "anthropic":
        from punchline.workers.providers.anthropic import AnthropicProvider  # lazy: the anthropic SDK

        return AnthropicProvider(name, settings)
    raise ConfigError(f"unknown provider kind {settings.kind!r}", record=f"providers.{name}", field="kind")


def make_batch_provider(name: str, settings: ProviderSettings) -> BatchProvider:
    """The batch API client of ``settings.kind`` (see :mod:`punchline.workers.batch_provider`)."""
    if settings.kind == "openai":
        from punchline.workers.providers.batch_openai import OpenAIBatches  # lazy: the openai SDK

        return OpenAIBatches(name, settings)
    if settings.kind == "anthropic":
        from punchline.workers.providers.batch_anthropic import AnthropicBatches  # lazy: the anthropic SDK

        return AnthropicBatches(name, settings)
    raise ConfigError(f"unknown provider kind {settings.kind!r}", record=f"providers.{name}", field="kind")


__all__ = [
    "CALL_PATHS",
    "CHOICE_OFFSET_HEADER",
    "IMPLEMENTATIONS",
    "MalformedResponse",
    "SdkBatches",
    "SdkProvider",
    "decode_body",
    "make_batch_provider",
    "make_provider",
    "parse_retry_after",
    "redact",
    "sdk_errors",
    "status_error",
    "wire_calls",
]
