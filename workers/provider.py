"""The provider interface: an LLM endpoint as the workers see it.

Requests, responses and settings are shared vocabulary (``punchline.data.requests`` and
``punchline.data.provider_settings``); implementations live in ``punchline.workers.providers``.
"""

from __future__ import annotations

from typing import Protocol

from punchline.data.provider_settings import ProviderSettings
from punchline.data.requests import ProviderRequest, ProviderResponse


class Provider(Protocol):
    """An LLM endpoint. Implementations convert SDK exceptions into ``punchline.data.errors`` at the boundary:
    :class:`~punchline.data.errors.RetryableProviderError` or :class:`~punchline.data.errors.FatalProviderError`."""

    name: str
    settings: ProviderSettings

    async def complete(self, request: ProviderRequest) -> ProviderResponse: ...

    async def aclose(self) -> None: ...
