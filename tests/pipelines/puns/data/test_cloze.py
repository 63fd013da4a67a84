"""Stage 6: the builder's invariants, and the golden reproduction of the published cloze tests."""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from punchline.data.errors import InputError
from punchline.data.storage.jsonio import dumps_upstream
from punchline.pipelines.puns.data.cloze import build_tests, fill, select_pools
from punchline.pipelines.puns.data.completions import truncate_before_blank
from punchline.pipelines.puns.data.puns_io import load_puns
from punchline.pipelines.puns.data.schemas import TIERS, PunEntry

# sha256 of davidbau/puns datasets/contextual_cloze_tests_100.json at commit
# b15585485ce1bbbce41c1198aa15880fb129fb18 (83507 bytes), computed from the text read through the
# code-search read_file tool on 2026-11-30 (the file itself is not committed).
PUBLISHED_SHA256 = "7b45996d0919173fbcb76880aa4b13a965e48813459b5780f4acc619b58ebcc6"
PUBLISHED_BYTES = 83507

# The shared puns_205.json (identical to upstream datasets/puns_205.json @ 382f039) was edited after
# the tests were published: words were appended to the straight/punny lists of 27 of the 50 target
# jokes. Selection, prompts, indices, tiers and balances are unaffected; the published tests carry
# the older lists, which are exact prefixes of today's. Lengths (straight, punny) at publication:
PUBLISHED_LIST_LENGTHS: dict[int, tuple[int, int]] = {
    138: (11, 1), 76: (13, 2), 71: (8, 3), 105: (17, 2), 35: (8, 1), 162: (15, 3), 1: (11, 1),
    125: (16, 1), 87: (23, 1), 84: (16, 1), 119: (10, 1), 103: (9, 1), 176: (10, 1), 43: (11, 1),
    73: (11, 1), 184: (4, 2), 28: (21, 1), 54: (3, 1), 171: (4, 2), 113: (6, 2), 16: (12, 1),
    172: (16, 2), 3: (24, 1), 36: (8, 1), 90: (4, 1), 151: (8, 2), 56: (17, 1),
}  # fmt: skip
# sha256 of what the builder makes from today's shared puns_205.json (regression guard).
CURRENT_SHA256 = "2f4b1b698ba1fcc5d3a77ec008fce42dcf566c1cc8158f971a8f18638087b767"


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def test_golden_reproduces_published_tests(shared_puns: Path) -> None:
    puns = load_puns(shared_puns / "puns_205.json")
    as_published = []
    for joke in puns:
        if joke.index in PUBLISHED_LIST_LENGTHS:
            n_straight, n_punny = PUBLISHED_LIST_LENGTHS[joke.index]
            assert len(joke.straight) > n_straight or len(joke.punny) > n_punny
            joke = msgspec.structs.replace(joke, straight=joke.straight[:n_straight], punny=joke.punny[:n_punny])
        as_published.append(joke)
    text = dumps_upstream(build_tests(as_published, seed=42, pairs=50))
    assert len(text.encode()) == PUBLISHED_BYTES
    assert _sha(text) == PUBLISHED_SHA256


def test_current_puns_differ_from_published_only_in_lists(shared_puns: Path) -> None:
    tests = build_tests(load_puns(shared_puns / "puns_205.json"))
    assert _sha(dumps_upstream(tests)) == CURRENT_SHA256
    assert {t.joke_c_index for t in tests} >= set(PUBLISHED_LIST_LENGTHS)
    assert (tests[0].joke_a_index, tests[0].joke_b_index, tests[0].joke_c_index) == (200, 160, 138)
    assert tests[1].prompt.startswith("The dieter went to the paint store to get thinner ")


# --- invariants on generated inputs ---------------------------------------------------------------


def _joke(index: int, tier: str) -> PunEntry:
    return PunEntry(
        index=index,
        id=1000 + index,
        sentence=f"Joke {index} setup ends with ___",
        straight=[f"s{index}", f"t{index}"],
        punny=[f"p{index}"],
        cloze_tier=tier,  # type: ignore[arg-type]
        cloze_balance=round(index / 1000, 4),
    )


