"""What a worker asks of an LLM endpoint, and what it gets back: the vocabulary every layer shares.

A :class:`ProviderRequest` is deterministic and content-addressed: its :meth:`~ProviderRequest.key`
is the hash of its canonical msgpack encoding, so two runs (or two pipelines) that need the same
answer compute the same key and share one paid call through the response cache.
"""

from __future__ import annotations

import hashlib
from typing import Literal

import msgspec


class Message(msgspec.Struct, frozen=True, array_like=True):
    role: Literal["system", "user", "assistant"]
    content: str


class ProviderRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Everything that determines a provider's answer, and nothing else.

    ``sample_slot`` distinguishes the i-th of several independent samples of one prompt when a
    provider cannot return ``n`` choices in one call (or when a pipeline wants one unit per sample).
    """

    provider: str
    model: str
    messages: tuple[Message, ...]
    temperature: float = 0.0
    max_tokens: int = 16
    n: int = 1
    stop: tuple[str, ...] = ()
    seed: int | None = None
    sample_slot: int = 0
    top_p: float | None = None  # this and the fields after it are left out of the key when None (below)
    # a JSON schema (canonical JSON text) the answer must meet: a provider that takes one sends it as its
    # structured-output format (OpenAI: ``response_format``); the pipeline checks the answer either way
    response_schema: str | None = None

    def key(self) -> str:
        """Stable content hash: equal requests give equal keys in every process and run.

        A request without ``top_p`` or ``response_schema`` hashes exactly as it did before those fields
        existed (its encoding minus the trailing ``name: nil`` pairs, with the map's length that much
        less), so every answer cached before stays found."""
        raw = _ENCODER.encode(self)
        for value, nil in ((self.response_schema, _NO_SCHEMA), (self.top_p, _NO_TOP_P)):
            if value is not None:
                break
            raw = bytes([raw[0] - 1]) + raw[1 : -len(nil)]
        return hashlib.sha256(raw).hexdigest()[:40]

    def describe(self) -> str:
        """A short human description for errors and logs (never contains secrets)."""
        first = self.messages[-1].content if self.messages else ""
        snippet = first[:60].replace("\n", " ")
        return f"{self.provider}/{self.model} n={self.n} slot={self.sample_slot} key={self.key()} {snippet!r}"


_ENCODER = msgspec.msgpack.Encoder(order="deterministic")
_NO_TOP_P = _ENCODER.encode({"top_p": None})[1:]  # the key and the nil, without the map header
_NO_SCHEMA = _ENCODER.encode({"response_schema": None})[1:]


class ProviderResponse(msgspec.Struct, kw_only=True):
    """What came back: one text per choice, and the token counts the provider billed.

    ``finish_reasons`` (one per choice: ``stop``, ``length``, ...) is empty for answers cached before
    it was kept."""

    texts: list[str]
    input_tokens: int = 0
    output_tokens: int = 0
    model: str = ""
    finish_reasons: list[str] = []


def joined(parts: list[ProviderResponse]) -> ProviderResponse:
    """The answer of a request made as several calls (``n`` single-choice calls, or batch parts), in
    choice order: texts and finish reasons concatenated, tokens summed, the first part's model."""
    return ProviderResponse(
        texts=[t for p in parts for t in p.texts],
        input_tokens=sum(p.input_tokens for p in parts),
        output_tokens=sum(p.output_tokens for p in parts),
        model=parts[0].model,
        finish_reasons=[r for p in parts for r in p.finish_reasons],
    )
