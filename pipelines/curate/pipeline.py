"""Puns stages 1-2 as engine stages: rate -> repair -> rerate -> build.

Each stage hands the next one an artifact (first ratings, repaired jokes, new ratings), so a
resumed run re-plans from the store exactly what the first attempt planned. A unit that failed
for good leaves its jokes unrated (or unrepaired); :func:`data.curation.build` then leaves out the
jokes it cannot rank, and the run is reported failed so ``retry-failed`` can fill the gap.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated

import msgspec

from punchline.cluster.config import Count, Name, Names, RunConfig, resolve_path
from punchline.cluster.pipeline import Stage, StageContext
from punchline.data.errors import ConfigError, InputError
from punchline.data.provider_settings import Mode
from punchline.data.simulator import FakeConfig, SimRequest
from punchline.data.storage.jsonio import decode_bytes, dumps_upstream
from punchline.data.storage.run_layout import RunLayout
from punchline.data.store import Store
from punchline.data.units import UnitResult, UnitSpec, in_unit_order
from punchline.pipelines.curate.curation import (
    Candidate,
    MalformedRatings,
    MalformedRepair,
    RatingRecord,
    Ratings,
    batches,
    build,
    final_ratings,
    load_candidates,
    needs_repair,
    parse_ratings,
    parse_repair,
    rating_request,
    repair_request,
)
from punchline.pipelines.curate.simulate import simulate
from punchline.pipelines.puns.data.puns_io import validate_puns


class ModelRef(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A provider and one of its model nicknames."""

    provider: Annotated[Name, msgspec.Meta(description="the provider")]
    model: Annotated[Name, msgspec.Meta(description="the model nickname")]


class CurateSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Puns stages 1-2: rate candidate jokes with several providers, repair the weak ones, build the set.

    ``raters`` maps a rating field's prefix (``gemini`` -> ``gemini_rating``) to the model that rates.
    """

    jokes: Annotated[Name, msgspec.Meta(description="the candidate jokes (JSON), relative to the config")]
    raters: Annotated[
        dict[str, ModelRef],
        msgspec.Meta(min_length=1, description="rating-field prefix (gemini -> gemini_rating) -> the model that rates"),
    ]
    repair: Annotated[
        ModelRef | None, msgspec.Meta(description="the model that rewrites weak jokes (none: no repair)")
    ] = None
    repair_below: Annotated[
        float, msgspec.Meta(ge=0.0, le=10.0, description="jokes whose consensus rating is below this are repaired")
    ] = 7.0
    top: Annotated[Count, msgspec.Meta(description="jokes in the built set")] = 205
    batch_size: Annotated[int, msgspec.Meta(ge=1, le=1000, description="jokes per rating request")] = 10
    consensus: Annotated[Names, msgspec.Meta(description="raters whose ratings are summed into the consensus")] = (
        msgspec.field(default_factory=lambda: ["gemini", "claudecode"])
    )
    tie_break: Annotated[
        str, msgspec.Meta(description="rater whose score breaks consensus ties (then sentence length)")
    ] = "anthropic"


FIRST = "ratings_first.json"
REPAIRED = "repaired.json"
RERATED = "ratings_rerate.json"
RATINGS = "ratings.json"
CURATED = "puns_curated.json"


def settings_of(cfg: RunConfig) -> CurateSettings:
    """The run's ``[curate]`` table, decoded."""
    assert isinstance(cfg.settings, CurateSettings), "not a curate config"
    return cfg.settings


def _settings(ctx: StageContext) -> CurateSettings:
    return settings_of(ctx.cfg)


def _candidates(ctx: StageContext) -> list[Candidate]:
    return load_candidates(resolve_path(ctx.cfg, _settings(ctx).jokes))


def _read(ctx: StageContext, name: str, type_: object) -> object:
    return decode_bytes(ctx.read_artifact(name), type_, source=ctx.artifact_key(name))


def _rating_units(ctx: StageContext, stage: str, jokes: list[Candidate]) -> list[UnitSpec]:
    """One unit per rater per batch; the check names the ids the reply must rate."""
    cfg = _settings(ctx)
    units = []
    for rater, ref in sorted(cfg.raters.items()):
        model_id = ctx.cfg.provider(ref.provider).model_id(ref.model)
        for i, batch in enumerate(batches(jokes, cfg.batch_size)):
            units.append(
                UnitSpec(
                    unit_id=f"{stage}/{rater}/{i:05d}",
                    request=rating_request(ref.provider, model_id, batch),
                    check="punchline.pipelines.curate.curation:check_ratings:" + ",".join(str(c.id) for c in batch),
                )
            )
    return in_unit_order(units)


