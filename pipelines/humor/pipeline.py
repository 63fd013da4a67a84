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
of silently lowering the judge pass ra

The pieces: :mod:`.settings` (the ``[humor]`` table, artifact names), :mod:`.stages` (generate, judge, the
scoring reduce), :mod:`.run_submission` (the submission of a finished run); this module is the pipeline's face
to the engine and re-exports the names other code imports from it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from punchline.cluster.config import RunConfig, resolve_path
from punchline.cluster.pipeline import Stage, StageContext, repeated
from punchline.cluster.result_sections import ResultSection, ResultsView
from punchline.data.errors import ConfigError, InputError
from punchline.data.provider_settings import Mode
from punchline.data.requests import Message, ProviderRequest
from punchline.data.simulator import FakeConfig, SimRequest
from punchline.data.storage.run_layout import RunLayout
from punchline.data.units import UnitSpec
from punchline.pipelines.humor.data.judge import MERA_JUDGE_MAX_TOKENS
from punchline.pipelines.humor.data.loaders import check_unique_ids, load_items
from punchline.pipelines.humor.data.report import REPORT_JSON, HumorReport, headlines
from punchline.pipelines.humor.results import artifact_results, results
from punchline.pipelines.humor.run_submission import submission_of_run
from punchline.pipelines.humor.settings import (
    REPORT_PREFIX,
    HumorSettings,
    JudgeScore,
    JudgeSettings,
    MeraJudgeScore,
    answers_artifact,
    judge_mera_scores_artifact,
    judge_scores_artifact,
    report_artifact,
    report_prefix,
    settings_of,
    submission_artifact,
)
from punchline.pipelines.humor.simulate import HumorSimKnobs, simulate
from punchline.pipelines.humor.stages import (
    MAX_MERA_READINGS,
    MERA_JUDGE,
    GenerateStage,
    JudgeStage,
    item_shots,
    read_answers,
    run_shots,
    stages,
)

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

    def headlines(self, ctx: StageContext) -> list[str]:
        """Each model's scores, from its ``report/<model>/report.json``."""
        cfg = ctx.cfg
        settings = settings_of(cfg)
        out = []
        for nick in settings.models:
            raw = ctx.store.get(RunLayout(ctx.run_id).artifact(report_artifact(nick, REPORT_JSON)))
            if raw is not None:
                report = msgspec.json.decode(raw, type=HumorReport)
                out.append(headline(nick, cfg.provider(settings.provider).model_id(nick), report))
        return out

    def results(self, view: ResultsView) -> list[ResultSection]:
        """For the viewer: each model's scores with CIs and its judges' disagreements (:mod:`.results`)."""
        return results(view)

    def artifact_results(self, view: ResultsView, artifact: str) -> list[ResultSection]:
        """For the viewer, above a model's report: its CIs and the items its judges disagree on."""
        return artifact_results(view, artifact)

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


__all__ = [
    "JUDGE_MAX_TOKENS",
    "JUDGE_PROMPT_CHARS",
    "MAX_MERA_READINGS",
    "MERA_JUDGE",
    "PIPELINE",
    "REPORT_PREFIX",
    "GenerateStage",
    "HumorPipeline",
    "HumorSettings",
    "JudgeScore",
    "JudgeSettings",
    "JudgeStage",
    "MeraJudgeScore",
    "answers_artifact",
    "headline",
    "item_shots",
    "judge_mera_scores_artifact",
    "judge_scores_artifact",
    "read_answers",
    "report_artifact",
    "report_prefix",
    "run_shots",
    "settings_of",
    "stages",
    "submission_artifact",
    "submission_of_run",
]
