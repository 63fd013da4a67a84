"""The Puns 205 workflow as engine stages: collect -> classify -> rank -> cloze -> evaluate.

Each stage's ``plan`` reads only the config and earlier artifacts; each ``reduce`` is a pure
function of results, using the same ``data/`` functions as the ``punchline puns`` commands, so an
engine run and the offline tools produce byte-identical files.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any

import msgspec

from punchline.cluster.config import Count, Name, Names, RunConfig, resolve_path
from punchline.cluster.pipeline import Stage, StageContext, repeated
from punchline.cluster.result_sections import ResultSection, ResultsView
from punchline.data.errors import ConfigError, InputError
from punchline.data.figures.figure_cache import FigureCache
from punchline.data.provider_settings import Mode
from punchline.data.requests import Message, ProviderRequest
from punchline.data.simulator import FakeConfig, SimRequest
from punchline.data.storage.jsonio import decode_bytes, dumps_upstream, upstream_object_chunks
from punchline.data.storage.run_layout import RunLayout
from punchline.data.store import Store
from punchline.data.units import UnitResult, UnitSpec, in_unit_order
from punchline.pipelines.puns.data.classify import Verdicts, batches, classify_request, merge_all, parse_verdicts
from punchline.pipelines.puns.data.cloze import build_tests
from punchline.pipelines.puns.data.cloze_report import build_report, write_report
from punchline.pipelines.puns.data.cloze_run import cloze_request, to_response
from punchline.pipelines.puns.data.completions import (
    build_raw_entry,
    greedy_request,
    sample_request,
    truncate_before_blank,
)
from punchline.pipelines.puns.data.puns_history import lists_as_classified
from punchline.pipelines.puns.data.puns_io import load_classified, load_puns
from punchline.pipelines.puns.data.schemas import (
    ClassifiedCompletions,
    ClozeModelResponses,
    ClozeTest,
    ModelCompletions,
    PunEntry,
    RawCompletions,
)
from punchline.pipelines.puns.data.tiers import apply_rankings, rank, tier_counts
from punchline.pipelines.puns.data.words import extract_word
from punchline.pipelines.puns.results import results
from punchline.pipelines.puns.simulate import PunsSimKnobs, simulate


class CollectSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[puns.collect]``: sampled and greedy first-word completions of every joke, per model."""

    provider: Annotated[Name, msgspec.Meta(description="the provider of the models")]
    models: Annotated[Names, msgspec.Meta(description="model nicknames of that provider")]
    samples: Annotated[
        int, msgspec.Meta(ge=1, le=1000, description="sampled completions per joke and model (plus one greedy)")
    ] = 20
    mode: Annotated[
        Mode | None,
        msgspec.Meta(description="this stage's units online or through the batch API (default: the provider's mode)"),
    ] = None


class ClassifySettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[puns.classify]``: an LLM classifies the words the jokes' lists do not know."""

    provider: Annotated[Name, msgspec.Meta(description="the classifier's provider")]
    model: Annotated[Name, msgspec.Meta(description="the classifier's model nickname")]
    batch_size: Annotated[int, msgspec.Meta(ge=1, le=1000, description="jokes per classification request")] = 10
    mode: Annotated[
        Mode | None,
        msgspec.Meta(description="this stage's units online or through the batch API (default: the provider's mode)"),
    ] = None


class ClozeSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[puns.cloze]``: the contrastive cloze tests built from the tiers."""

    pairs: Annotated[Count, msgspec.Meta(description="cloze pairs to build (3 jokes each)")] = 50
    seed: Annotated[int, msgspec.Meta(ge=0, description="seed of the pairs' draw")] = 42


class EvaluateSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[puns.evaluate]``: the cloze tests run against models."""

    provider: Annotated[Name, msgspec.Meta(description="the provider of the models")]
    models: Annotated[Names, msgspec.Meta(description="model nicknames of that provider")]
    # score the answers against this puns file's lists instead of the run's own (upstream's analysis
    # scored against the lists of its day, which had grown since classification)
    score_against: Annotated[
        Name | None, msgspec.Meta(description="a puns file whose lists score the answers instead of the run's own")
    ] = None
    mode: Annotated[
        Mode | None,
        msgspec.Meta(description="this stage's units online or through the batch API (default: the provider's mode)"),
    ] = None


class PunsSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The Puns 205 workflow: collect -> classify -> rank -> cloze -> evaluate."""

    jokes: Annotated[Name, msgspec.Meta(description="the puns JSON file (relative to the config)")]
    # a classified_completions.json: drop from the jokes' lists every word it calls "other", i.e. use
    # the lists as they were when it was made (pipelines/puns/data/puns_history.py)
    lists_at_classification: Annotated[
        Name | None,
        msgspec.Meta(
            description="a classified_completions.json: use the jokes' lists as they were when it was classified"
        ),
    ] = None
    collect: Annotated[CollectSettings, msgspec.Meta(description="the collect stage")]
    classify: Annotated[
        ClassifySettings | None, msgspec.Meta(description="the classify stage (none: stop after collect)")
    ] = None
    cloze: Annotated[ClozeSettings | None, msgspec.Meta(description="the cloze stage")] = None
    evaluate: Annotated[EvaluateSettings | None, msgspec.Meta(description="the evaluate stage")] = None


def settings_of(cfg: RunConfig) -> PunsSettings:
    """The run's ``[puns]`` table, decoded."""
    assert isinstance(cfg.settings, PunsSettings), "not a puns config"
    return cfg.settings


RAW = "raw_completions.json"
CLASSIFIED = "classified_completions.json"
RANKED = "puns_ranked.json"
CLOZE_REPORT = "cloze_report"  # the folder of the cloze report's files
TIERS_PLOT = "tiers.png"
# the code the figures and the cloze report are drawn by (their figure cache's digest covers all of it)
DRAWING_CODE = ("punchline.data", "punchline.pipelines.puns.data")
TESTS = "contextual_cloze_tests.json"
CONTEXTS_PER_PAIR = 3  # jokes one cloze pair uses: its target and two context jokes (pipelines/puns/data/cloze.py)
RESPONSES = "cloze_responses.json"


def run_jokes(cfg: RunConfig) -> list[PunEntry]:
    """The jokes a run works on: the ``jokes`` file, with the lists as they were at classification time
    when ``lists_at_classification`` names a classified checkpoint."""
    settings = settings_of(cfg)
    jokes = load_puns(resolve_path(cfg, settings.jokes))
    if settings.lists_at_classification is None:
        return jokes
    path = resolve_path(cfg, settings.lists_at_classification)
    return lists_as_classified(jokes, load_classified(path), file=str(path))[0]


def _jokes(ctx: StageContext) -> list[PunEntry]:
    return run_jokes(ctx.cfg)


class CollectStage:
    """Stage 3: per joke and model, one greedy call and one call for ``samples`` sampled completions."""

    name = "collect"

    def plan(self, ctx: StageContext) -> Iterator[UnitSpec]:
        """Generated in unit order (jokes by index, models by nickname, greedy before samples), so the
        driver never holds the plan: it is the largest stage by far."""
        cfg = settings_of(ctx.cfg)
        assert cfg is not None
        settings = ctx.cfg.provider(cfg.collect.provider)
        for joke in sorted(_jokes(ctx), key=lambda j: f"{j.index:05d}"):
            prompt = truncate_before_blank(joke.sentence)
            for nick in sorted(cfg.collect.models):
                model_id = settings.model_id(nick)
                base = f"collect/{joke.index:05d}/{nick}"
                yield UnitSpec(unit_id=f"{base}/greedy", request=greedy_request(cfg.collect.provider, model_id, prompt))
                yield UnitSpec(
                    unit_id=f"{base}/samples",
                    request=sample_request(cfg.collect.provider, model_id, prompt, n=cfg.collect.samples),
                )

    def reduce(self, ctx: StageContext, results: Mapping[str, UnitResult]) -> list[str]:
        """raw_completions.json, written joke by joke: at a million units it is never held whole."""
        cfg = settings_of(ctx.cfg)
        assert cfg is not None

        def entries() -> Iterator[tuple[str, object]]:
            for joke in _jokes(ctx):
                models = {}
                for nick in cfg.collect.models:
                    base = f"collect/{joke.index:05d}/{nick}"
                    greedy = results[f"{base}/greedy"].response
                    samples = results[f"{base}/samples"].response
                    models[nick] = ModelCompletions(
                        greedy=extract_word(greedy.texts[0]) if greedy and greedy.texts else "",
                        samples=[w for t in (samples.texts if samples else []) if (w := extract_word(t))],
                    )
                yield str(joke.index), build_raw_entry(joke, models)

        ctx.write_artifact_chunks(RAW, upstream_object_chunks(entries()))
        return [RAW]


