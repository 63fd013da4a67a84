"""``punchline plan``: what a run will ask of its providers, before anything is called.

Stages whose units depend on earlier results cannot be expanded exactly before those results exist;
for them the plan shows the upper bound the pipeline's ``estimate`` states, and says so.

Each stage's calls are timed too (``calls_s``, :mod:`punchline.cluster.estimate.call_time`: the simulator's knobs,
the latencies this runs folder measured for a real endpoint, or a default per provider kind): only the requests the
response cache does not answer are called, when the plan is given the cache (``cached``); an upper-bound
stage's requests are synthetic, so it takes the cached share of the exact stages before it (the same
earlier answers give the same later requests). ``cluster/estimate/wall_estimate.py`` adds the run's fixed costs.

Only the requests the run will send are timed (``to_send``): identical requests are one (the engine keys each by its
content hash, and a unit whose key another holds waits for that one's answer), so ``plan`` hashes every exact
request as the engine does and counts each key once; an upper-bound stage's requests are unknown, so it is counted
at the share of its units an earlier run here sent (``estimate/request_ratios.py``), else by every unit (an upper
bound, ``sent_bound``). ``run``'s own checks skip the hashing (a few seconds at 10^6 units, for no use there).
"""

from __future__ import annotations

import json
import re
import tempfile
from collections import defaultdict
from collections.abc import Iterable

import msgspec

from punchline.cluster.config import RunConfig
from punchline.cluster.estimate.call_time import Latencies, SlotTime, simulated, unit_s
from punchline.cluster.estimate.latencies import endpoint
from punchline.cluster.estimate.request_ratios import Ratios, ratio_for
from punchline.cluster.estimate.wall_estimate import CacheLookup
from punchline.cluster.pipeline import StageContext, pipeline_code
from punchline.cluster.registry import pipeline_of
from punchline.cluster.run.executor import stage_providers
from punchline.data.errors import ConfigError
from punchline.data.provider_settings import PRICE_FIELDS, ProviderSettings
from punchline.data.simulator import FakeConfig
from punchline.data.stores.local import LocalStore
from punchline.data.units import UnitSpec
from punchline.schedulers.budget import estimate_request_cost
from punchline.schedulers.rate_limit import estimate_tokens
from punchline.workers.providers import kind_of, wire_calls

HASHED = "prompts hashed"  # an exact stage's requests, each keyed as the engine keys it: identical ones counted once
EVERY_UNIT = "every unit"  # an exact stage not hashed (``run``'s own checks): each unit a request
NO_RATIO = "every unit, an upper bound (no earlier run here sent this stage's requests)"


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
    units: int = 0
    # the expected time of the stage's calls (call_time.py): with every request called (a fresh cache), and
    # with only those the response cache does not answer (``cached_requests`` of ``requests`` are answered)
    all_calls_s: float = 0.0
    calls_s: float = 0.0
    cached_requests: int = 0
    providers: int = 0  # the providers its requests call online (the driver's worker holds one's call places)
    # what timed its calls (call_time.py): "simulator" knobs, latencies "measured" in this runs folder, or the
    # "default" per provider kind
    timed_by: list[str] = []
    # the requests the run will send: identical requests are one (``distinct_requests`` of ``requests``), and of
    # those the cache answers ``cached_requests``; ``sent_from`` says how they were counted (:data:`HASHED`, an
    # earlier run's ratio, or every unit: an upper bound, ``sent_bound``)
    distinct_requests: int = 0
    to_send: int = 0
    sent_from: str = ""
    sent_bound: bool = False


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


class _Load:
    """Requests and tokens per provider and per model: what the rate limits bound."""

    def __init__(self) -> None:
        self.req: dict[str, int] = defaultdict(int)
        self.tok: dict[str, int] = defaultdict(int)
        self.model_req: dict[tuple[str, str], int] = defaultdict(int)
        self.model_tok: dict[tuple[str, str], int] = defaultdict(int)

    def add(self, provider: str, model: str, calls: int, tokens: int) -> None:
        self.req[provider] += calls
        self.tok[provider] += tokens
        self.model_req[(provider, model)] += calls
        self.model_tok[(provider, model)] += tokens


def _min_wall_s(cfg: RunConfig, load: _Load) -> float:
    """The least wall time the rate limits allow for these requests and tokens: the slowest of the providers'
    limits (all models together) and any model's own."""
    wall = 0.0
    for name, n in load.req.items():
        s = cfg.providers[name]
        if s.requests_per_minute:
            wall = max(wall, n / s.requests_per_minute * 60)
        if s.tokens_per_minute:
            wall = max(wall, load.tok[name] / s.tokens_per_minute * 60)
    for (name, model), n in load.model_req.items():
        m_rpm, m_tpm = cfg.providers[name].model_limits(model)
        if m_rpm:
            wall = max(wall, n / m_rpm * 60)
        if m_tpm:
            wall = max(wall, load.model_tok[(name, model)] / m_tpm * 60)
    return wall


