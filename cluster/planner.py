"""``punchline plan``: what a run will ask of its providers, before anything is called.

Stages whose units depend on earlier results (classification batches, cloze evaluation) cannot be
expanded exactly before those results exist; for them the plan shows an upper bound from the config
and says so.
"""

from __future__ import annotations

import math
import tempfile
from collections import defaultdict
from collections.abc import Iterable

import msgspec

from punchline.cluster.config import RunConfig
from punchline.cluster.pipeline import StageContext
from punchline.data.stores.local import LocalStore
from punchline.data.units import UnitSpec


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


def _estimate(cfg: RunConfig, stage: str, units: Iterable[UnitSpec], exact: bool, note: str = "") -> StageEstimate:
    """Requests, tokens, dollars and the least wall time the rate limits allow (limits are per provider,
    all models together, plus any model's own)."""
    from punchline.schedulers.budget import estimate_request_cost
    from punchline.workers.batch_runner import stage_providers
    from punchline.workers.providers import wire_calls

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
        i, o, c = estimate_request_cost(settings, u.request)
        tin, tout, usd = tin + i, tout + o, usd + c
        batch_usd += c * settings.batch_price_factor
        mode = as_run[u.request.provider].mode
        modes.add(mode)
        mode_usd += c * settings.batch_price_factor if mode == "batch" else c
        calls = wire_calls(settings, u.request)
        per_provider_req[u.request.provider] += calls
        per_provider_tok[u.request.provider] += i + o
        per_model_req[(u.request.provider, u.request.model)] += calls
        per_model_tok[(u.request.provider, u.request.model)] += i + o
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


def plan_run(cfg: RunConfig) -> list[StageEstimate]:
    from punchline.cluster.driver import pipeline_stages

    out: list[StageEstimate] = []
    with tempfile.TemporaryDirectory() as tmp:
        ctx = StageContext(cfg, "plan", LocalStore(tmp))
        for stage in pipeline_stages(cfg):
            try:
                estimate = _estimate(cfg, stage.name, stage.plan(ctx), exact=True)
            except FileNotFoundError:
                out.append(_upper_bound(cfg, stage.name))
                continue
            if estimate.requests:
                out.append(estimate)
    return out


def _upper_bound(cfg: RunConfig, stage: str) -> StageEstimate:
    """Units of a stage that needs earlier results: the most the config allows, priced like the first."""
    from punchline.cluster.config import resolve_path
    from punchline.data.puns_io import load_puns

    note = "upper bound: depends on earlier results"
    if cfg.puns is not None and stage == "classify" and cfg.puns.classify is not None:
        jokes = len(load_puns(resolve_path(cfg, cfg.puns.jokes)))
        n = math.ceil(jokes / cfg.puns.classify.batch_size)
        model = cfg.provider(cfg.puns.classify.provider).model_id(cfg.puns.classify.model)
        from punchline.data.classify import classify_prompt  # noqa: F401  (same prompt shape as the real batches)
        from punchline.data.requests import Message, ProviderRequest

        req = ProviderRequest(
            provider=cfg.puns.classify.provider, model=model, messages=(Message("user", "x" * 4000),), max_tokens=4096
        )
        return _scaled(cfg, stage, req, n, note)
    if cfg.puns is not None and stage == "evaluate" and cfg.puns.evaluate is not None and cfg.puns.cloze:
        from punchline.data.cloze_run import cloze_request
        from punchline.data.schemas import ClozeTest

        test = ClozeTest(
            pair_id=0,
            type="straight",
            prompt="x" * 300,
            expected_completion=[],
            contrast_completion=[],
            joke_a_index=0,
            joke_b_index=1,
            joke_c_index=2,
            joke_c_sentence="",
            joke_a_tier="",
            joke_b_tier="",
            joke_c_tier="",
            joke_c_balance=0.0,
        )
        settings = cfg.provider(cfg.puns.evaluate.provider)
        units = [
            UnitSpec(
                unit_id=f"{nick}/{i}", request=cloze_request(cfg.puns.evaluate.provider, settings.model_id(nick), test)
            )
            for nick in cfg.puns.evaluate.models
            for i in range(2 * cfg.puns.cloze.pairs)
        ]
        units = [
            UnitSpec(unit_id=f"{i}", request=msgspec.structs.replace(u.request, sample_slot=i))
            for i, u in enumerate(units)
        ]
        return _estimate(cfg, stage, units, exact=False, note=note)
    if cfg.curate is not None and stage in ("repair", "rerate"):
        from punchline.data.curation import load_candidates, rating_request, repair_request

        cur = cfg.curate
        cands = load_candidates(resolve_path(cfg, cur.jokes))
        if stage == "repair" and cur.repair is not None:  # at most every candidate is weak
            model = cfg.provider(cur.repair.provider).model_id(cur.repair.model)
            units = [UnitSpec(unit_id=str(c.id), request=repair_request(cur.repair.provider, model, c)) for c in cands]
        else:  # at most every candidate is repaired and rated again by every rater
            batches = [cands[i : i + cur.batch_size] for i in range(0, len(cands), cur.batch_size)]
            units = [
                UnitSpec(
                    unit_id=f"{name}/{i}",
                    request=rating_request(ref.provider, cfg.provider(ref.provider).model_id(ref.model), batch),
                )
                for name, ref in cur.raters.items()
                for i, batch in enumerate(batches)
            ]
        return _estimate(cfg, stage, units, exact=False, note=note)
    if cfg.humor is not None and stage == "judge" and cfg.humor.judge is not None:
        from punchline.data.humor.loaders import load_items

        items = len(load_items(resolve_path(cfg, cfg.humor.data))) * len(cfg.humor.models)
        model = cfg.provider(cfg.humor.judge.provider).model_id(cfg.humor.judge.model)
        from punchline.data.requests import Message, ProviderRequest

        req = ProviderRequest(
            provider=cfg.humor.judge.provider, model=model, messages=(Message("user", "x" * 6000),), max_tokens=16
        )
        return _scaled(cfg, stage, req, items, note)
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


def _scaled(cfg: RunConfig, stage: str, req: object, n: int, note: str) -> StageEstimate:
    from punchline.data.requests import ProviderRequest

    assert isinstance(req, ProviderRequest)
    units = [UnitSpec(unit_id=str(i), request=msgspec.structs.replace(req, sample_slot=i)) for i in range(n)]
    return _estimate(cfg, stage, units, exact=False, note=note)
