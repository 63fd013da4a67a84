"""The Humor (MERA) benchmark as engine stages: generate -> (judge) -> score.

``generate`` asks each model once per item (greedy, as MERA does; ``[humor] preset = "mera"`` makes the
request lm-eval makes: shots as user/assistant turns, stop ``"\\n\\n"``, and the answer is cut at the stop
whatever the provider did with it); ``judge`` asks the judge model to grade each answer twice over: our binary
prompt once, and MERA's judge prompt once per MERA reading of the answer (``judge_mera``: the best of them, 0
for a failed call). The reduce also packs MERA's submission (``submission/<nick>.zip``: ``Humor.json`` with
the model's own text + ``logs_public.zip``) when every item has an answer. Scoring is no stage of its own: it
needs no provider call, so it runs in the reduce of the last stage, through the same ``score_and_write`` as
``punchline humor score`` — an engine run and the offline scorer give byte-identical reports.

A unit that failed after its retries leaves no answer line (the scorer counts it as missing, i.e. wrong) and
no judge score (``None``, a *missing* judgement, never 0), so a flaky provider lowers coverage visibly instead
of silently lowering the judge pass rate.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec

from punchline.cluster.config import Count, Name, Names, RunConfig, check_run_id, load_config, resolve_path
from punchline.cluster.driver import RunRecord
from punchline.cluster.pipeline import Stage, StageContext, repeated
from punchline.cluster.pipelines.humor.simulate import HumorSimKnobs, simulate
from punchline.data.errors import ConfigError, InputError
from punchline.data.humor.judge import (
    MERA_JUDGE_MAX_TOKENS,
    JudgeParseError,
    judge_request,
    mera_judge_request,
    mera_judge_score,
    parse_score,
)
from punchline.data.humor.loaders import Prediction, check_unique_ids, load_humor, load_items
from punchline.data.humor.mera import mera_readings
from punchline.data.humor.prompts import ANSWER_MAX_TOKENS, MERA_STOP, answer_request, cut_at_stop, mera_answer_request
from punchline.data.humor.report import REPORT_JSON, HumorReport, headlines, score_and_write
from punchline.data.humor.schema import HumorFile, HumorItem
from punchline.data.humor.shots import (
    FEWSHOT_SEED,
    MERA_FEWSHOT_SPLIT,
    MERA_SAMPLER,
    FewshotSplit,
    Sampler,
    draws_per_item,
    first_k_shots,
    lm_eval_shots,
)
from punchline.data.humor.submission import (
    LOGS_NAME,
    SUBMISSION_FILE,
    answers_by_id,
    submission_files,
    submission_zip,
    write_submission,
)
from punchline.data.jsonio import check_out_dir
from punchline.data.provider_settings import Mode
from punchline.data.requests import Message, ProviderRequest
from punchline.data.run_layout import RunLayout
from punchline.data.settings import runs_dir as resolve_runs_dir
from punchline.data.simulator import FakeConfig, SimRequest
from punchline.data.store import Store
from punchline.data.stores import open_store
from punchline.data.units import UnitResult, UnitSpec, in_unit_order

if TYPE_CHECKING:
    from punchline.cluster.driver import RunRecord


class JudgeSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[humor.judge]``: an LLM judge grades every answer."""

    provider: Annotated[Name, msgspec.Meta(description="the judge's provider")]
    model: Annotated[Name, msgspec.Meta(description="the judge's model nickname")]
    mode: Annotated[
        Mode | None,
        msgspec.Meta(
            description="the judge stage's units online or through the batch API (default: the provider's mode)"
        ),
    ] = None


class HumorSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The Humor (MERA) workflow: generate -> score (exact match) -> judge."""

    data: Annotated[Name, msgspec.Meta(description="the Humor items (MERA layout, JSON), relative to the config")]
    provider: Annotated[Name, msgspec.Meta(description="the provider of the models")]
    models: Annotated[Names, msgspec.Meta(description="model nicknames of that provider")]
    shots: Annotated[Name | None, msgspec.Meta(description="a file of solved items for k-shot prompts")] = None
    k_shot: Annotated[int, msgspec.Meta(ge=0, le=100, description="solved items shown before each question")] = 0
    max_tokens: Annotated[Count, msgspec.Meta(description="answer length cap (lm-eval's default for generation)")] = (
        ANSWER_MAX_TOKENS
    )
    judge: Annotated[JudgeSettings | None, msgspec.Meta(description="the judge stage (none: exact match only)")] = None
    mode: Annotated[
        Mode | None,
        msgspec.Meta(
            description="the generate stage's units online or through the batch API (default: the provider's mode)"
        ),
    ] = None
    # "mera": lm-eval's generation (shots as user/assistant turns, stop "\n\n"); "punchline": our layout
    preset: Annotated[
        Literal["punchline", "mera"],
        msgspec.Meta(description="mera: generate as lm-eval does for MERA; punchline: our layout"),
    ] = "punchline"
    # the mera preset's few-shot choice (humor.yaml + lm-eval's defaults; data/humor/shots.py)
    sampler: Annotated[
        Sampler,
        msgspec.Meta(description="mera preset: lm-eval's few-shot sampler (default: a seeded draw per item)"),
    ] = MERA_SAMPLER
    fewshot_seed: Annotated[int, msgspec.Meta(ge=0, description="mera preset: lm-eval's fewshot_random_seed")] = (
        FEWSHOT_SEED
    )
    fewshot_split: Annotated[
        FewshotSplit,
        msgspec.Meta(description="mera preset: draw shots from the data itself (test, as humor.yaml) or `shots`"),
    ] = MERA_FEWSHOT_SPLIT


REPORT_PREFIX = "report"


def answers_artifact(nick: str) -> str:
    return f"answers/{nick}.jsonl"


def judge_scores_artifact(nick: str) -> str:
    return f"judge_scores/{nick}.jsonl"


def judge_mera_scores_artifact(nick: str) -> str:
    return f"judge_mera_scores/{nick}.jsonl"


def submission_artifact(nick: str) -> str:
    return f"submission/{nick}.zip"


def report_prefix(nick: str) -> str:
    return f"{REPORT_PREFIX}/{nick}"


def report_artifact(nick: str, file: str) -> str:
    return f"{report_prefix(nick)}/{file}"


class JudgeScore(msgspec.Struct):
    """One line of ``judge_scores/<nick>.jsonl`` (the format ``humor score --judge-scores`` reads)."""

    id: int
    score: float | None


class MeraJudgeScore(msgspec.Struct, omit_defaults=True):
    """One line of ``judge_mera_scores/<nick>.jsonl``: MERA's judge score of an item, in [0, 1], and how many
    of its judge calls failed (each scored 0; written only when some did)."""

    id: int
    score: float
    failed_calls: int = 0


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
    return dict(_answer_lines(ctx.read_artifact(name), name))


def _score(
    ctx: StageContext,
    source: HumorFile,
    nick: str,
    predictions: Mapping[int, str],
    judge_scores: Mapping[int, float | None] | None,
    judge_mera_scores: Mapping[int, float] | None = None,
    judge_mera_failed_calls: int | None = None,
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
                        check="punchline.data.humor.judge:check_score",
                    )
                )
                units += _mera_judge_units(
                    cfg.judge.provider, judge_id, nick, item, answers[item.id], retries=cfg.preset != "mera"
                )
        return in_unit_order(units)

    def reduce(self, ctx: StageContext, results: Mapping[str, UnitResult]) -> list[str]:
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
            answers = read_answers(ctx, nick)
            mera_lines = _mera_judge_lines(results, nick, answers, ids)
            ctx.write_artifact(judge_mera_scores_artifact(nick), _encode_lines(list(mera_lines)))
            names.append(judge_mera_scores_artifact(nick))
            mera = {line.id: line.score for line in mera_lines}
            failed = sum(line.failed_calls for line in mera_lines)
            names += _score(ctx, source, nick, answers, scores, mera, failed)
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
    """One model's scores as a markdown table: EM under MERA's reading and ours, both judges (with their
    intervals; a judge not configured is left out), then the rows ``humor score`` prints after them."""
    rows = [(line.label, line.shown()) for line in headlines(report) if line.value is not None]
    rows += [
        ("class accuracy", _percent(report.class_accuracy)),
        ("parse failures", _percent(report.parse_failure_rate)),
        ("ambiguous (never credited)", _percent(report.ambiguous_rate)),
        ("missing predictions", str(report.n_missing)),
    ]
    if report.judge is not None:
        rows += [("judge (ours) missing", str(report.judge.n_missing))]
    if report.judge_mera_failed_calls is not None:
        rows += [("judge (MERA's) failed calls, scored 0", str(report.judge_mera_failed_calls))]
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    return f"**{nick}** ({model_id}), {report.n} items:\n\n| metric | value |\n|---|---|\n{table}"


class HumorPipeline:
    """The Humor (MERA) benchmark: generate -> (judge) -> scored reports per model (``[humor]``)."""

    name = "humor"
    settings_type = HumorSettings
    simulate_knobs = HumorSimKnobs  # [simulator.pipeline_knobs.humor]

    def check_settings(self, settings: HumorSettings, source: str) -> None:
        """A ``shots`` file the ``mera`` preset would not read (it draws from the data, as humor.yaml says) is an
        error rather than silently ignored."""
        if settings.preset == "mera" and settings.fewshot_split == "test" and settings.shots and settings.k_shot:
            raise ConfigError(
                'is not read under preset = "mera": its shots are drawn from the data itself (fewshot_split = '
                '"test", as MERA\'s humor.yaml); set fewshot_split = "shots" to draw them from this file',
                file=source,
                field="humor.shots",
            )

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
        """The items and the shots as the stages read them, and ``k_shot`` against the shots."""
        settings = settings_of(cfg)
        data = resolve_path(cfg, settings.data)
        items = load_items(data)
        if not items:
            raise InputError("has no items: the run would have nothing to ask", file=str(data), field="data")
        check_unique_ids(items, data)
        if settings.shots:
            load_items(resolve_path(cfg, settings.shots))
        run_shots(cfg)

    def stages(self, cfg: RunConfig) -> list[Stage]:
        return stages(cfg)

    def estimate(self, cfg: RunConfig, stage: str) -> Iterable[UnitSpec]:
        """The judge: at most one call of ours and one MERA judge call per MERA reading (at most
        :data:`MAX_MERA_READINGS`) per item and model (a failed answer is never judged)."""
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
        mera = msgspec.structs.replace(req, max_tokens=MERA_JUDGE_MAX_TOKENS)
        return [*repeated(req, items), *repeated(mera, items * MAX_MERA_READINGS)]

    def headlines(self, cfg: RunConfig, store: Store, run_id: str) -> list[str]:
        """Each model's scores, from its ``report/<model>/report.json``."""
        settings = settings_of(cfg)
        out = []
        for nick in settings.models:
            raw = store.get(RunLayout(run_id).artifact(report_artifact(nick, REPORT_JSON)))
            if raw is not None:
                report = msgspec.json.decode(raw, type=HumorReport)
                out.append(headline(nick, cfg.provider(settings.provider).model_id(nick), report))
        return out

    def simulate(self, request: SimRequest) -> str | None:
        """Its prompts' simulated answers (:mod:`.simulate`)."""
        return simulate(request)

    def simulator_knobs(self, cfg: RunConfig, sim: FakeConfig) -> FakeConfig:
        """The simulator answers the run's own items, right as often as each model's size says."""
        own = sim.pipeline_knobs.get(self.name, {})
        if own.get("answer_key") is not None:
            return sim
        answer_key = str(resolve_path(cfg, settings_of(cfg).data))
        return msgspec.structs.replace(
            sim, pipeline_knobs={**sim.pipeline_knobs, self.name: {**own, "answer_key": answer_key}}
        )


