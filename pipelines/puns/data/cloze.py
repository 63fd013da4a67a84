"""Stage 6: contrastive cloze tests from ranked jokes.

Targets (C) are straight-dominated jokes, where a model left alone says the literal word, so a pun
answer can only come from the context. The two context jokes (A, B) come from the jokes that have a
clear straight/pun contrast. Each triple yields a straight-primed and a funny-primed test whose
only difference is how A and B are filled in. One ``random.Random(seed)`` drives both shuffles in
upstream's order, which is what makes the published ``contextual_cloze_tests_100.json`` reproducible.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from msgspec import UnsetType

from punchline.data.errors import InputError
from punchline.pipelines.puns.data.completions import truncate_before_blank
from punchline.pipelines.puns.data.schemas import BLANK, ClozeTest, PrimingType, PunEntry

DEFAULT_SEED = 42
DEFAULT_PAIRS = 50
TARGET_TIER = "straight_dominated"
CONTEXT_TIERS = ("balanced", "leaning")


def fill(sentence: str, word: str) -> str:
    """The sentence with its blank replaced by ``word``."""
    return sentence.replace(BLANK, word)


def select_pools(
    puns: Sequence[PunEntry], *, seed: int = DEFAULT_SEED, pairs: int = DEFAULT_PAIRS, file: str | None = None
) -> tuple[list[PunEntry], list[PunEntry]]:
    """(targets, context pool): ``pairs`` targets and ``2 * pairs`` context jokes, deterministic per seed."""
    if pairs < 1:
        raise InputError(f"--pairs must be at least 1, got {pairs}")
    for position, joke in enumerate(puns):
        if not isinstance(joke.cloze_tier, str):
            raise InputError(
                "joke has no cloze_tier; rank the puns first (punchline puns rank)",
                file=file,
                record=f"joke index {joke.index} (position {position})",
                field="cloze_tier",
            )
    by_tier: dict[str, list[PunEntry]] = {}
    for joke in puns:
        by_tier.setdefault(str(joke.cloze_tier), []).append(joke)

    rng = random.Random(seed)
    straight_dominated = list(by_tier.get(TARGET_TIER, []))
    if len(straight_dominated) < pairs:
        raise InputError(
            f"{pairs} pairs need {pairs} {TARGET_TIER} jokes as targets, found {len(straight_dominated)}",
            file=file,
            field="cloze_tier",
        )
    rng.shuffle(straight_dominated)
    targets = straight_dominated[:pairs]
    candidates = [j for tier in CONTEXT_TIERS for j in by_tier.get(tier, [])] + straight_dominated[pairs:]
    if len(candidates) < 2 * pairs:
        raise InputError(
            f"{pairs} pairs need {2 * pairs} context jokes (balanced + leaning + leftover "
            f"{TARGET_TIER}), found {len(candidates)}",
            file=file,
            field="cloze_tier",
        )
    rng.shuffle(candidates)
    return targets, candidates[: 2 * pairs]


def _test(pair_id: int, kind: PrimingType, a: PunEntry, b: PunEntry, c: PunEntry) -> ClozeTest:
    if kind == "straight":
        wa, wb = a.straight[0], b.straight[0]
        expected, contrast = c.straight, c.punny
    else:
        wa, wb = a.punny[0], b.punny[0]
        expected, contrast = c.punny, c.straight
    return ClozeTest(
        pair_id=pair_id,
        type=kind,
        prompt=f"{fill(a.sentence, wa)} {fill(b.sentence, wb)} {truncate_before_blank(c.sentence)}",
        expected_completion=list(expected),
        contrast_completion=list(contrast),
        joke_a_index=a.index,
        joke_b_index=b.index,
        joke_c_index=c.index,
        joke_c_sentence=c.sentence,
        joke_a_tier=str(a.cloze_tier),
        joke_b_tier=str(b.cloze_tier),
        joke_c_tier=str(c.cloze_tier),
        joke_c_balance=0 if isinstance(c.cloze_balance, UnsetType) else c.cloze_balance,
    )


def build_tests(
    puns: Sequence[PunEntry], *, seed: int = DEFAULT_SEED, pairs: int = DEFAULT_PAIRS, file: str | None = None
) -> list[ClozeTest]:
    """``2 * pairs`` tests: for pair i, A = pool[2i], B = pool[2i+1], C = targets[i]; straight test first."""
    targets, pool = select_pools(puns, seed=seed, pairs=pairs, file=file)
    tests: list[ClozeTest] = []
    for i, c in enumerate(targets):
        a, b = pool[2 * i], pool[2 * i + 1]
        tests.append(_test(i, "straight", a, b, c))
        tests.append(_test(i, "funny", a, b, c))
    return tests
