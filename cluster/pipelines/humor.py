"""The Humor (MERA) benchmark as engine stages: generate -> (judge) -> score.

``generate`` asks each model once per item (greedy, as MERA does); ``judge`` asks the judge model
to grade each answer. Scoring is no stage of its own: it needs no provider call, so it runs in the
reduce of the last stage, through the same ``score_and_write`` as ``punchline humor score`` — an
engine run and the offline scorer give byte-identical reports.

A unit that failed after its retries leaves no answer line (the scorer counts it as missing, i.e.
wrong) and no judge score (``None``, a *missing* judgement, never 0), so a flaky provider lowers
coverage visibly instead of silently lowering the judge pass rate.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any

import msgspec

from punchline.cluster.config import Count, Name, Names, RunConfig, resolve_path
from punchline.cluster.pipeline import Stage, StageContext, repeated
from punchline.data.errors import ConfigError, InputError
from punchline.data.humor.loaders import Prediction, check_unique_ids, load_humor, load_items
from punchline.data.humor.prompts import ANSWER_MAX_TOKENS
from punchline.data.humor.report import REPORT_JSON, HumorReport
from punchline.data.humor.schema import HumorFile, HumorItem
from punchline.data.provider_settings import Mode
from punchline.data.requests import Message, ProviderRequest
from punchline.data.store import Store
from punchline.data.units import UnitResult, UnitSpec, in_unit_order
from punchline.workers.fake.server import FakeConfig


class JudgeSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    provider: Name
    model: Name
    mode: Mode | None = None


class HumorSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The Humor (MERA) workflow: generate -> score (exact match) -> judge."""

    data: Name
    provider: Name
    models: Names
    shots: Name | None = None
    k_shot: Annotated[int, msgspec.Meta(ge=0, le=100)] = 0
    max_tokens: Count = ANSWER_MAX_TOKENS  # 256, lm-eval's default for generation
    judge: JudgeSettings | None = None
    mode: Mode | None = None  # of the generate stage (the judge stage has its own)


REPORT_PREFIX = "report"


def answers_artifact(nick: str) -> str:
    return f"answers/{nick}.jsonl"


def judge_scores_artifact(nick: str) -> str:
    return f"judge_scores/{nick}.jsonl"


def report_prefix(nick: str) -> str:
    return f"{REPORT_PREFIX}/{nick}"


def report_artifact(nick: str, file: str) -> str:
    return f"{report_prefix(nick)}/{file}"


class JudgeScore(msgspec.Struct):
    """One line of ``judge_scores/<nick>.jsonl`` (the format ``humor score --judge-scores`` reads)."""

    id: int
    score: float | None


def settings_of(cfg: RunConfig) -> HumorSettings:
    """The run's ``[humor]`` table, decoded."""
    assert isinstance(cfg.settings, HumorSettings), "not a humor config"
    return cfg.settings


def _source(ctx: StageContext) -> HumorFile:
    cfg = settings_of(ctx.cfg)
    path = resolve_path(ctx.cfg, cfg.data)
    source = load_humor(path)
    ids = [it.id for it in source.data]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        raise InputError(f"duplicate item ids {dup[:10]}", file=str(path), field="meta.id")
    return source


def _shots(ctx: StageContext) -> list[HumorItem]:
    cfg = settings_of(ctx.cfg)
    if cfg.k_shot <= 0:
        return []
    if not cfg.shots:
        raise ConfigError(f"k_shot = {cfg.k_shot} needs a shots file", file=ctx.cfg.source, field="humor.shots")
    shots = load_items(resolve_path(ctx.cfg, cfg.shots))
    if len(shots) < cfg.k_shot:
        raise ConfigError(
            f"k_shot = {cfg.k_shot} but the shots file has only {len(shots)} items",
            file=ctx.cfg.source,
            field="humor.k_shot",
        )
    return shots


def _shots_for(item: HumorItem, shots: list[HumorItem], k: int) -> list[HumorItem]:
    """The first ``k`` shots in file order, never the item itself (when data and shots overlap)."""
    chosen = [s for s in shots if s != item][:k]
    if len(chosen) < k:
        raise ConfigError(f"not enough shots for item {item.id} once the item itself is excluded", field="humor.shots")
    return chosen


def _unit_id(stage: str, nick: str, item_id: int) -> str:
    return f"{stage}/{nick}/{item_id:06d}"


def _text(result: UnitResult | None) -> str | None:
    if result is None or result.response is None or not result.response.texts:
        return None
    return result.response.texts[0]


