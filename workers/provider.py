"""The provider interface: what a worker asks of an LLM endpoint, and what it gets back.

A :class:`ProviderRequest` is deterministic and content-addressed: its :meth:`~ProviderRequest.key`
is the hash of its canonical msgpack encoding, so two runs (or two pipelines) that need the same
answer compute the same key and share one paid call through the response cache.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Literal, Protocol

import msgspec

from data.errors import ConfigError

ProviderKind = Literal["openai", "anthropic"]


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


class ModelSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A model reachable through a provider, with its price per million tokens."""

    id: str
    input_usd_per_mtok: float = 0.0
    output_usd_per_mtok: float = 0.0


class ProviderSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One ``[providers.<name>]`` table of a run config.

    Secrets are never part of settings: only the *name* of the env var or file that holds the key.
    """

    kind: ProviderKind = "openai"
    base_url: str | None = None
    api_key_env: str | None = None
    api_key_file: str | None = None
    models: dict[str, ModelSettings] = {}
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    max_concurrency: int = 8
    timeout_s: float = 60.0
    max_retries: int = 6
    max_malformed_retries: int = 2
    supports_n: bool = True

    def model_id(self, nickname: str) -> str:
        """Resolve a nickname (``"8b"``) to the model id; an unknown name is taken as an id."""
        m = self.models.get(nickname)
        return m.id if m else nickname

    def price(self, model_id: str) -> ModelSettings | None:
        for m in self.models.values():
            if m.id == model_id:
                return m
        return None

    def cost_usd(self, model_id: str, input_tokens: int, output_tokens: int) -> float:
        m = self.price(model_id)
        if m is None:
            return 0.0
        return (input_tokens * m.input_usd_per_mtok + output_tokens * m.output_usd_per_mtok) / 1e6

    def api_key(self, provider_name: str) -> str:
        """Read the key from the named env var or file, at call time only."""
        if self.api_key_env:
            value = os.environ.get(self.api_key_env)
            if value:
                return value.strip()
        if self.api_key_file:
            try:
                return Path(self.api_key_file).expanduser().read_text().strip()
            except OSError as exc:
                raise ConfigError(
                    f"cannot read the API key file: {exc.strerror}",
                    record=f"providers.{provider_name}",
                    field="api_key_file",
                ) from None
        if self.api_key_env:
            raise ConfigError(
                f"environment variable {self.api_key_env} is not set",
                record=f"providers.{provider_name}",
                field="api_key_env",
            )
        return "unused"


class Provider(Protocol):
    """An LLM endpoint. Implementations convert SDK exceptions into ``data.errors`` at the boundary:
    :class:`~data.errors.RetryableProviderError` or :class:`~data.errors.FatalProviderError`."""

    name: str
    settings: ProviderSettings

    async def complete(self, request: ProviderRequest) -> ProviderResponse: ...

    async def aclose(self) -> None: ...
