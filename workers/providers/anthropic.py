"""Anthropic Messages API via ``anthropic.AsyncAnthropic`` (SDK retries off, as for OpenAI).

System messages are joined and passed as ``system=``. The API has no ``n`` and no ``seed``: a
request with ``n > 1`` becomes ``n`` sequential calls whose texts are concatenated (as for an
OpenAI-compat provider with ``supports_n = false``), and ``seed`` is not sent. The body goes through the
SDK's ``post`` as built by :func:`message_body` (so ``temperature``, which SDK 2.x dropped as a keyword,
is simply a body field). Whitespace-only stop sequences (such as ``"\\n"``) are dropped because the API
rejects them; a single-word answer is unaffected.
"""

from __future__ import annotations

from typing import Any

import anthropic
import msgspec

from punchline.data.provider_settings import ProviderSettings
from punchline.data.requests import ProviderRequest, ProviderResponse, joined
from punchline.workers.providers.base import (
    MalformedResponse,
    SdkProvider,
    decode_body,
)
from punchline.workers.providers.kinds import MESSAGES_PATH


class AnthropicProvider(SdkProvider):
    sdk = anthropic

    def __init__(self, name: str, settings: ProviderSettings) -> None:
        super().__init__(name, settings)
        self._client = anthropic.AsyncAnthropic(
            base_url=settings.base_url,
            api_key=self._secret,
            max_retries=0,
            timeout=settings.timeout_s,
        )

    async def complete(self, request: ProviderRequest) -> ProviderResponse:
        parts = [await self._call(request, request.sample_slot * request.n + i) for i in range(request.n)]
        return joined(parts)

    async def _call(self, request: ProviderRequest, offset: int) -> ProviderResponse:
        where = f"{self.name}/{request.model}"
        body = await self._post(MESSAGES_PATH, message_body(request), offset=offset, where=where)
        return message_response(where, decode_body(_message, where, body))


def message_body(request: ProviderRequest) -> dict[str, Any]:
    """The Messages API body of ``request`` (one choice; also a batch request's ``params``)."""
    system = "\n\n".join(m.content for m in request.messages if m.role == "system")
    params: dict[str, Any] = {
        "model": request.model,
        "messages": [{"role": m.role, "content": m.content} for m in request.messages if m.role != "system"],
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
    }
    if system:
        params["system"] = system
    stop = [s for s in request.stop if s.strip()]
    if stop:
        params["stop_sequences"] = stop
    if request.top_p is not None:
        params["top_p"] = request.top_p
    # ``request.response_schema`` is not sent: the Messages API takes no response format, so the
    # pipeline's parse step is the only check of the answer's shape here
    return params


class _Block(msgspec.Struct):
    type: str = ""
    text: str = ""


class _Usage(msgspec.Struct):
    input_tokens: int | None = None
    output_tokens: int | None = None


class _Message(msgspec.Struct):
    """The fields of a Messages API answer we keep."""

    content: list[_Block] | None = None
    usage: _Usage | None = None
    model: str | None = None
    stop_reason: str | None = None


_message = msgspec.json.Decoder(_Message)


def message_response(where: str, resp: Any) -> ProviderResponse:
    """A Messages API answer as a :class:`ProviderResponse` (the online call's and a batch result's)."""
    blocks = getattr(resp, "content", None)
    texts = [b.text for b in blocks or [] if getattr(b, "type", None) == "text"]
    if not texts:
        raise MalformedResponse(f"{where}: malformed response: no text content block")
    usage = getattr(resp, "usage", None)
    return ProviderResponse(
        texts=["".join(texts)],
        input_tokens=int(getattr(usage, "input_tokens", 0) or 0),
        output_tokens=int(getattr(usage, "output_tokens", 0) or 0),
        model=str(getattr(resp, "model", "") or ""),
        finish_reasons=[str(getattr(resp, "stop_reason", None) or "")],
    )
