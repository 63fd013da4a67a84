"""msgspec Structs for every Puns artifact that crosses a process or a file.

Field order matches the upstream files so that decode -> encode round-trips to the same bytes.
Numbers that upstream sometimes writes as ``0`` and sometimes as ``0.0`` are typed ``int | float``
so that the distinction survives the round trip.
"""

from __future__ import annotations

from typing import Literal

import msgspec
from msgspec import UNSET, UnsetType

Tier = Literal["balanced", "leaning", "funny_dominated", "straight_dominated"]
TIERS: tuple[Tier, ...] = ("balanced", "leaning", "funny_dominated", "straight_dominated")
WordClass = Literal["straight", "funny", "other"]
PrimingType = Literal["straight", "funny"]
Number = int | float

BLANK = "___"


class PunEntry(msgspec.Struct, forbid_unknown_fields=True):
    """One joke of ``puns_205.json``; the ``cloze_*`` fields exist once the joke has been ranked."""

    index: int
    id: int
    sentence: str
    straight: list[str]
    punny: list[str]
    explanation: str = ""
    gemini_rating: int | UnsetType = UNSET
    anthropic_rating: int | UnsetType = UNSET
    claudecode_rating: int | UnsetType = UNSET
    consensus_score: int | UnsetType = UNSET
    cloze_balance: Number | UnsetType = UNSET
    cloze_p_straight: Number | UnsetType = UNSET
    cloze_p_funny: Number | UnsetType = UNSET
    cloze_p_other: Number | UnsetType = UNSET
    cloze_tier: Tier | UnsetType = UNSET
    cloze_model_funny_rate: dict[str, Number] | UnsetType = UNSET


class ModelCompletions(msgspec.Struct, forbid_unknown_fields=True):
    """One model's first words for one joke: the greedy one and the sampled ones."""

    greedy: str
    samples: list[str]


class Aggregated(msgspec.Struct, forbid_unknown_fields=True):
    """Counts across all models; dict order is most-common first, as upstream's Counter wrote it."""

    word_counts: dict[str, int]
    greedy_counts: dict[str, int]
    total_samples: int


class RawCompletionEntry(msgspec.Struct, forbid_unknown_fields=True):
    """One joke of ``raw_completions.json`` (stage 3 checkpoint)."""

    index: int
    sentence: str
    prompt: str
    existing_straight: list[str]
    existing_punny: list[str]
    models: dict[str, ModelCompletions]
    aggregated: Aggregated


class ClassifiedEntry(msgspec.Struct, forbid_unknown_fields=True):
    """One joke of ``classified_completions.json`` (stage 4 checkpoint)."""

    index: int
    sentence: str
    prompt: str
    existing_straight: list[str]
    existing_punny: list[str]
    models: dict[str, ModelCompletions]
    aggregated: Aggregated
    classifications: dict[str, WordClass]


class ClozeTest(msgspec.Struct, forbid_unknown_fields=True):
    """One entry of ``contextual_cloze_tests_100.json``."""

    pair_id: int
    type: PrimingType
    prompt: str
    expected_completion: list[str]
    contrast_completion: list[str]
    joke_a_index: int
    joke_b_index: int
    joke_c_index: int
    joke_c_sentence: str
    joke_a_tier: str
    joke_b_tier: str
    joke_c_tier: str
    joke_c_balance: Number


class ClozeResponse(msgspec.Struct, forbid_unknown_fields=False):
    """One model answer to one cloze test, in the upstream benchmark shape."""

    pair_id: int
    type: PrimingType
    raw_response: str
    extracted_word: str


class ClozeModelResponses(msgspec.Struct, forbid_unknown_fields=False):
    """All answers of one model, keyed by the test's position in the tests file (as a string)."""

    model_id: str
    responses: dict[str, ClozeResponse]


# --- the cloze report (pipelines/puns/data/cloze_report.py computes it, pipelines/puns/data/plots.py draws it) ---


class ScoredResponse(msgspec.Struct):
    """One answer with the test it answered and its class."""

    position: int
    pair_id: int
    context: PrimingType
    joke_index: int
    word: str
    classification: WordClass


class ContextSummary(msgspec.Struct):
    n: int
    straight: int
    funny: int
    other: int
    p_straight: float
    p_funny: float
    p_other: float


class ModelSummary(msgspec.Struct):
    straight: ContextSummary
    funny: ContextSummary
    delta_funny_pp: float


class ClozeReport(msgspec.Struct):
    models: dict[str, ModelSummary]


RawCompletions = dict[str, RawCompletionEntry]
ClassifiedCompletions = dict[str, ClassifiedEntry]
ClozeResponses = dict[str, ClozeModelResponses]
