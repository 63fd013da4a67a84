"""Anthropic Messages API via ``anthropic.AsyncAnthropic`` (SDK retries off, as for OpenAI).

System messages are joined and passed as ``system=``. The API has no ``n`` and no ``seed``: a
request with ``n > 1`` becomes ``n`` sequential calls whose texts are concatenated (as for an
OpenAI-compat provider with ``supports_n = false``), and ``seed`` is not sent. The body goes through the
SDK's ``post`` as built by :func:`message_body` (so ``temperature``, which SDK 2.x dropped as a keyword,
is simply a body field). Whitespace-only stop sequences (such as ``"\\n"``) are dropped because the API
rejects them; a single-word answer is unaffected.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx2
import msgspec

from punchline.data.errors import RetryableProviderError
from punchline.data.provider_settings import ProviderSettings
from punchline.data.requests import ProviderRequest, ProviderResponse
from punchline.workers.providers import (
    CHOICE_OFFSET_HEADER,
    MalformedResponse,
    SdkProvider,
    api_error_message,
    cause_text,
    redact,
    status_error,
)


class AnthropicProvider(SdkProvider):
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
        return ProviderResponse(
            texts=[p.texts[0] for p in parts],
            input_tokens=sum(p.input_tokens for p in parts),
            output_tokens=sum(p.output_tokens for p in parts),
            model=parts[0].model,
        )

    async def _call(self, request: ProviderRequest, offset: int) -> ProviderResponse:
        where = f"{self.name}/{request.model}"
        headers = {CHOICE_OFFSET_HEADER: str(offset)} if offset else None
        try:
            async with self._slots:
                # ``post`` (the SDK's documented way to reach any endpoint) keeps its auth, version header,
                # timeouts and error types but skips validating the answer into pydantic models; msgspec
                # decodes the fields we keep (see openai_compat).
                raw = await self._client.post(
                    "/v1/messages",
                    cast_to=httpx2.Response,
                    body=message_body(request),
                    options={"headers": headers} if headers else {},
                )
        except anthropic.APIStatusError as exc:
            raise status_error(
                where, exc.status_code, api_error_message(exc), exc.response.headers, self._secret
            ) from None
        except anthropic.APITimeoutError:
            raise RetryableProviderError(f"{where}: timed out after {self.settings.timeout_s} s") from None
        except anthropic.APIConnectionError as exc:
            raise RetryableProviderError(f"{where}: connection failed: {cause_text(exc, self._secret)}") from None
        except (anthropic.APIResponseValidationError, json.JSONDecodeError, ValueError) as exc:
            raise MalformedResponse(f"{where}: malformed response: {cause_text(exc, self._secret)}") from None
        except anthropic.AnthropicError as exc:
            raise RetryableProviderError(f"{where}: {redact(str(exc), self._secret)[:200]}") from None
        return decode_message(where, raw.content)


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


_message = msgspec.json.Decoder(_Message)


def decode_message(where: str, body: bytes) -> ProviderResponse:
    """A Messages API response body as a :class:`ProviderResponse` (as :func:`message_response` reads the
    SDK's parsed object)."""
    try:
        resp = _message.decode(body)
    except msgspec.DecodeError as exc:
        raise MalformedResponse(f"{where}: malformed response: {exc}") from None
    return message_response(where, resp)


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
    )
