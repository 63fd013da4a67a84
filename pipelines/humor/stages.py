"""The Humor pipeline's engine stages: ``generate`` (one answer per item and model) and ``judge`` (ours and
MERA's judge), with the scoring in the last stage's reduce (see :mod:`.pipeline` for the whole flow).

Why a module of its own: this is what runs on the engine (plan units, reduce results into artifacts); the
pipeline's face in :mod:`.pipeline` only says which stages there are and how they are estimated and shown.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path

import msgspec

from punchline.cluster.config import RunConfig, resolve_path
from punchline.cluster.pipeline import Stage, StageContext
from punchline.data.errors import ConfigError, InputError
from punchline.data.units import UnitResult, UnitSpec, in_unit_order
from punchline.pipelines.humor.data.judge import (
    JudgeParseError,
    judge_request,
    mera_judge_request,
    mera_judge_score,
    parse_score,
)
from punchline.pipelines.humor.data.loaders import Prediction, load_humor, load_items
from punchline.pipelines.humor.data.mera import mera_readings
from punchline.pipelines.humor.data.prompts import MERA_STOP, answer_request, cut_at_stop, mera_answer_request
from punchline.pipelines.humor.data.report import JudgeRetry, judge_retries, retries_of_report, score_and_write
from punchline.pipelines.humor.data.schema import HumorFile, HumorItem
from punchline.pipelines.humor.data.shots import draws_per_item, first_k_shots, lm_eval_shots
from punchline.pipelines.humor.data.submission import LOGS_NAME, SUBMISSION_FILE, submission_zip
from punchline.pipelines.humor.settings import (
    JudgeScore,
    MeraJudgeScore,
    answers_artifact,
    judge_mera_scores_artifact,
    judge_scores_artifact,
    report_artifact,
    settings_of,
    submission_artifact,
)


def _source(ctx: StageContext) -> HumorFile:
    cfg = settings_of(ctx.cfg)
    path = resolve_path(ctx.cfg, cfg.data)
    source = load_humor(path)
    ids = [it.id for it in source.data]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        raise InputError(f"duplicate item ids {dup[:10]}", file=str(path), field="meta.id")
    return source


def run_shots(run: RunConfig) -> list[HumorItem]:
    """The few-shot pool: the ``shots`` file (none when ``k_shot`` is 0); under the ``mera`` preset with
    ``fewshot_split = "test"`` (humor.yaml's), the data itself."""
    cfg = settings_of(run)
    if cfg.k_shot <= 0:
        return []
    if cfg.preset == "mera" and cfg.fewshot_split == "test":
        pool = load_items(resolve_path(run, cfg.data))
        if draws_per_item(cfg.k_shot, same_split=True) > len(pool):
            raise ConfigError(
                f"k_shot = {cfg.k_shot} draws {cfg.k_shot + 1} items per question from the data "
                f'(fewshot_split = "test"), which has only {len(pool)}',
                file=run.source,
                field="humor.k_shot",
            )
        return pool
    if not cfg.shots:
        raise ConfigError(f"k_shot = {cfg.k_shot} needs a shots file", file=run.source, field="humor.shots")
    shots = load_items(resolve_path(run, cfg.shots))
    if len(shots) < cfg.k_shot:
        raise ConfigError(
            f"k_shot = {cfg.k_shot} but the shots file has only {len(shots)} items",
            file=run.source,
            field="humor.k_shot",
        )
    return shots


def item_shots(run: RunConfig, items: list[HumorItem]) -> list[list[HumorItem]]:
    """Each item's shots: under ``mera``, as lm-eval draws them (``sampler``, ``fewshot_seed``,
    ``fewshot_split``; in item order); under ``punchline``, the first ``k_shot`` of the shots file."""
    cfg = settings_of(run)
    pool = run_shots(run)
    if cfg.preset == "mera":
        same = cfg.fewshot_split == "test"
        return lm_eval_shots(items, pool, cfg.k_shot, sampler=cfg.sampler, seed=cfg.fewshot_seed, same_split=same)
    return [first_k_shots(item, pool, cfg.k_shot) for item in items]


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
    return dict(answer_lines(ctx.read_artifact(name), name))


def answer_lines(raw: bytes, source: str) -> list[tuple[int, str]]:
    """Every ``(id, text)`` line of an answers artifact, repeats kept (the submission rejects them)."""
    decoder = msgspec.json.Decoder(Prediction)
    out = []
    for lineno, line in enumerate(raw.splitlines(), start=1):
        if line.strip():
            try:
                p = decoder.decode(line)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                raise InputError(str(exc), file=source, record=f"line {lineno}") from None
            out.append((p.id, p.text))
    return out


def _score(
    ctx: StageContext,
    source: HumorFile,
    nick: str,
    predictions: Mapping[int, str],
    judge_scores: Mapping[int, float | None] | None,
    judge_mera_scores: Mapping[int, float] | None = None,
    judge_mera_failed_calls: int | None = None,
    judge_mera_retried: list[JudgeRetry] | None = None,
) -> list[str]:
    """Score one model into a temp dir and store every output file as ``report/<nick>/<file>``, and MERA's
    submission archive as ``submission/<nick>.zip`` when every item has an answer."""
    names = []
    with tempfile.TemporaryDirectory(prefix="punchline-humor-") as tmp:
        _, paths = score_and_write(
            tmp,
            source,
            predictions,
            judge_scores=judge_scores,
            judge_mera_scores=judge_mera_scores,
            judge_mera_failed_calls=judge_mera_failed_calls,
            judge_mera_retried=judge_mera_retried,
            model=nick,
        )
        files = {f.name: f.read_bytes() for f in sorted(Path(tmp).iterdir())}
        for file_name, data in files.items():
            name = report_artifact(nick, file_name)
            ctx.write_artifact(name, data)
            names.append(name)
    if paths.submission is not None:
        packed = {n: files[n] for n in (SUBMISSION_FILE, f"{LOGS_NAME}.zip")}
        ctx.write_artifact(submission_artifact(nick), submission_zip(packed))
        names.append(submission_artifact(nick))
    return names


def _as_generated(preset: str, text: str) -> str:
    """The answer as the preset's generator leaves it: ``mera`` cuts at lm-eval's stop sequence."""
    return cut_at_stop(text, MERA_STOP) if preset == "mera" else text


class GenerateStage:
    """One greedy answer per (model, item), with the configured k-shot prefix."""

    name = "generate"

    def plan(self, ctx: StageContext) -> list[UnitSpec]:
        cfg = settings_of(ctx.cfg)
        settings = ctx.cfg.provider(cfg.provider)
        items = _source(ctx).data
        units = []
        build = mera_answer_request if cfg.preset == "mera" else answer_request
        for item, prefix in zip(items, item_shots(ctx.cfg, items), strict=True):
            for nick in cfg.models:
                request = build(cfg.provider, settings.model_id(nick), item, prefix, max_tokens=cfg.max_tokens)
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
                    lines.append(Prediction(id=item_id, text=_as_generated(cfg.preset, text)))
            ctx.write_artifact(answers_artifact(nick), _encode_lines(lines))
            names.append(answers_artifact(nick))
        if cfg.judge is None:
            for nick in cfg.models:
                names += _score(ctx, source, nick, read_answers(ctx, nick), None)
        return names


MERA_JUDGE = "judge_mera"  # unit ids: judge_mera/<nick>/<item>/<reading>
MAX_MERA_READINGS = 3  # the whole answer, the tail after "Ответ:", the rebuilt pair


def _mera_judge_units(
    provider: str, judge_id: str, nick: str, item: HumorItem, answer: str, *, retries: bool
) -> list[UnitSpec]:
    """One MERA judge call per MERA reading of the answer (no content check: MERA scores an unreadable
    reply 0 rather than asking again; ``retries = False`` under the ``mera`` preset: MERA's judge posts once
    and scores a failed call 0)."""
    return [
        UnitSpec(
            unit_id=f"{_unit_id(MERA_JUDGE, nick, item.id)}/{k}",
            request=mera_judge_request(provider, judge_id, item, reading),
            retries=retries,
        )
        for k, reading in enumerate(mera_readings(answer))
    ]


def _mera_judge_lines(
    results: Mapping[str, UnitResult], nick: str, answers: Mapping[int, str], ids: list[int]
) -> list[MeraJudgeScore]:
    """``judge_mera`` per item: the best over its readings' replies; 0 for a failed call or no answer. A call
    planned for a reading that brought no reply back (failed, or never run) is counted as failed."""
    out = []
    for item_id in ids:
        unit = _unit_id(MERA_JUDGE, nick, item_id)
        planned = len(mera_readings(answers[item_id])) if item_id in answers else 0
        texts = [_text(results.get(f"{unit}/{k}")) for k in range(planned)]
        score = max((mera_judge_score(t) for t in texts), default=0.0)
        out.append(MeraJudgeScore(id=item_id, score=score, failed_calls=sum(t is None for t in texts)))
    return out


def _mera_retries(
    ctx: StageContext, results: Mapping[str, UnitResult], nick: str, lines: list[MeraJudgeScore], judge_id: str
) -> list[JudgeRetry]:
    """The MERA judge calls of ``nick`` asked more than once: against this run's previous reduce of the stage (its
    ``judge_mera_scores`` and the retries its report kept; read before they are written again), and the attempts
    retried within the run (each unit's ``retries``)."""
    try:
        raw = ctx.read_artifact(judge_mera_scores_artifact(nick))
    except FileNotFoundError:  # the stage's first reduce in this run
        before, earlier = None, []
    else:
        decoder = msgspec.json.Decoder(MeraJudgeScore)
        kept = [decoder.decode(line) for line in raw.splitlines() if line.strip()]
        before = {x.id: (x.score, x.failed_calls) for x in kept}
        try:
            earlier = retries_of_report(ctx.read_artifact(report_artifact(nick, "report.json")))
        except FileNotFoundError:
            earlier = []
    within: dict[int, int] = {}
    prefix = f"{MERA_JUDGE}/{nick}/"
    for unit_id, result in results.items():
        # ``retries`` counts failed attempts: a failed unit's last one was not followed by another
        again = result.retries - (result.error is not None)
        if unit_id.startswith(prefix) and again > 0:
            item = int(unit_id[len(prefix) :].split("/")[0])
            within[item] = within.get(item, 0) + again
    after = {x.id: (x.score, x.failed_calls) for x in lines}
    return judge_retries(before, after, within, model=nick, judge=judge_id, earlier=earlier)


class JudgeStage:
    """The judge model grades each answer (binary); then every model is scored with its judgements.

    Two models that gave the same answer to an item produce the same judge request, which the
    response cache answers once: identical questions are never paid for twice.
    """

    name = "judge"

    def plan(self, ctx: StageContext) -> list[UnitSpec]:
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
                        check="punchline.pipelines.humor.data.judge:check_score",
                    )
                )
                units += _mera_judge_units(
                    cfg.judge.provider, judge_id, nick, item, answers[item.id], retries=cfg.preset != "mera"
                )
        return in_unit_order(units)

    def reduce(self, ctx: StageContext, results: Mapping[str, UnitResult]) -> list[str]:
        cfg = settings_of(ctx.cfg)
        assert cfg.judge is not None
        judge_id = ctx.cfg.provider(cfg.judge.provider).model_id(cfg.judge.model)
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
            answers = read_answers(ctx, nick)
            mera_lines = _mera_judge_lines(results, nick, answers, ids)
            retried = _mera_retries(ctx, results, nick, mera_lines, judge_id)
            ctx.write_artifact(judge_mera_scores_artifact(nick), _encode_lines(list(mera_lines)))
            names.append(judge_mera_scores_artifact(nick))
            mera = {line.id: line.score for line in mera_lines}
            failed = sum(line.failed_calls for line in mera_lines)
            names += _score(ctx, source, nick, answers, scores, mera, failed, retried)
        return names


def stages(cfg: RunConfig) -> list[Stage]:
    out: list[Stage] = [GenerateStage()]
    if settings_of(cfg).judge is not None:
        out.append(JudgeStage())
    return out
