"""``punchline plan``: what a run will ask of its providers, before anything is called.

Stages whose units depend on earlier results cannot be expanded exactly before those results exist;
for them the plan shows the upper bound the pipeline's ``estimate`` states, and says so.
"""

from __future__ import annotations

import tempfile
from collections import defaultdict
from collections.abc import Iterable

import msgspec

from punchline.cluster.config import RunConfig
from punchline.cluster.executor import stage_providers
from punchline.cluster.pipeline import StageContext, pipeline_code
from punchline.cluster.registry import pipeline_of
from punchline.data.errors import ConfigError
from punchline.data.provider_settings import ProviderSettings
from punchline.data.stores.local import LocalStore
from punchline.data.units import UnitSpec
from punchline.schedulers.budget import estimate_request_cost
from punchline.workers.providers import kind_of, wire_calls


class StageEstimate(msgspec.Struct, kw_only=True):
    stage: str
    requests: int
    exact: bool
    input_tokens: int
    output_tokens: int
    cost_usd: float
    min_wall_s: float
    batch_cost_usd: float = 0.0  # the same requests through the providers' batch APIs
    mode: str = "online"  # how the config sends them: online, batch, or online+batch (some providers each)
    mode_cost_usd: float = 0.0  # what they cost sent as configured (each provider's, or the stage's, mode)
    note: str = ""


def _check_batch_api(cfg: RunConfig, stage: str, provider: str, settings: ProviderSettings) -> None:
    """A stage whose mode sends a provider's units in batches needs a provider kind with a batch API."""
    if not kind_of(settings.kind).has_batches:
        raise ConfigError(
            f'stage {stage} sends its {provider} units in batches (mode = "batch"), but kind '
            f'{settings.kind!r} has no batch API: set the stage\'s mode = "online"',
            file=cfg.source or None,
            record=f"providers.{provider}",
            field="kind",
        )


def _min_wall_s(
    cfg: RunConfig,
    per_provider_req: dict[str, int],
    per_provider_tok: dict[str, int],
    per_model_req: dict[tuple[str, str], int],
    per_model_tok: dict[tuple[str, str], int],
) -> float:
    """The least wall time the rate limits allow for these requests and tokens: the slowest of the providers'
    limits (all models together) and any model's own."""
    wall = 0.0
    for name, n in per_provider_req.items():
        s = cfg.providers[name]
        if s.requests_per_minute:
            wall = max(wall, n / s.requests_per_minute * 60)
        if s.tokens_per_minute:
            wall = max(wall, per_provider_tok[name] / s.tokens_per_minute * 60)
    for (name, model), n in per_model_req.items():
        m_rpm, m_tpm = cfg.providers[name].model_limits(model)
        if m_rpm:
            wall = max(wall, n / m_rpm * 60)
        if m_tpm:
            wall = max(wall, per_model_tok[(name, model)] / m_tpm * 60)
    return wall


def _estimate(cfg: RunConfig, stage: str, units: Iterable[UnitSpec], exact: bool, note: str = "") -> StageEstimate:
    """Requests, tokens, dollars and the least wall time the rate limits allow (limits are per provider,
    all models together, plus any model's own)."""
    as_run = stage_providers(cfg.providers, cfg.stage_mode(stage))  # a stage's own mode over its providers'
    modes: set[str] = set()
    mode_usd = 0.0

    per_provider_req: dict[str, int] = defaultdict(int)
    per_provider_tok: dict[str, int] = defaultdict(int)
    per_model_req: dict[tuple[str, str], int] = defaultdict(int)
    per_model_tok: dict[tuple[str, str], int] = defaultdict(int)
    tin = tout = 0
    usd = batch_usd = 0.0
    for u in units:
        settings = cfg.provider(u.request.provider)
        check_model(cfg, stage, u.request.provider, u.request.model)
        i, o, c = estimate_request_cost(settings, u.request, wire_calls(settings, u.request))
        tin, tout, usd = tin + i, tout + o, usd + c
        batch_usd += c * settings.batch_price_factor
        mode = as_run[u.request.provider].mode
        if mode == "batch":  # a stage's own mode asked for batches
            _check_batch_api(cfg, stage, u.request.provider, settings)
        modes.add(mode)
        mode_usd += c * settings.batch_price_factor if mode == "batch" else c
        calls = wire_calls(settings, u.request)
        per_provider_req[u.request.provider] += calls
        per_provider_tok[u.request.provider] += i + o
        per_model_req[(u.request.provider, u.request.model)] += calls
        per_model_tok[(u.request.provider, u.request.model)] += i + o
    wall = _min_wall_s(cfg, per_provider_req, per_provider_tok, per_model_req, per_model_tok)
    return StageEstimate(
        stage=stage,
        requests=sum(per_model_req.values()),
        exact=exact,
        input_tokens=tin,
        output_tokens=tout,
        cost_usd=usd,
        batch_cost_usd=batch_usd,
        mode="+".join(sorted(modes)) or "online",
        mode_cost_usd=mode_usd,
        min_wall_s=wall,
        note=note,
    )


def check_model(cfg: RunConfig, stage: str, provider: str, model: str) -> None:
    """A stage may call only a configured model: a nickname it names unknown to the provider would
    reach the provider as a model id, priced at $0 and so out of the budget cap's sight."""
    settings = cfg.provider(provider)
    if settings.price(model) is not None:
        return
    known = ", ".join(sorted(settings.models)) or "none configured"
    raise ConfigError(
        f"stage {stage} calls model {model!r}, which is not a nickname or id in [providers.{provider}.models] "
        f"(known: {known}): fix the stage's model or add the model with its prices",
        file=cfg.source or None,
        field=f"providers.{provider}.models",
    )


def plan_run(cfg: RunConfig) -> list[StageEstimate]:
    out: list[StageEstimate] = []
    with tempfile.TemporaryDirectory() as tmp:
        ctx = StageContext(cfg, "plan", LocalStore(tmp))
        for stage in pipeline_of(cfg).stages(cfg):
            try:
                with pipeline_code(cfg.run.pipeline, stage, "plan", passing=(FileNotFoundError,)):
                    estimate = _estimate(cfg, stage.name, stage.plan(ctx), exact=True)
            except FileNotFoundError:
                out.append(_upper_bound(cfg, stage.name))
                continue
            if estimate.requests:
                out.append(estimate)
    return out


def _upper_bound(cfg: RunConfig, stage: str) -> StageEstimate:
    """Units of a stage that needs earlier results: the most the pipeline says it can have."""
    units = list(pipeline_of(cfg).estimate(cfg, stage))
    if units:
        return _estimate(cfg, stage, units, exact=False, note="upper bound: depends on earlier results")
    return StageEstimate(
        stage=stage,
        requests=0,
        exact=False,
        input_tokens=0,
        output_tokens=0,
        cost_usd=0.0,
        min_wall_s=0.0,
        note="no provider calls",
    )
