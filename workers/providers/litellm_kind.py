"""The ``litellm`` kind: every API LiteLLM reaches (Gemini, Bedrock, Vertex, Mistral, Ollama, any
OpenAI-compatible server...) through ``litellm.acompletion``. An optional extra: ``pip install punchline[litellm]``.

This module is the whole kind (what a third party's kind looks like): :data:`KIND`, registered as the
``litellm`` entry point of ``punchline.providers``, and the provider it makes. The model id carries LiteLLM's
route (``id = "gemini/gemini-2.0-flash"``, ``"bedrock/anthropic.claude-3-haiku..."``, ``"openai/<name>"`` for
an OpenAI-compatible ``base_url``, passed as ``api_base``). The key: ``api_key_env``/``api_key_file`` when set,
else LiteLLM reads its usual variables (``GEMINI_API_KEY``, AWS credentials...), or with a ``base_url`` and no key
a placeholder (a local server).

Why retries are off here too (``num_retries=0``, ``max_retries=0``): every attempt must go through
:mod:`punchline.workers.calls.retry` and the rate limiter, which see it cluster-wide; a retry behind their back could
pay for a request twice. LiteLLM's errors are the OpenAI SDK's classes with a ``status_code``: 408, 409, 425,
429 and 5xx, timeouts and lost connections are :class:`RetryableProviderError`, other 4xx
:class:`FatalProviderError`; the key is masked in every message. No batch API (``mode = "batch"`` is refused
when the config is read). LiteLLM takes seconds to import: only :class:`LiteLLMProvider` imports it.
"""

from __future__ import annotations

import asyncio
import importlib
import os
from typing import Any

from punchline.data.errors import ProviderError, RetryableProviderError
from punchline.data.provider_settings import ProviderSettings
from punchline.data.requests import ProviderRequest, ProviderResponse
from punchline.workers.provider import ProviderKind
from punchline.workers.providers.base import CHOICE_OFFSET_HEADER, choices, redact, status_error

KIND = ProviderKind(
    "litellm",
    "punchline.workers.providers.litellm_kind:LiteLLMProvider",
    simulated_wire="openai",  # base_url = "simulated": the openai kind's wire; give models as "openai/<id>"
    preload=("litellm",),
    summary="any API LiteLLM reaches (Gemini, Bedrock, Vertex...), model ids as LiteLLM routes them; no batches",
)


def _litellm() -> Any:
    """The litellm module, quiet: no price-map download at import, no "give feedback" lines on errors."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    module: Any = importlib.import_module("litellm")  # lazy: litellm takes seconds to import, only its kind needs it
    module.suppress_debug_info = True
    module.telemetry = False
    return module


class LiteLLMProvider:
    """A provider calling ``litellm.acompletion`` (one request, or ``n`` calls when ``supports_n`` is false)."""

    def __init__(self, name: str, settings: ProviderSettings) -> None:
        self.name = name
        self.settings = settings
        self._litellm = _litellm()
        # no key configured: LiteLLM reads the route's own variables; with a base_url of its own (a local
        # server) a placeholder, as the SDK kinds send
        configured = bool(settings.api_key_env or settings.api_key_file or settings.base_url)
        self._secret = settings.api_key(name) if configured else ""
        self._slots = asyncio.Semaphore(max(1, settings.max_concurrency))

    def __repr__(self) -> str:  # never the key
        return f"LiteLLMProvider(name={self.name!r}, base_url={self.settings.base_url!r})"

    async def aclose(self) -> None:
        return None  # LiteLLM keeps its own HTTP clients (cached per process)

    async def complete(self, request: ProviderRequest) -> ProviderResponse:
        return await choices(request, self.settings.supports_n, lambda n, offset: self._call(request, n, offset))

    async def _call(self, request: ProviderRequest, n: int, offset: int) -> ProviderResponse:
        from punchline.workers.providers.openai_compat import chat_body, response_of  # lazy: the openai SDK

        where = f"{self.name}/{request.model}"
        body = chat_body(request, n)
        if n == 1:
            del body["n"]  # some routes refuse n at all
        try:
            async with self._slots:
                resp = await self._litellm.acompletion(
                    **body,
                    api_base=self.settings.base_url,
                    api_key=self._secret or None,
                    timeout=self.settings.timeout_s,
                    num_retries=0,
                    max_retries=0,
                    extra_headers={CHOICE_OFFSET_HEADER: str(offset)} if offset else None,
                )
        except Exception as exc:  # every LiteLLM error, whatever its route, crosses as one of ours
            raise self._error(where, exc) from None
        return response_of(where, resp)

    def _error(self, where: str, exc: Exception) -> ProviderError:
        sdk = self._litellm
        if isinstance(exc, sdk.Timeout) or "Timeout" in type(exc).__name__:
            return RetryableProviderError(f"{where}: timed out after {self.settings.timeout_s} s")
        status = getattr(exc, "status_code", None)
        message = str(getattr(exc, "message", None) or exc)
        if isinstance(status, int) and 400 <= status < 600:
            response = getattr(exc, "response", None)
            headers = getattr(response, "headers", None) or getattr(exc, "litellm_response_headers", None)
            return status_error(where, status, message, headers, self._secret)
        return RetryableProviderError(f"{where}: {type(exc).__name__}: {redact(message, self._secret)[:200]}")