class _Calls:
    """The online requests of a stage (rate limits and call slots) and whether any go in batches."""

    def __init__(self) -> None:
        self.load = _Load()
        self.slots = SlotTime()
        self.batch_delay_s: float | None = None  # None: no request goes in batches

    def wall_s(self, cfg: RunConfig) -> float:
        return max(_min_wall_s(cfg, self.load), self.slots.wall_s(cfg), self.batch_delay_s or 0.0)


def _estimate(
    cfg: RunConfig,
    stage: str,
    units: Iterable[UnitSpec],
    exact: bool,
    note: str = "",
    cached: CacheLookup | None = None,
    latencies: Latencies | None = None,
    seen: set[int] | None = None,
) -> StageEstimate:
    """Requests, tokens, dollars and the least wall time the rate limits allow (limits are per provider,
    all models together, plus any model's own); the expected time of its calls, of the uncached ones.
    ``seen``: the hashes of the keys of the requests planned so far in the run (updated): a request whose key
    is in it is not sent again (the engine's lease on the key makes its copies wait for its one answer), so it
    is neither timed nor counted under the rate limits; None: each unit is taken as a request of its own."""
    as_run = stage_providers(cfg.providers, cfg.stage_mode(stage))  # a stage's own mode over its providers'
    modes: set[str] = set()
    mode_usd = 0.0

    every = _Load()
    fresh, uncached = _Calls(), _Calls()  # every distinct request called; only those the cache does not answer
    tin = tout = n_units = hits = requests = distinct = 0
    timed_by: set[str] = set()
    usd = batch_usd = 0.0
    for u in units:
        n_units += 1
        settings = cfg.provider(u.request.provider)
        check_model(cfg, stage, u.request.provider, u.request.model)
        calls = wire_calls(settings, u.request)
        i, o, c = estimate_request_cost(settings, u.request, calls)  # the most it may cost (what the cap holds)
        paced = estimate_tokens(u.request)  # what the rate limiter reserves for it (a likely figure)
        tin, tout, usd = tin + i, tout + o, usd + c
        batch_usd += c * settings.batch_price_factor
        mode = as_run[u.request.provider].mode
        if mode == "batch":  # a stage's own mode asked for batches
            _check_batch_api(cfg, stage, u.request.provider, settings)
        modes.add(mode)
        mode_usd += c * settings.batch_price_factor if mode == "batch" else c
        requests += calls
        key = u.request.key() if seen is not None or cached is not None else ""
        if seen is not None:
            hashed = hash(key)  # an int, not the 40-character key: 10^6 of them in a set stay small
            if hashed in seen:
                continue
            seen.add(hashed)
        distinct += calls
        every.add(u.request.provider, u.request.model, calls, paced)
        hit = cached is not None and cached(u.request, key)
        hits += calls if hit else 0
        for timed in (fresh,) if hit else (fresh, uncached):
            if mode == "batch":  # a batch's time is the provider's, not the slots': the simulator's knob says it
                sim = cfg.simulator or FakeConfig()
                timed.batch_delay_s = sim.batch_delay_s if simulated(settings) else 0.0
            else:
                timed.load.add(u.request.provider, u.request.model, calls, paced)
                seconds, source = unit_s(cfg, settings, u.request.model, calls, latencies)
                timed.slots.add(u.request.provider, u.request.model, seconds)
                timed_by.add(source)
    return StageEstimate(
        stage=stage,
        requests=requests,
        exact=exact,
        input_tokens=tin,
        output_tokens=tout,
        cost_usd=usd,
        batch_cost_usd=batch_usd,
        mode="+".join(sorted(modes)) or "online",
        mode_cost_usd=mode_usd,
        min_wall_s=_min_wall_s(cfg, every),
        note=note,
        units=n_units,
        all_calls_s=fresh.wall_s(cfg),
        calls_s=uncached.wall_s(cfg),
        cached_requests=hits,
        providers=len(fresh.load.req),
        timed_by=sorted(timed_by),
        distinct_requests=distinct,
        to_send=distinct - hits,
        sent_from=HASHED if seen is not None else EVERY_UNIT,
        sent_bound=not exact,
    )


