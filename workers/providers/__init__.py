"""Provider implementations, and the factories that pick one by ``kind`` (:mod:`.registry`: an entry point of
the ``punchline.providers`` group names each kind's :class:`~punchline.workers.provider.ProviderKind`).

SDK exceptions never cross this package: each provider maps them to
:class:`~punchline.data.errors.RetryableProviderError` (429, 408, 409, 5xx, timeouts, connection errors,
malformed bodies) or :class:`~punchline.data.errors.FatalProviderError` (other 4xx), with a message that names
the provider, model and status but never the API key (any echo of it in a body is masked). The helpers the
implementations share live in :mod:`punchline.workers.providers.base` (so they never import this module).

The factories import an implementation only when asked for it (the kind object names it as a string): the
openai and anthropic SDKs take seconds to import (measured: 2-9 s of `punchline --help` on a loaded 2-core
machine; litellm more), which every command, the fake provider and the planner would otherwise pay without
calling a provider.
"""

from __future__ import annotations

from punchline.data.provider_settings import ProviderSettings
from punchline.data.requests import ProviderRequest
from punchline.workers.providers.base import (
    CHOICE_OFFSET_HEADER,
    MalformedResponse,
    SdkBatches,
    SdkProvider,
    decode_body,
    parse_retry_after,
    redact,
    sdk_errors,
    status_error,
)
from punchline.workers.providers.registry import (
    check_kind,
    installed_kinds,
    kind_of,
    make_batch_provider,
    make_provider,
)


def wire_calls(settings: ProviderSettings, request: ProviderRequest) -> int:
    """How many HTTP calls one ``complete(request)`` makes: ``n`` when the provider cannot return ``n``
    choices in one call (``supports_n = false``, or a kind that never can, such as anthropic), else 1."""
    return kind_of(settings.kind).wire_calls(settings, request.n)


__all__ = [
    "CHOICE_OFFSET_HEADER",
    "MalformedResponse",
    "SdkBatches",
    "SdkProvider",
    "check_kind",
    "decode_body",
    "installed_kinds",
    "kind_of",
    "make_batch_provider",
    "make_provider",
    "parse_retry_after",
    "redact",
    "sdk_errors",
    "status_error",
    "wire_calls",
]
