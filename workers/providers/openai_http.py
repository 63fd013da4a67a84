"""OpenAI-compatible chat completions (OpenAI, Together, vLLM, the fake provider) over plain HTTP, no SDK.

Why not ``openai.AsyncOpenAI``: a unit only POSTs a body it builds itself and decodes the fields it keeps
(:func:`response_of`), so the SDK added nothing per call but CPU (its request options, header merging and auth
layers: a third of a unit's CPU at 0 ms latency), and importing it took 0.6-1 CPU-second in the worker and again
in the driver's fork warm-up (BENCHMARKS.md, the peers' job). The SDK's own behaviour that matters is kept:
its base URL and headers (the kind's: ``OPENAI_BASE_URL``, the key as a bearer token, ``OPENAI_ORG_ID`` and
``OPENAI_PROJECT_ID``), one keep-alive connection pool per provider, ``timeout_s`` on every phase of a call,
redirects followed, proxies from the environment; no retries (they belong to :mod:`punchline.workers.calls.retry`).
The batch API (``batch_openai``) still uses the SDK.

When ``settings.supports_n`` is false and ``request.n > 1``, :meth:`complete` makes ``n`` calls with
the same parameters (``n=1``) one after another and concatenates their texts and token counts; a
failure of any call fails the whole request (the retry repeats all ``n``). Each call carries the
choice offset header (``sample_slot * n + i``) so the fake provider returns distinct samples.
"""

from __future__ import annotations

import json
import os
from typing import Any

import httpx2
import msgspec

from punchline.data.requests import ProviderRequest, ProviderResponse
from punchline.workers.providers.base import MalformedResponse, SdkProvider, Wire, choices, decode_body
from punchline.workers.providers.kinds import CHAT_PATH, OPENAI

# the SDK's own pool bounds (a worker's calls in flight stay far below them)
LIMITS = httpx2.Limits(max_connections=1000, max_keepalive_connections=100)


class OpenAIProvider(SdkProvider):
    """The ``openai`` kind's provider: one ``httpx2.AsyncClient`` and the kind's headers."""

    def _make_wire(self) -> Wire:
        settings = self.settings
        base_url = settings.base_url or os.environ.get(OPENAI.base_url_env or "") or OPENAI.default_base_url or ""
        headers = {"Accept": "application/json", "Content-Type": "application/json", "User-Agent": "punchline"}
        headers.update(OPENAI.headers(self._secret))
        http = httpx2.AsyncClient(timeout=settings.timeout_s, limits=LIMITS, follow_redirects=True)
        self._wire = Wire(http, base_url, headers, settings.timeout_s)
        return self._wire

    async def aclose(self) -> None:
        if self._wire is not None:
            await self._wire.http.aclose()

    async def complete(self, request: ProviderRequest) -> ProviderResponse:
        return await choices(request, self.settings.supports_n, lambda n, offset: self._call(request, n, offset))

    async def _call(self, request: ProviderRequest, n: int, offset: int) -> ProviderResponse:
        where = f"{self.name}/{request.model}"
        body = await self._post(CHAT_PATH, chat_body(request, n), offset=offset, where=where)
        return response_of(where, decode_body(_completion, where, body))


def chat_body(request: ProviderRequest, n: int) -> dict[str, Any]:
    """The chat-completions body of ``request`` asking for ``n`` choices (also a batch line's body)."""
    params: dict[str, Any] = {
        "model": request.model,
        "messages": [{"role": m.role, "content": m.content} for m in request.messages],
        "temperature": request.temperature,
        "max_tokens": request.max_tokens,
        "n": n,
    }
    if request.stop:
        params["stop"] = list(request.stop)
    if request.seed is not None:
        params["seed"] = request.seed
    if request.top_p is not None:
        params["top_p"] = request.top_p
    if request.response_schema is not None:  # structured output: the provider holds the answer to the schema
        params["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "response", "schema": json.loads(request.response_schema)},
        }
    return params


class _Message(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    message: _Message
    index: int | None = None
    finish_reason: str | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class _Completion(msgspec.Struct):
    """The fields of a chat completion we keep (the rest of the body is ignored, not validated)."""

    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    model: str | None = None


_completion = msgspec.json.Decoder(_Completion)


def response_of(where: str, resp: Any) -> ProviderResponse:
    """A chat completion as a :class:`ProviderResponse`: the online call's decoded body or a batch line's
    SDK object (both have ``choices``, ``usage`` and ``model``)."""
    choices = getattr(resp, "choices", None)
    if not isinstance(choices, list) or not choices:
        raise MalformedResponse(f"{where}: malformed response: no choices")
    try:
        ordered = sorted(choices, key=lambda c: c.index or 0)
        texts = [c.message.content or "" for c in ordered]
        reasons = [str(getattr(c, "finish_reason", None) or "") for c in ordered]
    except AttributeError as exc:
        raise MalformedResponse(f"{where}: malformed response: {exc}") from None
    usage = getattr(resp, "usage", None)
    return ProviderResponse(
        texts=texts,
        input_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
        output_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
        model=str(getattr(resp, "model", "") or ""),
        finish_reasons=reasons,
    )