class ClassifyStage:
    """Stage 4: unknown candidate words classified by an LLM, ``batch_size`` jokes per call."""

    name = "classify"

    def _raw(self, ctx: StageContext) -> RawCompletions:
        return decode_bytes(ctx.read_artifact(RAW), RawCompletions, source=ctx.artifact_key(RAW))

    def plan(self, ctx: StageContext) -> list[UnitSpec]:
        cfg = settings_of(ctx.cfg)
        assert cfg is not None and cfg.classify is not None
        model_id = ctx.cfg.provider(cfg.classify.provider).model_id(cfg.classify.model)
        units = []
        for i, batch in enumerate(batches(list(self._raw(ctx).values()), size=cfg.classify.batch_size)):
            units.append(
                UnitSpec(
                    unit_id=f"classify/{i:05d}",
                    request=classify_request(cfg.classify.provider, model_id, batch),
                    check="punchline.pipelines.puns.data.classify:check_verdicts",
                )
            )
        return in_unit_order(units)

    def reduce(self, ctx: StageContext, results: Mapping[str, UnitResult]) -> list[str]:
        verdicts: Verdicts = {}
        for uid in sorted(results):
            r = results[uid]
            if r.response is not None and r.response.texts:
                verdicts.update(parse_verdicts(r.response.texts[0]))
        classified: ClassifiedCompletions = merge_all(self._raw(ctx), verdicts)
        ctx.write_artifact(CLASSIFIED, dumps_upstream(classified).encode())
        return [CLASSIFIED]


class RankStage:
    """Stage 5: tiers from the classified completions (no provider calls)."""

    name = "rank"
    warm_imports = ("punchline.pipelines.puns.data.plots",)  # matplotlib: a second or more to import

    def plan(self, ctx: StageContext) -> list[UnitSpec]:
        return []

    def reduce(self, ctx: StageContext, results: Mapping[str, UnitResult]) -> list[str]:
        classified: ClassifiedCompletions = decode_bytes(
            ctx.read_artifact(CLASSIFIED), ClassifiedCompletions, source=ctx.artifact_key(CLASSIFIED)
        )
        ranked = apply_rankings(_jokes(ctx), rank(classified))
        ctx.write_artifact(RANKED, dumps_upstream(ranked).encode())

        def draw() -> dict[str, bytes]:
            from punchline.pipelines.puns.data.plots import plot_tiers  # lazy: matplotlib takes a second to import

            return {TIERS_PLOT: plot_tiers(ranked)}

        drawn_from = msgspec.json.encode(ranked)  # every field (the figure's input), not the upstream file's
        plots = FigureCache(ctx.store, DRAWING_CODE).files("puns/tiers", drawn_from, draw)  # a rerun draws none
        ctx.write_artifact(TIERS_PLOT, plots[TIERS_PLOT])
        return [RANKED, TIERS_PLOT]


class ClozeStage:
    """Stage 6: the contrastive cloze tests (no provider calls)."""

    name = "cloze"

    def plan(self, ctx: StageContext) -> list[UnitSpec]:
        return []

    def reduce(self, ctx: StageContext, results: Mapping[str, UnitResult]) -> list[str]:
        cfg = settings_of(ctx.cfg)
        assert cfg is not None and cfg.cloze is not None
        ranked: list[PunEntry] = decode_bytes(
            ctx.read_artifact(RANKED), list[PunEntry], source=ctx.artifact_key(RANKED)
        )
        tests = build_tests(ranked, seed=cfg.cloze.seed, pairs=cfg.cloze.pairs, file=ctx.artifact_key(RANKED))
        ctx.write_artifact(TESTS, dumps_upstream(tests).encode())
        return [TESTS]


