"""The built-in ``prompts`` pipeline: any prompt template over any rows, rows x models x n samples -> parse ->
(judge), as ``[prompts]`` says. Its stages, checks and headlines are the engine's generic ones
(:mod:`punchline.cluster.stages.generate`); this object is what registers them under the name ``prompts``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from punchline.cluster.config import RunConfig
from punchline.cluster.pipeline import AnswerParser, Stage, StageContext
from punchline.cluster.result_sections import Cell, ResultSection, ResultsView
from punchline.cluster.stages.compiled import CompiledPrompts
from punchline.cluster.stages.generate import (
    check_inputs,
    judge_upper_bound,
    model_counts,
    stages,
    summary_lines,
)
from punchline.cluster.stages.outputs import OUTPUTS_JSONL, read_jsonl
from punchline.cluster.stages.parse import Parser
from punchline.cluster.stages.settings import PromptsSettings, model_ref
from punchline.data.provider_settings import Mode
from punchline.data.simulator import FakeConfig
from punchline.data.units import UnitSpec


class PromptsPipeline:
    """Rows x models x n samples -> parse -> (judge), as ``[prompts]`` says (see the module's docstring)."""

    name = "prompts"
    settings_type = PromptsSettings

    def check_settings(self, settings: PromptsSettings, source: str) -> None:
        """Compiles every template, regex and JSON schema (one line naming the key on a bad one)."""
        CompiledPrompts(settings, file=source)

    def provider_refs(self, settings: PromptsSettings) -> list[tuple[str, str]]:
        refs = [("prompts.models", model_ref(m, settings.provider)[0]) for m in settings.models]
        if settings.judge is not None:
            refs.append(("prompts.judge.model", model_ref(settings.judge.model, settings.provider)[0]))
        return refs

    def stage_mode(self, settings: PromptsSettings, stage: str) -> Mode | None:
        """``[prompts] mode`` for generate, ``[prompts.judge] mode`` for the judge."""
        if stage == "judge":
            return settings.judge.mode if settings.judge is not None else None
        return settings.mode if stage == "generate" else None

    def input_paths(self, settings: PromptsSettings) -> list[str]:
        return [settings.data]

    def check_inputs(self, cfg: RunConfig) -> None:
        check_inputs(cfg)

    def stages(self, cfg: RunConfig) -> list[Stage]:
        return stages(cfg)

    def estimate(self, cfg: RunConfig, stage: str) -> Iterable[UnitSpec]:
        """The judge before any answer exists (generate's plan is exact: it needs no earlier artifact)."""
        return judge_upper_bound(cfg) if stage == "judge" else []

    def headlines(self, ctx: StageContext) -> list[str]:
        return summary_lines(ctx.cfg, ctx.store, ctx.run_id)

    def simulator_knobs(self, cfg: RunConfig, sim: FakeConfig) -> FakeConfig:
        """The simulator needs nothing of the run: it answers an ``Options:`` prompt from the prompt itself."""
        return sim

    def results(self, view: ResultsView) -> list[ResultSection]:
        """For the viewer: per model, samples answered, the share parsed and the judge's verdicts (the headlines'
        counts, :func:`~punchline.cluster.stages.generate.model_counts`, as a table)."""
        return per_model(view)

    def answer_parsers(self, settings: PromptsSettings) -> dict[str, AnswerParser]:
        """``[prompts] parse`` for generate's answers, ``[prompts.judge] parse`` for the judge's (for the viewer)."""
        out: dict[str, AnswerParser] = {}
        if settings.parse is not None:
            out["generate"] = _fields(Parser(settings.parse, field="prompts.parse"))
        if settings.judge is not None and settings.judge.parse is not None:
            out["judge"] = _fields(Parser(settings.judge.parse, field="prompts.judge.parse"))
        return out


def per_model(view: ResultsView) -> list[ResultSection]:
    """The table of :meth:`PromptsPipeline.results`, from ``outputs.jsonl``: its first 20 MB at most (what
    :meth:`ResultsView.read_head` reads); rows are row-major, so a head of a larger file counts every model alike,
    and the note says it is a head."""
    if OUTPUTS_JSONL not in view.artifacts:
        return []
    settings = view.settings
    if not isinstance(settings, PromptsSettings):
        return [ResultSection(title="Per model", note="the run's [prompts] table is not readable by this version")]
    data, more = view.read_head(OUTPUTS_JSONL)
    if data is None:
        return []
    if more:
        data = data[: data.rfind(b"\n") + 1]  # whole lines only
    counts = model_counts(settings, read_jsonl(data))
    verdicts = sorted({v for c in counts for v in c.verdicts})
    rows: list[dict[str, Cell]] = []
    for c in counts:
        row: dict[str, Cell] = {"model": c.model, "samples": c.samples, "answered": c.answered}
        if settings.parse is not None:
            row["parsed"] = f"{c.parsed / c.answered:.0%}" if c.answered else ""
        rows.append(row | {f"judge: {v}": c.verdicts.get(v, 0) for v in verdicts})
    head = f"counted over the first {sum(c.samples for c in counts)} rows of {OUTPUTS_JSONL} (it is larger)"
    note = head if more else ""
    return [ResultSection(title="Per model", anchor="prompts-results", rows=rows, note=note)]


def _fields(parser: Parser) -> AnswerParser:
    def parse(text: str) -> tuple[dict[str, Any] | None, str | None]:
        parsed = parser.parse(text)
        return parsed.fields, parsed.error

    return parse


PIPELINE = PromptsPipeline()
