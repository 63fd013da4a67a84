"""The ``openai`` kind's provider built on ``openai.AsyncOpenAI``: the SDK's client, base URL and headers.

The kind itself uses :class:`~punchline.workers.providers.openai_http.OpenAIProvider` (plain HTTP, no SDK to
import: a worker's and its driver's CPU-second, BENCHMARKS.md); this one stays for code that names it, and for
where the SDK's own settings (its environment variables, its client) are wanted. Both call the same way: the
body from :func:`chat_body`, posted through the HTTP client, decoded by :func:`response_of`.
"""

from __future__ import annotations

import openai

from punchline.data.provider_settings import ProviderSettings
from punchline.workers.providers.base import SdkProvider, Wire
from punchline.workers.providers.openai_http import OpenAIProvider, chat_body, response_of

__all__ = ["OpenAICompatProvider", "chat_body", "response_of"]


class OpenAICompatProvider(OpenAIProvider):
    sdk = openai

    def __init__(self, name: str, settings: ProviderSettings) -> None:
        super().__init__(name, settings)
        self._client = openai.AsyncOpenAI(
            base_url=settings.base_url,
            api_key=self._secret,
            max_retries=0,
            timeout=settings.timeout_s,
        )

    def _make_wire(self) -> Wire:
        return SdkProvider._make_wire(self)

    async def aclose(self) -> None:
        await self._client.close()