class EvaluateStage:
    """Run the cloze tests against models and report the funny-rate shift per priming context."""

    name = "evaluate"
    warm_imports = ("punchline.pipelines.puns.data.plots",)

    def _tests(self, ctx: StageContext) -> list:
        return decode_bytes(ctx.read_artifact(TESTS), list[ClozeTest], source=ctx.artifact_key(TESTS))

    def plan(self, ctx: StageContext) -> list[UnitSpec]:
        cfg = settings_of(ctx.cfg)
        assert cfg is not None and cfg.evaluate is not None
        settings = ctx.cfg.provider(cfg.evaluate.provider)
        return in_unit_order(
            UnitSpec(
                unit_id=f"evaluate/{nick}/{i:05d}",
                request=cloze_request(cfg.evaluate.provider, settings.model_id(nick), test),
            )
            for nick in cfg.evaluate.models
            for i, test in enumerate(self._tests(ctx))
        )

    def reduce(self, ctx: StageContext, results: Mapping[str, UnitResult]) -> list[str]:
        cfg = settings_of(ctx.cfg)
        assert cfg is not None and cfg.evaluate is not None
        settings = ctx.cfg.provider(cfg.evaluate.provider)
        tests = self._tests(ctx)
        responses = {}
        for nick in cfg.evaluate.models:
            per = {}
            for i, test in enumerate(tests):
                r = results[f"evaluate/{nick}/{i:05d}"].response
                per[str(i)] = to_response(test, r.texts[0] if r and r.texts else "")
            responses[nick] = ClozeModelResponses(model_id=settings.model_id(nick), responses=per)
        ctx.write_artifact(RESPONSES, dumps_upstream(responses).encode())
        if cfg.evaluate.score_against is not None:
            lists = load_puns(resolve_path(ctx.cfg, cfg.evaluate.score_against))
        else:
            lists = decode_bytes(ctx.read_artifact(RANKED), list[PunEntry], source=ctx.artifact_key(RANKED))
        report = build_report(responses, tests, lists)

        def draw() -> dict[str, bytes]:
            with tempfile.TemporaryDirectory() as tmp:
                write_report(report, Path(tmp))
                return {f.name: f.read_bytes() for f in Path(tmp).iterdir()}

        # the report's files (its figures above all) drawn once per report: a rerun copies them
        files = FigureCache(ctx.store, DRAWING_CODE).files("puns/cloze_report", msgspec.json.encode(report), draw)
        names = [RESPONSES]
        for name in sorted(files):
            ctx.write_artifact(f"{CLOZE_REPORT}/{name}", files[name])
            names.append(f"{CLOZE_REPORT}/{name}")
        return names


def stages(cfg: RunConfig) -> list[Stage]:
    puns = settings_of(cfg)
    out: list[Stage] = [CollectStage()]
    if puns.classify is not None:
        out.append(ClassifyStage())
        out += [RankStage()]
        if puns.cloze is not None:
            out.append(ClozeStage())
            if puns.evaluate is not None:
                out.append(EvaluateStage())
    return out


# Upper-bound request sizes for `plan` (the real prompts exist only once earlier stages have run):
# a classification batch of about 4000 characters with room for a long JSON verdict list.
CLASSIFY_PROMPT_CHARS = 4000
CLASSIFY_MAX_TOKENS = 4096
CLOZE_PROMPT_CHARS = 300


def _estimate_classify(cfg: RunConfig, puns: PunsSettings) -> list[UnitSpec]:
    assert puns.classify is not None
    n = math.ceil(len(load_puns(resolve_path(cfg, puns.jokes))) / puns.classify.batch_size)
    model = cfg.provider(puns.classify.provider).model_id(puns.classify.model)
    req = ProviderRequest(
        provider=puns.classify.provider,
        model=model,
        messages=(Message("user", "x" * CLASSIFY_PROMPT_CHARS),),
        max_tokens=CLASSIFY_MAX_TOKENS,
    )
    return repeated(req, n)


