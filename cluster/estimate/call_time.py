"""How long a stage's provider calls take: what ``plan``'s wall-time estimate adds up per stage.

A stage's calls take the longer of two bounds: the rate limits' (requests and tokens per minute, the
planner's ``min_wall_s``) and the concurrency's (every call's expected latency, times its expected
attempts, over the calls a provider, or a model, may have in flight run-wide). Only the requests the
response cache does not answer are called, so only they count.

A unit's time is, in this order: the simulated provider's, from its ``[simulator]`` knobs (the mean of
``latency_ms_min`` and ``latency_ms_max``, or a model's fixed ``latency_ms_for_model``, and the share of attempts its
faults fail); a real endpoint's as this runs folder measured it (``latencies.py``: the mean seconds per answered unit
of that kind, ``base_url`` and model in the latest runs, retries included); else :data:`DEFAULT_CALL_S` for the
provider's kind, per call. The defaults are a short answer's time from a hosted API (first token and a few dozen
tokens), not ``max_tokens`` at some pace: the cap is an upper bound the answers seldom reach, and timing it
overestimated a run nine times. One earlier run against the endpoint replaces them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from punchline.cluster.config import SIMULATED, RunConfig
from punchline.cluster.estimate.latencies import Endpoint, Latency, endpoint
from punchline.data.provider_settings import ProviderSettings
from punchline.data.simulator import FakeConfig

#: a real endpoint's seconds per call when none was measured here, per provider kind (a kind not listed:
#: :data:`OTHER_KIND_CALL_S`). OpenAI-compatible endpoints (OpenAI's small models, Together, Groq, a local vLLM)
#: answer a short prompt in 0.2-0.6 s; Anthropic's Messages API takes longer to its first token; LiteLLM routes to
#: either, so it is taken as the OpenAI-compatible ones.
DEFAULT_CALL_S: Mapping[str, float] = {"openai": 0.4, "litellm": 0.4, "anthropic": 0.8}
OTHER_KIND_CALL_S = 0.6

Latencies = Mapping[Endpoint, Latency]  # what ``latencies.measured_latencies`` returns


def simulated(settings: ProviderSettings) -> bool:
    return settings.base_url == SIMULATED


def unit_s(
    cfg: RunConfig, settings: ProviderSettings, model_id: str, calls: int, latencies: Latencies | None = None
) -> tuple[float, str]:
    """The expected time one unit (a request of ``calls`` HTTP calls, made one after another) holds its call slot,
    and what says so: ``"simulator"``, ``"measured"`` or ``"default"``. A measured unit is taken as it was then (a
    unit split into ``n`` calls then is taken to be split as much now)."""
    if simulated(settings):
        return calls * simulated_call_s(cfg, settings, model_id), "simulator"
    measured = (latencies or {}).get(endpoint(settings, model_id))
    if measured is not None:
        return measured.unit_s, "measured"
    return calls * DEFAULT_CALL_S.get(settings.kind, OTHER_KIND_CALL_S), "default"


def simulated_call_s(cfg: RunConfig, settings: ProviderSettings, model_id: str) -> float:
    """The expected time one call to the simulated provider holds a call slot: its attempts' latencies (a failed
    attempt waits its latency too, then retries; a retry's backoff holds no slot)."""
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
