"""One ``[providers.<name>]`` table of a run config: endpoint, models and prices, limits.

It lives on the ground floor because the planner, the budget, the rate limiter and the workers all
read it; secrets are never part of it (only the name of the env var or file that holds a key).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from punchline.data.errors import ConfigError

# The name of an installed provider kind: an entry point of the ``punchline.providers`` group (openai, anthropic,
# litellm, or a plug-in's); checked against the installed kinds when a config is read (workers/providers/registry.py)
ProviderKind = str


Mode = Literal["online", "batch"]


Price = Annotated[float, msgspec.Meta(ge=0.0, le=1e6)]
PerMinute = Annotated[float, msgspec.Meta(ge=1e-6, le=1e12)]


#: a model's price fields: both must be declared (0 included) before ``plan`` or ``run`` calls the model
PRICE_FIELDS = ("input_usd_per_mtok", "output_usd_per_mtok")


class ModelSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A model reachable through a provider, with its price per million tokens (both required for a model a run
    calls: 0 for a free one)."""

    # A price left out is not $0: ``plan`` and ``run`` stop naming the model (``cluster/run/planner.py``'s
    # ``check_model``), since a silent $0 would keep its calls out of the budget's sight.
    id: Annotated[str, msgspec.Meta(min_length=1, description="the provider's model id")]
    input_usd_per_mtok: Annotated[
        Price | None,
        msgspec.Meta(description="dollars per million input tokens (required for a model a run calls; 0: free)"),
    ] = None
    output_usd_per_mtok: Annotated[
        Price | None,
        msgspec.Meta(description="dollars per million output tokens (required for a model a run calls; 0: free)"),
    ] = None
    # Optional limits of this model alone, on top of the provider's (which cover all its models).
    requests_per_minute: Annotated[
        PerMinute | None, msgspec.Meta(description="this model's own request limit, on top of the provider's")
    ] = None
    tokens_per_minute: Annotated[
        PerMinute | None, msgspec.Meta(description="this model's own token limit, on top of the provider's")
    ] = None
    max_concurrency: Annotated[
        Annotated[int, msgspec.Meta(ge=1, le=10_000)] | None,
        msgspec.Meta(description="this model's own calls in flight, run-wide, on top of the provider's"),
    ] = None


class ProviderSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One ``[providers.<name>]`` table of a run config.

    Secrets are never part of settings: only the *name* of the env var or file that holds the key.
    """

    kind: Annotated[
        ProviderKind,
        msgspec.Meta(min_length=1, description="the API it speaks: an installed kind (openai, anthropic, litellm...)"),
    ] = "openai"
    base_url: Annotated[
        str | None,
        msgspec.Meta(
            description='an http(s) URL, or "simulated" for the built-in simulated provider (default: the SDK\'s)'
        ),
    ] = None
    api_key_env: Annotated[
        str | None, msgspec.Meta(description="the name of the environment variable holding the key (never the key)")
    ] = None
    api_key_file: Annotated[str | None, msgspec.Meta(description="a file holding the key (read by each worker)")] = None
    models: Annotated[
        dict[str, ModelSettings], msgspec.Meta(description="nickname -> model id and prices (a table per model)")
    ] = {}
    requests_per_minute: Annotated[
        PerMinute | None, msgspec.Meta(description="the provider's request limit, all models, workers and runs")
    ] = None
    tokens_per_minute: Annotated[
        PerMinute | None, msgspec.Meta(description="the provider's token limit, all models, workers and runs")
    ] = None
    max_concurrency: Annotated[
        int,
        msgspec.Meta(
            ge=1, le=10_000, description="calls in flight to this provider at once, run-wide (every worker, every node)"
        ),
    ] = 8
    timeout_s: Annotated[float, msgspec.Meta(ge=0.001, le=86_400.0, description="one request's timeout")] = 60.0
    max_retries: Annotated[
        int, msgspec.Meta(ge=0, le=1000, description="retries of a request that failed transiently (429, 5xx)")
    ] = 6
    max_malformed_retries: Annotated[
        int, msgspec.Meta(ge=0, le=1000, description="retries of an answer its validator refused")
    ] = 2
    supports_n: Annotated[
        bool, msgspec.Meta(description="one request with n choices (else n requests); Anthropic never")
    ] = True
    # "batch": a stage's uncached units of this provider go through its batch API (half price, within 24 h);
    # a stage's own table may say otherwise for its units (``[<pipeline>.<stage>] mode = "batch"``)
    mode: Annotated[
        Mode, msgspec.Meta(description="batch: uncached units through the batch API (a stage's mode wins)")
    ] = "online"
    batch_max_requests: Annotated[
        int,
        msgspec.Meta(ge=1, le=1_000_000, description="provider-side requests per batch (a split n-request counts n)"),
    ] = 10_000
    batch_max_bytes: Annotated[
        int, msgspec.Meta(ge=1024, le=10_000_000_000, description="bytes of request bodies per batch")
    ] = 100_000_000
    batch_price_factor: Annotated[float, msgspec.Meta(ge=0.0, le=1.0, description="batch price / online price")] = 0.5
    # what becomes of requests no batch could answer (the provider refused the batch, or they failed
    # ``max_rounds`` batches): "fail" stops the stage naming the reason, "online" pays the online price for them
    batch_fallback: Annotated[
        Literal["fail", "online"],
        msgspec.Meta(description="requests no batch could answer: fail the stage, or pay online for them"),
    ] = "fail"

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
        """Dollars for these tokens; a price not declared counts 0 (only an offline run, which pays nothing, gets
        past ``check_model`` with one)."""
        m = self.price(model_id)
        if m is None:
            return 0.0
        return (input_tokens * (m.input_usd_per_mtok or 0.0) + output_tokens * (m.output_usd_per_mtok or 0.0)) / 1e6

    def undeclared_prices(self, model_id: str) -> list[str]:
        """The price fields (:data:`PRICE_FIELDS`) a configured model leaves out."""
        m = self.price(model_id)
        return [] if m is None else [f for f in PRICE_FIELDS if getattr(m, f) is None]

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
