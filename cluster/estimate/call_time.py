"""How long a stage's provider calls take: what ``plan``'s wall-time estimate adds up per stage.

A stage's calls take the longer of two bounds: the rate limits' (requests and tokens per minute, the
planner's ``min_wall_s``) and the concurrency's (every call's expected latency, times its expected
attempts, over the calls a provider, or a model, may have in flight run-wide). Only the requests the
response cache does not answer are called, so only they count.

The latency of a call is known for the simulated provider (its ``[simulator]`` knobs: the mean of
``latency_ms_min`` and ``latency_ms_max``, or a model's fixed ``latency_ms_for_model``, and the share of
attempts its faults fail); a real endpoint's is assumed: :data:`FIRST_TOKEN_S` plus the request's output
tokens at :data:`OUTPUT_TOKENS_PER_S` (the plan's output tokens are ``max_tokens``, an upper bound).
"""

from __future__ import annotations

from collections import defaultdict

from punchline.cluster.config import SIMULATED, RunConfig
from punchline.data.provider_settings import ProviderSettings
from punchline.data.simulator import FakeConfig

FIRST_TOKEN_S = 0.5  # a real endpoint's time to its first token (assumed: no knob says it)
OUTPUT_TOKENS_PER_S = 50.0  # and its pace after that (assumed)


def simulated(settings: ProviderSettings) -> bool:
    return settings.base_url == SIMULATED


def call_s(cfg: RunConfig, settings: ProviderSettings, model_id: str, output_tokens: int) -> float:
    """The expected time one request holds a call slot: its attempts' latencies (a failed attempt waits
    its latency too, then retries; a retry's backoff holds no slot)."""
    if not simulated(settings):
        return FIRST_TOKEN_S + output_tokens / OUTPUT_TOKENS_PER_S
    sim = cfg.simulator or FakeConfig()
    if model_id in sim.latency_ms_for_model:
        latency_s = sim.latency_ms_for_model[model_id] / 1e3
    else:
        latency_s = (sim.latency_ms_min + sim.latency_ms_max) / 2e3
    latency_s += sim.hang_rate * min(sim.hang_s, settings.timeout_s)
    failing = sim.error_500_rate + sim.error_503_rate + sim.hang_rate + sim.truncated_body_rate + sim.malformed_rate
    attempts = sim.fail_first_attempts + 1 / max(1e-3, 1 - min(failing, 0.999))
    return latency_s * attempts


class SlotTime:
    """Seconds of call slots a stage's requests hold, per provider and per model (each with its own
    ``max_concurrency``, run-wide); :meth:`wall_s` is the concurrency's bound on the stage's wall time."""

    def __init__(self) -> None:
        self.per_provider: dict[str, float] = defaultdict(float)
        self.per_model: dict[tuple[str, str], float] = defaultdict(float)

    def add(self, provider: str, model_id: str, seconds: float) -> None:
        self.per_provider[provider] += seconds
        self.per_model[(provider, model_id)] += seconds

    def wall_s(self, cfg: RunConfig) -> float:
        wall = 0.0
        for name, seconds in self.per_provider.items():
            wall = max(wall, seconds / cfg.providers[name].max_concurrency)
        for (name, model_id), seconds in self.per_model.items():
            m = cfg.providers[name].price(model_id)
            if m is not None and m.max_concurrency:
                wall = max(wall, seconds / m.max_concurrency)
        return wall