def _encode_lines(records: list[msgspec.Struct]) -> bytes:
    enc = msgspec.json.Encoder()
    return b"".join(enc.encode(r) + b"\n" for r in records)


def read_answers(ctx: StageContext, nick: str) -> dict[int, str]:
    """``answers/<nick>.jsonl`` of this run as ``{id: raw answer}``."""
    name = answers_artifact(nick)
    decoder = msgspec.json.Decoder(Prediction)
    out: dict[int, str] = {}
    for line in ctx.read_artifact(name).splitlines():
        if line.strip():
            p = decoder.decode(line)
            out[p.id] = p.text
    return out


def _score(
    ctx: StageContext,
    source: HumorFile,
    nick: str,
    predictions: Mapping[int, str],
    judge_scores: Mapping[int, float | None] | None,
) -> list[str]:
    """Score one model into a temp dir and store every output file as ``report/<nick>/<file>``."""
    from punchline.data.humor.report import score_and_write

    names = []
    with tempfile.TemporaryDirectory(prefix="punchline-humor-") as tmp:
        score_and_write(tmp, source, predictions, judge_scores=judge_scores)
        for f in sorted(Path(tmp).iterdir()):
            name = report_artifact(nick, f.name)
            ctx.write_artifact(name, f.read_bytes())
            names.append(name)
    return names


class GenerateStage:
    """One greedy answer per (model, item), with the configured k-shot prefix."""

    name = "generate"

    def plan(self, ctx: StageContext) -> list[UnitSpec]:
        from punchline.data.humor.prompts import answer_request

        cfg = settings_of(ctx.cfg)
        settings = ctx.cfg.provider(cfg.provider)
        shots = _shots(ctx)
        units = []
        for item in _source(ctx).data:
            prefix = _shots_for(item, shots, cfg.k_shot)
            for nick in cfg.models:
                request = answer_request(cfg.provider, settings.model_id(nick), item, prefix, max_tokens=cfg.max_tokens)
                units.append(UnitSpec(unit_id=_unit_id(self.name, nick, item.id), request=request))
        return in_unit_order(units)

    def reduce(self, ctx: StageContext, results: Mapping[str, UnitResult]) -> list[str]:
        cfg = settings_of(ctx.cfg)
        source = _source(ctx)
        ids = sorted(it.id for it in source.data)
        names = []
        for nick in cfg.models:
            lines: list[msgspec.Struct] = []
            for item_id in ids:
                text = _text(results.get(_unit_id(self.name, nick, item_id)))
                if text is not None:
                    lines.append(Prediction(id=item_id, text=text))
            ctx.write_artifact(answers_artifact(nick), _encode_lines(lines))
            names.append(answers_artifact(nick))
        if cfg.judge is None:
            for nick in cfg.models:
                names += _score(ctx, source, nick, read_answers(ctx, nick), None)
        return names


class JudgeStage:
    """The judge model grades each answer (binary); then every model is scored with its judgements.

    Two models that gave the same answer to an item produce the same judge request, which the
    response cache answers once: identical questions are never paid for twice.
    """

    name = "judge"

    def plan(self, ctx: StageContext) -> list[UnitSpec]:
        from punchline.data.humor.judge import judge_request

        cfg = settings_of(ctx.cfg)
        assert cfg.judge is not None
        judge_id = ctx.cfg.provider(cfg.judge.provider).model_id(cfg.judge.model)
        items = _source(ctx).data
        units = []
        for nick in cfg.models:
            answers = read_answers(ctx, nick)
            for item in items:
                if item.id not in answers:  # no answer (failed unit): nothing to judge, score missing
                    continue
                units.append(
                    UnitSpec(
                        unit_id=_unit_id(self.name, nick, item.id),
                        request=judge_request(cfg.judge.provider, judge_id, item, answers[item.id]),
                        check="judge_score",
                    )
                )
        return in_unit_order(units)

    def reduce(self, ctx: StageContext, results: Mapping[str, UnitResult]) -> list[str]:
        from punchline.data.humor.judge import JudgeParseError, parse_score

        cfg = settings_of(ctx.cfg)
        source = _source(ctx)
        ids = sorted(it.id for it in source.data)
        names = []
        for nick in cfg.models:
            scores: dict[int, float | None] = {}
            for item_id in ids:
                text = _text(results.get(_unit_id(self.name, nick, item_id)))
                score: float | None = None
                if text is not None:
                    try:
                        score = parse_score(text)
                    except JudgeParseError:
                        score = None
                scores[item_id] = score
            lines: list[msgspec.Struct] = [JudgeScore(id=i, score=s) for i, s in scores.items()]
            ctx.write_artifact(judge_scores_artifact(nick), _encode_lines(lines))
            names.append(judge_scores_artifact(nick))
            names += _score(ctx, source, nick, read_answers(ctx, nick), scores)
        return names