def _collect_ratings(
    ctx: StageContext, stage: str, jokes: list[Candidate], results: Mapping[str, UnitResult]
) -> Ratings:
    """Scores of every unit that succeeded; a failed unit's jokes stay unrated by that rater."""
    cfg = _settings(ctx)
    out: Ratings = {}
    for rater in sorted(cfg.raters):
        scores: dict[int, int] = {}
        for i, batch in enumerate(batches(jokes, cfg.batch_size)):
            r = results.get(f"{stage}/{rater}/{i:05d}")
            if r is None or r.response is None or not r.response.texts:
                continue
            try:
                scores.update(parse_ratings(r.response.texts[0], [c.id for c in batch]))
            except MalformedRatings:  # only a cached answer from before the validator existed
                continue
        out[rater] = dict(sorted(scores.items()))
    return out


class RateStage:
    """Stage 1a: every rater scores every candidate, ``batch_size`` jokes per call."""

    name = "rate"

    def plan(self, ctx: StageContext) -> list[UnitSpec]:
        return _rating_units(ctx, self.name, _candidates(ctx))

    def reduce(self, ctx: StageContext, results: Mapping[str, UnitResult]) -> list[str]:
        ratings = _collect_ratings(ctx, self.name, _candidates(ctx), results)
        ctx.write_artifact(FIRST, dumps_upstream(ratings).encode())
        return [FIRST]


class RepairStage:
    """Stage 1b: jokes whose mean first rating is below ``repair_below`` go to the repair model."""

    name = "repair"

    def _weak(self, ctx: StageContext) -> list[Candidate]:
        first: Ratings = _read(ctx, FIRST, Ratings)  # type: ignore[assignment]
        return needs_repair(_candidates(ctx), first, _settings(ctx).repair_below)

    def plan(self, ctx: StageContext) -> list[UnitSpec]:
        ref = _settings(ctx).repair
        assert ref is not None
        model_id = ctx.cfg.provider(ref.provider).model_id(ref.model)
        return in_unit_order(
            UnitSpec(
                unit_id=f"repair/{c.id:08d}",
                request=repair_request(ref.provider, model_id, c),
                check=f"punchline.pipelines.curate.curation:check_repair:{c.id}",
            )
            for c in self._weak(ctx)
        )

    def reduce(self, ctx: StageContext, results: Mapping[str, UnitResult]) -> list[str]:
        repaired = []
        for c in self._weak(ctx):
            r = results.get(f"repair/{c.id:08d}")
            if r is None or r.response is None or not r.response.texts:
                continue
            try:
                repaired.append(parse_repair(r.response.texts[0], c))
            except MalformedRepair:
                continue
        ctx.write_artifact(REPAIRED, dumps_upstream(repaired).encode())
        return [REPAIRED]


class RerateStage:
    """Stage 1c: the repaired jokes are scored again by every rater."""

    name = "rerate"

    def _repaired(self, ctx: StageContext) -> list[Candidate]:
        return _read(ctx, REPAIRED, list[Candidate])  # type: ignore[return-value]

    def plan(self, ctx: StageContext) -> list[UnitSpec]:
        return _rating_units(ctx, self.name, self._repaired(ctx))

    def reduce(self, ctx: StageContext, results: Mapping[str, UnitResult]) -> list[str]:
        ratings = _collect_ratings(ctx, self.name, self._repaired(ctx), results)
        ctx.write_artifact(RERATED, dumps_upstream(ratings).encode())
        return [RERATED]


class BuildStage:
    """Stage 2: merge the ratings and keep the ``top`` jokes (no provider calls)."""

    name = "build"

    def plan(self, ctx: StageContext) -> list[UnitSpec]:
        return []

    def reduce(self, ctx: StageContext, results: Mapping[str, UnitResult]) -> list[str]:
        cfg = _settings(ctx)
        first: Ratings = _read(ctx, FIRST, Ratings)  # type: ignore[assignment]
        repaired: list[Candidate] = []
        rerated: Ratings = {}
        if cfg.repair is not None:
            repaired = _read(ctx, REPAIRED, list[Candidate])  # type: ignore[assignment]
            rerated = _read(ctx, RERATED, Ratings)  # type: ignore[assignment]
        jokes, final, records = final_ratings(_candidates(ctx), first, repaired, rerated)
        curated = build(jokes, final, cfg)
        validate_puns(curated, file=ctx.artifact_key(CURATED))
        ctx.write_artifact(RATINGS, dumps_upstream(records).encode())
        ctx.write_artifact(CURATED, dumps_upstream(curated).encode())
        return [RATINGS, CURATED]