@st.composite
def puns_and_pairs(draw: st.DrawFn) -> tuple[list[PunEntry], int]:
    pairs = draw(st.integers(1, 8))
    n_target = draw(st.integers(pairs, pairs + 6))
    n_context = draw(st.integers(max(0, 2 * pairs - (n_target - pairs)), 2 * pairs + 6))
    n_funny = draw(st.integers(0, 4))
    tiers = (
        ["straight_dominated"] * n_target
        + [draw(st.sampled_from(["balanced", "leaning"])) for _ in range(n_context)]
        + ["funny_dominated"] * n_funny
    )
    tiers = draw(st.permutations(tiers))
    return [_joke(i, t) for i, t in enumerate(tiers)], pairs


@settings(max_examples=60, deadline=None)
@given(puns_and_pairs(), st.integers(0, 2**32))
def test_invariants(data: tuple[list[PunEntry], int], seed: int) -> None:
    puns, pairs = data
    by_index = {p.index: p for p in puns}
    tests = build_tests(puns, seed=seed, pairs=pairs)
    assert len(tests) == 2 * pairs
    roles: dict[int, str] = {}
    for i in range(pairs):
        s, f = tests[2 * i], tests[2 * i + 1]
        assert (s.pair_id, s.type, f.pair_id, f.type) == (i, "straight", i, "funny")
        assert (s.joke_a_index, s.joke_b_index, s.joke_c_index) == (f.joke_a_index, f.joke_b_index, f.joke_c_index)
        a, b, c = by_index[s.joke_a_index], by_index[s.joke_b_index], by_index[s.joke_c_index]
        assert c.cloze_tier == "straight_dominated"
        assert a.cloze_tier != "funny_dominated" and b.cloze_tier != "funny_dominated"
        for index, role in ((a.index, "a"), (b.index, "b"), (c.index, "c")):
            assert index not in roles, "a joke appears in two roles"
            roles[index] = role
        assert s.prompt == f"{fill(a.sentence, a.straight[0])} {fill(b.sentence, b.straight[0])} " + (
            truncate_before_blank(c.sentence)
        )
        assert f.prompt.startswith(f"{fill(a.sentence, a.punny[0])} {fill(b.sentence, b.punny[0])} ")
        assert (s.expected_completion, s.contrast_completion) == (c.straight, c.punny)
        assert (f.expected_completion, f.contrast_completion) == (c.punny, c.straight)
        assert s.joke_c_balance == c.cloze_balance and s.joke_c_sentence == c.sentence
    assert build_tests(puns, seed=seed, pairs=pairs) == tests


def test_different_seeds_differ() -> None:
    puns = [_joke(i, TIERS[i % 4]) for i in range(80)]
    one = build_tests(puns, seed=1, pairs=8)
    assert one == build_tests(puns, seed=1, pairs=8)
    assert one != build_tests(puns, seed=2, pairs=8)
    assert [t.joke_c_index for t in one] != [t.joke_c_index for t in build_tests(puns, seed=3, pairs=8)]


def test_too_few_targets_is_an_input_error() -> None:
    puns = [_joke(i, "straight_dominated") for i in range(3)] + [_joke(i, "balanced") for i in range(3, 20)]
    with pytest.raises(InputError) as info:
        build_tests(puns, pairs=4)
    assert "need 4 straight_dominated" in str(info.value) and "found 3" in str(info.value)


def test_too_few_context_jokes_is_an_input_error() -> None:
    puns = [_joke(i, "straight_dominated") for i in range(5)] + [_joke(i, "funny_dominated") for i in range(5, 30)]
    with pytest.raises(InputError) as info:
        select_pools(puns, pairs=4)
    assert "need 8 context jokes" in str(info.value) and "found 1" in str(info.value)


def test_unranked_joke_is_an_input_error() -> None:
    puns = [_joke(0, "balanced"), PunEntry(index=1, id=1, sentence="A ___", straight=["a"], punny=["b"])]
    with pytest.raises(InputError) as info:
        build_tests(puns, pairs=1, file="p.json")
    assert info.value.field == "cloze_tier" and "joke index 1" in str(info.value) and "p.json" in str(info.value)