def stages(cfg: RunConfig) -> list[Stage]:
    out: list[Stage] = [GenerateStage()]
    if settings_of(cfg).judge is not None:
        out.append(JudgeStage())
    return out


# Upper bound of a judge request for `plan` (the real ones quote answers that do not exist yet): the
# item and an answer in about 6000 characters; the judge answers with a short score.
JUDGE_PROMPT_CHARS = 6000
JUDGE_MAX_TOKENS = 16


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f} %"


def headline(nick: str, model_id: str, report: HumorReport) -> str:
    """One model's scores as a markdown table (the rows ``humor score`` prints)."""
    ci = report.em_ci95
    rows = [
        ("EM (robust)", f"{100 * report.em:.1f} % [{100 * ci.low:.1f}, {100 * ci.high:.1f}]"),
        ("EM (official MERA)", _percent(report.em_mera)),
        ("class accuracy", _percent(report.class_accuracy)),
        ("parse failures", _percent(report.parse_failure_rate)),
        ("missing predictions", str(report.n_missing)),
    ]
    if report.judge is not None:
        rows += [("judge pass rate", _percent(report.judge.pass_rate)), ("judge missing", str(report.judge.n_missing))]
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    return f"**{nick}** ({model_id}), {report.n} items:\n\n| metric | value |\n|---|---|\n{table}"


class HumorPipeline:
    """The Humor (MERA) benchmark: generate -> (judge) -> scored reports per model (``[humor]``)."""

    name = "humor"
    settings_type = HumorSettings

    def check_settings(self, settings: HumorSettings, source: str) -> None:
        """Every constraint is a msgspec.Meta range: nothing across fields to check."""

    def provider_refs(self, settings: HumorSettings) -> list[tuple[str, str]]:
        refs = [("humor.provider", settings.provider)]
        if settings.judge:
            refs.append(("humor.judge.provider", settings.judge.provider))
        return refs

    def stage_mode(self, settings: HumorSettings, stage: str) -> Mode | None:
        """``[humor] mode`` for generate, ``[humor.judge] mode`` for the judge."""
        tables: dict[str, Any] = {"generate": settings, "judge": settings.judge}
        mode: Mode | None = getattr(tables.get(stage), "mode", None)
        return mode

    def input_paths(self, settings: HumorSettings) -> list[str]:
        return [p for p in (settings.data, settings.shots) if p]

    def check_inputs(self, cfg: RunConfig) -> None:
        settings = settings_of(cfg)
        data = resolve_path(cfg, settings.data)
        check_unique_ids(load_items(data), data)
        if settings.shots:
            load_items(resolve_path(cfg, settings.shots))

    def stages(self, cfg: RunConfig) -> list[Stage]:
        return stages(cfg)

    def estimate(self, cfg: RunConfig, stage: str) -> Iterable[UnitSpec]:
        """The judge: at most one call per item and model (a failed answer is never judged)."""
        settings = settings_of(cfg)
        if stage != "judge" or settings.judge is None:
            return []
        items = len(load_items(resolve_path(cfg, settings.data))) * len(settings.models)
        model = cfg.provider(settings.judge.provider).model_id(settings.judge.model)
        req = ProviderRequest(
            provider=settings.judge.provider,
            model=model,
            messages=(Message("user", "x" * JUDGE_PROMPT_CHARS),),
            max_tokens=JUDGE_MAX_TOKENS,
        )
        return repeated(req, items)

    def headlines(self, cfg: RunConfig, store: Store, run_id: str) -> list[str]:
        """Each model's scores, from its ``report/<model>/report.json``."""
        settings = settings_of(cfg)
        out = []
        for nick in settings.models:
            raw = store.get(f"{run_id}/artifacts/{report_artifact(nick, REPORT_JSON)}")
            if raw is not None:
                report = msgspec.json.decode(raw, type=HumorReport)
                out.append(headline(nick, cfg.provider(settings.provider).model_id(nick), report))
        return out

    def simulator_knobs(self, cfg: RunConfig, sim: FakeConfig) -> FakeConfig:
        """The simulator answers the run's own items, right as often as each model's size says."""
        if sim.humor_path is not None:
            return sim
        return msgspec.structs.replace(sim, humor_path=str(resolve_path(cfg, settings_of(cfg).data)))


PIPELINE = HumorPipeline()
