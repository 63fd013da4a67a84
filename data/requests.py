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

    def key(self) -> str:
        """Stable content hash: equal requests give equal keys in every process and run."""
        return hashlib.sha256(_ENCODER.encode(self)).hexdigest()[:40]

    def describe(self) -> str:
        """A short human description for errors and logs (never contains secrets)."""
        first = self.messages[-1].content if self.messages else ""
        snippet = first[:60].replace("\n", " ")
        return f"{self.provider}/{self.model} n={self.n} slot={self.sample_slot} key={self.key()} {snippet!r}"


_ENCODER = msgspec.msgpack.Encoder(order="deterministic")


class ProviderResponse(msgspec.Struct, kw_only=True):
    """What came back: one text per choice, and the token counts the provider billed."""

    texts: list[str]
    input_tokens: int = 0
    output_tokens: int = 0
    model: str = ""