def check_settings(cfg: CurateSettings, source: str = "") -> None:
    """Consensus and tie-break raters must exist; fail before any call is paid for."""
    where = source or None
    if not cfg.raters:
        raise ConfigError("at least one rater is needed", file=where, field="curate.raters")
    for name in [*cfg.consensus, cfg.tie_break]:
        if name not in cfg.raters:
            raise ConfigError(
                f"rater {name!r} is not one of the raters {sorted(cfg.raters)}",
                file=where,
                field="curate.consensus" if name in cfg.consensus else "curate.tie_break",
            )
    if cfg.batch_size < 1:
        raise ConfigError("must be at least 1", file=where, field="curate.batch_size")
    if cfg.top < 1:
        raise ConfigError("must be at least 1", file=where, field="curate.top")


def stages(cfg: RunConfig) -> list[Stage]:
    settings = settings_of(cfg)
    check_settings(settings, cfg.source)
    out: list[Stage] = [RateStage()]
    if settings.repair is not None:
        out += [RepairStage(), RerateStage()]
    out.append(BuildStage())
    return out


def headlines(store: Store, run_id: str) -> list[str]:
    """What a person wants to see first after a run (markdown)."""
    raw = store.get(RunLayout(run_id).artifact(RATINGS))
    if raw is None:
        return []
    records = msgspec.json.decode(raw, type=list[RatingRecord])
    repaired = sum(r.repaired for r in records)
    return [f"curated: {len(records)} candidates rated, {repaired} repaired and rated again"]


class CuratePipeline:
    """Puns stages 1-2: rate -> (repair -> rerate) -> build ``puns_curated.json`` (``[curate]``)."""

    name = "curate"
    settings_type = CurateSettings

    def check_settings(self, settings: CurateSettings, source: str) -> None:
        """The tie-break and consensus raters must be raters."""
        for field, rater in [("curate.tie_break", settings.tie_break)] + [
            ("curate.consensus", c) for c in settings.consensus
        ]:
            if rater not in settings.raters:
                raise ConfigError(
                    f"{rater!r} is not one of curate.raters {sorted(settings.raters)}", file=source, field=field
                )

    def provider_refs(self, settings: CurateSettings) -> list[tuple[str, str]]:
        refs = [(f"curate.raters.{rater}.provider", ref.provider) for rater, ref in settings.raters.items()]
        if settings.repair:
            refs.append(("curate.repair.provider", settings.repair.provider))
        return refs

    def stage_mode(self, settings: CurateSettings, stage: str) -> Mode | None:
        """No stage table of its own: the providers' mode."""
        return None

    def input_paths(self, settings: CurateSettings) -> list[str]:
        return [settings.jokes]

    def check_inputs(self, cfg: RunConfig) -> None:
        """The candidates as the rate stage reads them; none at all is a mistake, not an empty run."""
        path = resolve_path(cfg, settings_of(cfg).jokes)
        if not load_candidates(path):
            raise InputError("has no candidate jokes: the run would have nothing to rate", file=str(path))

    def stages(self, cfg: RunConfig) -> list[Stage]:
        return stages(cfg)

    def estimate(self, cfg: RunConfig, stage: str) -> Iterable[UnitSpec]:
        """repair: at most every candidate is weak; rerate: at most every candidate is repaired and rated
        again by every rater."""
        cur = settings_of(cfg)
        cands = load_candidates(resolve_path(cfg, cur.jokes))
        if stage == "repair" and cur.repair is not None:
            model = cfg.provider(cur.repair.provider).model_id(cur.repair.model)
            return [UnitSpec(unit_id=str(c.id), request=repair_request(cur.repair.provider, model, c)) for c in cands]
        if stage == "rerate":
            return [
                UnitSpec(
                    unit_id=f"{name}/{i}",
                    request=rating_request(ref.provider, cfg.provider(ref.provider).model_id(ref.model), batch),
                )
                for name, ref in cur.raters.items()
                for i, batch in enumerate(batches(cands, cur.batch_size))
            ]
        return []

    def headlines(self, ctx: StageContext) -> list[str]:
        return headlines(ctx.store, ctx.run_id)

    def simulate(self, request: SimRequest) -> str | None:
        """Its prompts' simulated answers (:mod:`.simulate`)."""
        return simulate(request)

    def simulator_knobs(self, cfg: RunConfig, sim: FakeConfig) -> FakeConfig:
        return sim


PIPELINE = CuratePipeline()
