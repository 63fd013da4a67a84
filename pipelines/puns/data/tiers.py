"""Stage 5: how discriminative each joke is, from the classified model samples.

A joke is useful as a cloze *target* when models default to the straight word (so context must
unlock the pun) and as *context* when models already split between straight and pun. The numbers
are rounded to 4 decimals exactly as upstream rounded them, so ``puns_205.json`` is reproduced byte
for byte.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from punchline.data.errors import InputError
from punchline.pipelines.puns.data.schemas import ClassifiedEntry, Number, PunEntry, Tier

BALANCED_MIN_BALANCE = 0.3
LEANING_MIN_BALANCE = 0.05
MIN_P_FUNNY = 0.05
FUNNY_DOMINATED_MIN_P_FUNNY = 0.5
ROUND_DIGITS = 4


class Ranking(msgspec.Struct, forbid_unknown_fields=True):
    """One joke's stage 5 numbers; they become the ``cloze_*`` fields of a :class:`PunEntry`."""

    balance: Number
    p_straight: Number
    p_funny: Number
    p_other: Number
    tier: Tier
    model_funny_rate: dict[str, Number]


def assign_tier(balance: float, p_funny: float) -> Tier:
    """The four tiers, tested in upstream's order (the first match wins)."""
    if balance >= BALANCED_MIN_BALANCE and p_funny >= MIN_P_FUNNY:
        return "balanced"
    if balance > LEANING_MIN_BALANCE and p_funny >= MIN_P_FUNNY:
        return "leaning"
    if p_funny > FUNNY_DOMINATED_MIN_P_FUNNY and balance <= LEANING_MIN_BALANCE:
        return "funny_dominated"
    return "straight_dominated"


def rank_entry(entry: ClassifiedEntry) -> Ranking:
    """Tally the joke's sample counts by class; a word without a class counts as "other"."""
    classes = entry.classifications
    counts = {"straight": 0, "funny": 0, "other": 0}
    for word, count in entry.aggregated.word_counts.items():
        counts[classes.get(word, "other")] += count
    total = entry.aggregated.total_samples
    # Upstream wrote an int 0 when there were no samples; keep that so the bytes round-trip.
    p_straight: Number = counts["straight"] / total if total else 0
    p_funny: Number = counts["funny"] / total if total else 0
    p_other: Number = counts["other"] / total if total else 0
    if counts["straight"] > 0 and counts["funny"] > 0:
        balance = min(p_straight, p_funny) / max(p_straight, p_funny)
    else:
        balance = 0.0
    model_rate: dict[str, Number] = {}
    for nick, completions in entry.models.items():
        samples = completions.samples
        funny = sum(1 for s in samples if classes.get(s, "other") == "funny")
        model_rate[nick] = round(funny / len(samples), ROUND_DIGITS) if samples else 0
    return Ranking(
        balance=round(balance, ROUND_DIGITS),
        p_straight=round(p_straight, ROUND_DIGITS),
        p_funny=round(p_funny, ROUND_DIGITS),
        p_other=round(p_other, ROUND_DIGITS),
        tier=assign_tier(balance, p_funny),
        model_funny_rate=model_rate,
    )


def rank(classified: Mapping[str, ClassifiedEntry] | Iterable[ClassifiedEntry]) -> dict[int, Ranking]:
    """Rank every joke of a stage 4 checkpoint, keyed by joke index (in checkpoint order)."""
    entries = classified.values() if isinstance(classified, Mapping) else classified
    return {entry.index: rank_entry(entry) for entry in entries}


def apply_rankings(
    puns: list[PunEntry], rankings: Mapping[int, Ranking], *, strict: bool = True, file: str | None = None
) -> list[PunEntry]:
    """New entries with the ``cloze_*`` fields set; with ``strict`` every joke must have a ranking."""
    out = []
    for position, joke in enumerate(puns):
        r = rankings.get(joke.index)
        if r is None:
            if strict:
                raise InputError(
                    "joke has no classified completions, so it cannot be ranked",
                    file=file,
                    record=f"joke index {joke.index} (position {position})",
                )
            out.append(joke)
            continue
        out.append(
            msgspec.structs.replace(
                joke,
                cloze_balance=r.balance,
                cloze_p_straight=r.p_straight,
                cloze_p_funny=r.p_funny,
                cloze_p_other=r.p_other,
                cloze_tier=r.tier,
                cloze_model_funny_rate=dict(r.model_funny_rate),
            )
        )
    return out


def tier_counts(puns: Iterable[PunEntry]) -> dict[str, int]:
    """How many jokes are in each tier (all four tiers present, in canonical order)."""
    counts = {"balanced": 0, "leaning": 0, "funny_dominated": 0, "straight_dominated": 0}
    for joke in puns:
        if isinstance(joke.cloze_tier, str):
            counts[joke.cloze_tier] += 1
    return counts


def mean_model_funny_rate(puns: Iterable[PunEntry]) -> dict[str, float]:
    """Each model's funny rate averaged over the ranked jokes that have one (models in first-seen order,
    which is the config's): the size effect the cloze tests build on, in one number per model."""
    rates: dict[str, list[float]] = {}
    for joke in puns:
        for model, rate in (joke.cloze_model_funny_rate or {}).items():
            rates.setdefault(model, []).append(float(rate))
    return {model: sum(r) / len(r) for model, r in rates.items()}
