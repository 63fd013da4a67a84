"""One ``[providers.<name>]`` table of a run config: endpoint, models and prices, limits.

It lives on the ground floor because the planner, the budget, the rate limiter and the workers all
read it; secrets are never part of it (only the name of the env var or file that holds a key).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import msgspec

from punchline.data.errors import ConfigError

ProviderKind = Literal["openai", "anthropic"]


Mode = Literal["online", "batch"]


class ModelSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A model reachable through a provider, with its price per million tokens."""

    id: str
    input_usd_per_mtok: float = 0.0
    output_usd_per_mtok: float = 0.0
    # Optional limits of this model alone, on top of the provider's (which cover all its models).
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None


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
    # "batch": a stage's uncached units of this provider go through its batch API (half price, within 24 h);
    # a stage's own table may say otherwise for its units (``[puns.collect] mode = "batch"``)
    mode: Mode = "online"
    batch_max_requests: int = 10_000  # provider-side requests per batch (a split n-request counts n)
    batch_max_bytes: int = 100_000_000  # bytes of request bodies per batch
    batch_price_factor: float = 0.5  # batch price / online price
    # what becomes of requests no batch could answer (the provider refused the batch, or they failed
    # ``max_rounds`` batches): "fail" stops the stage naming the reason, "online" pays the online price for them
    batch_fallback: Literal["fail", "online"] = "fail"

    def model_id(self, nickname: str) -> str:
        """Resolve a nickname (``"8b"``) to the model id; an unknown name is taken as an id."""
        m = self.models.get(nickname)
        return m.id if m else nickname

    def price(self, model_id: str) -> ModelSettings | None:
        for m in self.models.values():
            if m.id == model_id:
                return m
        return None

    def model_limits(self, model_id: str) -> tuple[float, float]:
        """(requests, tokens) per minute of one model by itself; 0 = no per-model limit."""
        m = self.price(model_id)
        if m is None:
            return 0.0, 0.0
        return m.requests_per_minute or 0.0, m.tokens_per_minute or 0.0

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
                key = Path(self.api_key_file).expanduser().read_text().strip()
            except OSError as exc:
                raise ConfigError(
                    f"cannot read the API key file: {exc.strerror}",
                    record=f"providers.{provider_name}",
                    field="api_key_file",
                ) from None
            if not key:
                raise ConfigError(
                    f"the API key file {self.api_key_file} is empty",
                    record=f"providers.{provider_name}",
                    field="api_key_file",
                )
            return key
        if self.api_key_env:
            raise ConfigError(
                f"environment variable {self.api_key_env} is not set",
                record=f"providers.{provider_name}",
                field="api_key_env",
            )
        return "unused"
