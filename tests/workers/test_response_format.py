"""Structured outputs: a request's JSON schema goes to an OpenAI-kind provider as ``response_format``, is
left out where the API takes none (Anthropic: the pipeline's parse step checks the answer), and a request
without one keeps the key it had before the field existed (answers cached before stay found)."""

from __future__ import annotations

import asyncio
import hashlib
import json

import msgspec

from punchline.data.requests import Message, ProviderRequest
from punchline.workers.fake.server import FakeProviderServer
from punchline.workers.providers import make_provider
from punchline.workers.providers.anthropic import message_body
from punchline.workers.providers.openai_compat import chat_body

SCHEMA = {"type": "object", "required": ["answer"], "properties": {"answer": {"type": "string"}}}


def _request(**kw: object) -> ProviderRequest:
    return ProviderRequest(provider="fake", model="fake-model", messages=(Message("user", "Options: a | b"),), **kw)  # type: ignore[arg-type]


def test_the_schema_is_sent_as_response_format_by_openai_kind_only() -> None:
    request = _request(response_schema=json.dumps(SCHEMA, sort_keys=True))
    body = chat_body(request, 1)
    assert body["response_format"] == {"type": "json_schema", "json_schema": {"name": "response", "schema": SCHEMA}}
    assert "response_format" not in chat_body(_request(), 1)
    assert set(message_body(request)) == set(message_body(_request()))  # the Messages API takes no format


def test_a_request_without_a_schema_keeps_its_key() -> None:
    class Before(msgspec.Struct, frozen=True, kw_only=True):  # ProviderRequest before response_schema
        provider: str
        model: str
        messages: tuple[Message, ...]
        temperature: float = 0.0
        max_tokens: int = 16
        n: int = 1
        stop: tuple[str, ...] = ()
        seed: int | None = None
        sample_slot: int = 0
        top_p: float | None = None

    fields = {"provider": "p", "model": "m", "messages": (Message("user", "hi"),), "top_p": 0.9}
    old = hashlib.sha256(msgspec.msgpack.Encoder(order="deterministic").encode(Before(**fields))).hexdigest()[:40]  # type: ignore[arg-type]
    assert ProviderRequest(**fields).key() == old  # type: ignore[arg-type]
    keys = {ProviderRequest(**fields, response_schema=s).key() for s in ('{"type":"object"}', '{"type":"array"}')}  # type: ignore[arg-type]
    assert len(keys) == 2 and old not in keys


def test_the_fake_provider_answers_a_request_with_a_format(fake: FakeProviderServer) -> None:
    provider = make_provider("fake", fake.provider_settings("openai", timeout_s=5))  # type: ignore[arg-type]

    async def go() -> list[str]:
        try:
            return (await provider.complete(_request(response_schema=json.dumps(SCHEMA)))).texts
        finally:
            await provider.aclose()

    assert len(asyncio.run(go())) == 1