def _estimate_evaluate(cfg: RunConfig, puns: PunsSettings) -> list[UnitSpec]:
    """Two tests (straight and contrast) per cloze pair, per model, each a real cloze request."""
    assert puns.evaluate is not None and puns.cloze is not None
    test = ClozeTest(
        pair_id=0,
        type="straight",
        prompt="x" * CLOZE_PROMPT_CHARS,
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
    settings = cfg.provider(puns.evaluate.provider)
    requests = [
        cloze_request(puns.evaluate.provider, settings.model_id(nick), test)
        for nick in puns.evaluate.models
        for _ in range(2 * puns.cloze.pairs)
    ]
    return [UnitSpec(unit_id=f"{i}", request=msgspec.structs.replace(r, sample_slot=i)) for i, r in enumerate(requests)]


class PunsPipeline:
    """The Puns 205 workflow: collect -> classify -> rank -> cloze -> evaluate (``[puns]``)."""

    name = "puns"
    settings_type = PunsSettings
    simulate_knobs = PunsSimKnobs  # [simulator.pipeline_knobs.puns]

    def check_settings(self, settings: PunsSettings, source: str) -> None:
        """Every constraint is a msgspec.Meta range: nothing across fields to check."""

    def provider_refs(self, settings: PunsSettings) -> list[tuple[str, str]]:
        refs = [("puns.collect.provider", settings.collect.provider)]
        if settings.classify:
            refs.append(("puns.classify.provider", settings.classify.provider))
        if settings.evaluate:
            refs.append(("puns.evaluate.provider", settings.evaluate.provider))
        return refs

    def stage_mode(self, settings: PunsSettings, stage: str) -> Mode | None:
        tables: dict[str, Any] = {
            "collect": settings.collect,
            "classify": settings.classify,
            "evaluate": settings.evaluate,
        }
        mode: Mode | None = getattr(tables.get(stage), "mode", None)
        return mode

    def input_paths(self, settings: PunsSettings) -> list[str]:
        return [settings.jokes]

    def check_inputs(self, cfg: RunConfig) -> None:
        """The jokes (and the lists file, the ``score_against`` file) as the stages read them, and the
        cloze pairs against the jokes: a run that cannot build its cloze tests stops before collect pays."""
        settings = settings_of(cfg)
        jokes = run_jokes(cfg)
        path = resolve_path(cfg, settings.jokes)
        if not jokes:
            raise InputError("has no jokes: the run would have nothing to ask", file=str(path))
        if settings.evaluate is not None and settings.evaluate.score_against is not None:
            load_puns(resolve_path(cfg, settings.evaluate.score_against))
        if settings.classify is not None and settings.cloze is not None:
            pairs = settings.cloze.pairs
            if len(jokes) < CONTEXTS_PER_PAIR * pairs:
                raise ConfigError(
                    f"{pairs} cloze pairs need at least {CONTEXTS_PER_PAIR * pairs} jokes (a straight-dominated "
                    f"target and two context jokes per pair) but {path} has {len(jokes)}: lower the pairs or add jokes",
                    file=cfg.source,
                    field="puns.cloze.pairs",
                )

    def stages(self, cfg: RunConfig) -> list[Stage]:
        return stages(cfg)

    def estimate(self, cfg: RunConfig, stage: str) -> Iterable[UnitSpec]:
        puns = settings_of(cfg)
        if stage == "classify" and puns.classify is not None:
            return _estimate_classify(cfg, puns)
        if stage == "evaluate" and puns.evaluate is not None and puns.cloze:
            return _estimate_evaluate(cfg, puns)
        return []

    def headlines(self, ctx: StageContext) -> list[str]:
        return headlines(ctx.store, ctx.run_id)

    def results(self, view: ResultsView) -> list[ResultSection]:
        """For the viewer: the ranked jokes' tiers and the cloze report (:mod:`.results`)."""
        return results(view, RANKED, f"{CLOZE_REPORT}/report.md")

    def simulate(self, request: SimRequest) -> str | None:
        """Its prompts' simulated answers (:mod:`.simulate`)."""
        return simulate(request)

    def simulator_knobs(self, cfg: RunConfig, sim: FakeConfig) -> FakeConfig:
        return sim


PIPELINE = PunsPipeline()


def headlines(store: Store, run_id: str) -> list[str]:
    """What a person wants to see first after a run (markdown): the tiers and the cloze report."""
    out = []
    ranked = store.get(RunLayout(run_id).artifact(RANKED))
    if ranked is not None:
        counts = tier_counts(msgspec.json.decode(ranked, type=list[PunEntry]))
        out.append("tiers: " + ", ".join(f"{tier} {n}" for tier, n in counts.items()))
    report = store.get(RunLayout(run_id).artifact("cloze_report/report.md"))
    if report is not None:
        out.append(report.decode())
    return out
