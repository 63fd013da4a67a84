"""The Humor pipeline's ``[humor]`` settings, the names of its store artifacts and its judge score records.

Why a module of its own: the stages (:mod:`.stages`), the pipeline's face (:mod:`.pipeline`) and the submission
of a finished run (:mod:`.run_submission`) all read these; one place spells each artifact name.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from punchline.cluster.config import Count, Name, Names, RunConfig
from punchline.data.provider_settings import Mode
from punchline.pipelines.humor.data.prompts import ANSWER_MAX_TOKENS
from punchline.pipelines.humor.data.shots import FEWSHOT_SEED, MERA_FEWSHOT_SPLIT, MERA_SAMPLER, FewshotSplit, Sampler


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
    # the mera preset's few-shot choice (humor.yaml + lm-eval's defaults; pipelines/humor/data/shots.py)
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