PIPELINE = HumorPipeline()


# --- the submission of a finished run (`punchline humor submission RUN`) and its end-of-run numbers -------------


def _run_record(run_id: str, runs_dir: str | None) -> tuple[RunRecord, RunConfig]:
    """A Humor run's record and its config (as recorded when the run started; relative paths resolve
    against the config's original folder)."""
    check_run_id(run_id, field="RUN")
    path = RunLayout(run_id).local(resolve_runs_dir(runs_dir)).record
    try:
        record = msgspec.json.decode(path.read_bytes(), type=RunRecord)
    except OSError:
        raise InputError("no such run (no run.json)", file=str(path), field="RUN") from None
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise InputError(f"unreadable run record: {exc}", file=str(path)) from None
    if record.pipeline != "humor":
        raise InputError(f"run {run_id} is a {record.pipeline!r} run, not humor", file=str(path), field="pipeline")
    with tempfile.TemporaryDirectory(prefix="punchline-humor-") as tmp:
        recorded = Path(tmp) / Path(record.config_path).name
        recorded.write_text(record.config_toml, encoding="utf-8")
        cfg = load_config(recorded)
    cfg.source = record.config_path
    return record, cfg


def _answer_lines(raw: bytes, source: str) -> list[tuple[int, str]]:
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


def submission_of_run(run_id: str, *, runs_dir: str | None, out_dir: str, models: list[str] | None) -> list[str]:
    """Write ``<out_dir>/<nick>/{Humor.json,logs_public.zip}`` and ``<out_dir>/<nick>.zip`` for each model of a
    finished Humor run. Everything is checked (every model's answers: one per item) before anything is written."""
    record, cfg = _run_record(run_id, runs_dir)
    settings = settings_of(cfg)
    chosen = models or list(settings.models)
    unknown = [m for m in chosen if m not in settings.models]
    if unknown:
        raise InputError(f"not a model of run {run_id}: {', '.join(unknown)}", field="--model")
    out = check_out_dir(out_dir)
    items = load_humor(resolve_path(cfg, settings.data)).data
    store = open_store(record.services.store_url)
    packs = {}
    for nick in chosen:
        key = RunLayout(run_id).artifact(answers_artifact(nick))
        source = f"{record.services.store_url}/{key}"
        raw = store.get(key)
        if raw is None:
            raise InputError("missing: the run has no answers for this model yet", file=source)
        answers = answers_by_id(items, _answer_lines(raw, source), source=source)
        packs[nick] = submission_files(items, answers)
    written = []
    for nick, files in packs.items():
        written += write_submission(out / nick, files)
    return written