def check_model(cfg: RunConfig, stage: str, provider: str, model: str) -> None:
    """A stage may call only a configured model with both its prices declared: a nickname unknown to the provider
    would reach the provider as a model id, and a price left out would be taken as $0; either way its calls would
    be out of the budget cap's sight and ``plan`` would say they cost nothing. A price of 0 written out is declared
    (a free endpoint); an offline run (``[run] offline``) calls nothing, so pays nothing, and needs none."""
    settings = cfg.provider(provider)
    if settings.price(model) is None:
        known = ", ".join(sorted(settings.models)) or "none configured"
        raise ConfigError(
            f"stage {stage} calls model {model!r}, which is not a nickname or id in [providers.{provider}.models] "
            f"(known: {known}): fix the stage's model or add the model with its prices",
            file=cfg.source or None,
            field=f"providers.{provider}.models",
        )
    missing = settings.undeclared_prices(model)
    if not missing or cfg.run.offline:
        return
    nick = next(n for n, m in settings.models.items() if m.id == model)
    key = nick if re.fullmatch(r"[A-Za-z0-9_-]+", nick) else json.dumps(nick)  # as a TOML key
    raise ConfigError(
        f"provider {provider!r}, model {nick!r} ({model}) declares no {' and no '.join(missing)}, so plan and the "
        f"budget cannot price its calls: write its prices in its table, e.g. {key} = {{ id = {json.dumps(model)}, "
        f"{', '.join(f'{f} = ...' for f in PRICE_FIELDS)} }}, or 0 for each if it costs nothing",
        file=cfg.source or None,
        field=f"providers.{provider}.models.{nick}",
    )


def plan_run(
    cfg: RunConfig,
    cached: CacheLookup | None = None,
    latencies: Latencies | None = None,
    *,
    ratios: Ratios | None = None,
    distinct: bool = False,
) -> list[StageEstimate]:
    """Every stage with calls, expanded; ``cached``: the response cache, asked about each exact request;
    ``latencies``: the real endpoints' measured in this runs folder (``estimate/latencies.py``); ``ratios``: the
    requests earlier runs here sent per unit of each stage (``estimate/request_ratios.py``), for the stages whose
    prompts depend on earlier answers; ``distinct``: hash every exact request (as the engine keys it) to count
    identical ones once (``plan`` does; ``run``'s checks need no count, and skip the hashing)."""
    out: list[StageEstimate] = []
    asked = answered = 0  # distinct requests of the exact stages so far, and how many the cache answers
    seen: set[int] | None = set() if distinct else None
    with tempfile.TemporaryDirectory() as tmp:
        ctx = StageContext(cfg, "plan", LocalStore(tmp))
        for stage in pipeline_of(cfg).stages(cfg):
            try:
                with pipeline_code(cfg.run.pipeline, stage, "plan", passing=(FileNotFoundError,)):
                    estimate = _estimate(
                        cfg, stage.name, stage.plan(ctx), exact=True, cached=cached, latencies=latencies, seen=seen
                    )
            except FileNotFoundError:
                bound = _upper_bound(cfg, stage.name, latencies, ratios)
                out.append(_as_cached(bound, answered / asked if asked else 0.0))
                continue
            asked, answered = asked + estimate.distinct_requests, answered + estimate.cached_requests
            if estimate.requests:
                out.append(estimate)
    return out


def _as_cached(estimate: StageEstimate, share: float) -> StageEstimate:
    """An upper-bound stage whose earlier stages' answers are ``share`` cached: as much of its own is taken
    to be (a rerun's earlier answers are the same, so its later requests are too)."""
    if not share or not estimate.requests:
        return estimate
    hits = round(estimate.distinct_requests * share)
    return msgspec.structs.replace(
        estimate,
        cached_requests=hits,
        to_send=estimate.distinct_requests - hits,
        calls_s=estimate.calls_s * (1 - share),
    )


def _sent_as_before(
    cfg: RunConfig, estimate: StageEstimate, units: list[UnitSpec], ratios: Ratios | None
) -> StageEstimate:
    """An upper-bound stage's requests to send: its units times the share an earlier run of the stage sent (to
    the same endpoints), or all of them (an upper bound) when no run here sent any."""
    called = {endpoint(cfg.provider(u.request.provider), u.request.model) for u in units}
    before = ratio_for(ratios, estimate.stage, called)
    if before is None:
        return msgspec.structs.replace(estimate, sent_from=NO_RATIO, sent_bound=True)
    share = min(1.0, before.ratio)
    distinct = round(estimate.requests * share)
    return msgspec.structs.replace(
        estimate,
        distinct_requests=distinct,
        to_send=distinct,
        calls_s=estimate.all_calls_s * share,
        sent_from=f"run {before.run_id} ({before.sent} sent of {before.units} units)",
        sent_bound=False,
    )


def _upper_bound(
    cfg: RunConfig, stage: str, latencies: Latencies | None = None, ratios: Ratios | None = None
) -> StageEstimate:
    """Units of a stage that needs earlier results: the most the pipeline says it can have; the requests it will
    send, as an earlier run of it sent them."""
    units = list(pipeline_of(cfg).estimate(cfg, stage))
    if units:
        note = "upper bound: depends on earlier results"
        bound = _estimate(cfg, stage, units, exact=False, note=note, latencies=latencies)
        return _sent_as_before(cfg, bound, units, ratios)
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
