"""The lists as they were at classification time reproduce upstream's verdicts, tiers and cloze tests;
today's lists do not (the cause of the 189/205 engine run)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec
import pytest

from punchline.data.errors import InputError
from punchline.data.storage.jsonio import dumps_upstream
from punchline.pipelines.puns.data.classify import candidates, merge_all
from punchline.pipelines.puns.data.cloze import build_tests
from punchline.pipelines.puns.data.completions import build_raw_entry
from punchline.pipelines.puns.data.puns_history import (
    PUBLISHED_TESTS_SELECTION_SHA256,
    PUBLISHED_TIERS,
    RemovedWord,
    compare_tests,
    delta_matches,
    is_published_selection,
    lists_as_classified,
    selection_fingerprint,
)
from punchline.pipelines.puns.data.puns_io import load_classified, load_puns, load_raw_completions
from punchline.pipelines.puns.data.schemas import ClassifiedCompletions, ClassifiedEntry, PunEntry, RawCompletions
from punchline.pipelines.puns.data.tiers import apply_rankings, rank, tier_counts
from tests.pipelines.puns.data.test_cloze import PUBLISHED_LIST_LENGTHS, PUBLISHED_SHA256

CLOZE_FIELDS = ("cloze_balance", "cloze_p_straight", "cloze_p_funny", "cloze_p_other", "cloze_tier")


@pytest.fixture(scope="module")
def upstream(shared_puns: Path) -> tuple[list[PunEntry], RawCompletions, ClassifiedCompletions]:
    return (
        load_puns(shared_puns / "puns_205.json"),
        load_raw_completions(shared_puns / "raw_completions.json"),
        load_classified(shared_puns / "classified_completions.json"),
    )


def _engine_classification(jokes: list[PunEntry], raw: RawCompletions, classified: ClassifiedCompletions) -> dict:
    """What the collect and classify stages make of ``jokes`` when the recorded answers are replayed:
    stage 3 records with the jokes' lists, and upstream's verdict for every word the run asks about."""
    run_raw = {str(j.index): build_raw_entry(j, raw[str(j.index)].models) for j in jokes}
    verdicts = {
        k: {w: classified[k].classifications.get(w, "other") for w in candidates(e)} for k, e in run_raw.items()
    }
    return merge_all(run_raw, verdicts)


def test_words_called_other_are_removed_from_the_lists(upstream: tuple) -> None:
    puns, _, classified = upstream
    jokes, removed = lists_as_classified(puns, classified)
    assert (len(removed), len({r.index for r in removed})) == (24, 16)
    assert RemovedWord(19, "record", "punny") in removed
    by_index = {p.index: p for p in puns}
    for r in removed:
        assert classified[str(r.index)].classifications[r.word.lower()] == "other"
        assert r.word in getattr(by_index[r.index], r.list)
    for before, after in zip(puns, jokes, strict=True):
        gone = {r.word for r in removed if r.index == before.index}
        assert after.straight == [w for w in before.straight if w not in gone]  # order kept
        assert after.punny == [w for w in before.punny if w not in gone]
        assert msgspec.structs.replace(after, straight=before.straight, punny=before.punny) == before


def test_lists_as_classified_reproduce_the_verdicts_tiers_and_published_tests(upstream: tuple) -> None:
    puns, raw, classified = upstream
    jokes, _ = lists_as_classified(puns, classified)
    ours = _engine_classification(jokes, raw, classified)
    assert all(ours[k].classifications == classified[k].classifications for k in classified)
    ranked = apply_rankings(jokes, rank(ours))
    assert tier_counts(ranked) == PUBLISHED_TIERS
    for mine, published in zip(ranked, puns, strict=True):
        assert [getattr(mine, f) for f in CLOZE_FIELDS] == [getattr(published, f) for f in CLOZE_FIELDS]
        assert mine.cloze_model_funny_rate == published.cloze_model_funny_rate
    tests = build_tests(ranked)
    assert is_published_selection(tests)


def test_todays_lists_give_other_tiers_and_tests(upstream: tuple) -> None:
    puns, raw, classified = upstream
    ranked = apply_rankings(puns, rank(_engine_classification(puns, raw, classified)))
    assert tier_counts(ranked) == {"balanced": 44, "leaning": 53, "funny_dominated": 24, "straight_dominated": 84}
    same = sum(1 for a, b in zip(ranked, puns, strict=True) if a.cloze_tier == b.cloze_tier)
    assert same < len(puns)
    assert not is_published_selection(build_tests(ranked))


def test_selection_pin_is_the_published_file_without_its_lists(shared_puns: Path) -> None:
    # the byte-exact reconstruction of the published tests (tests/pipelines/puns/data/test_cloze.py pins its sha256)
    as_published = []
    for joke in load_puns(shared_puns / "puns_205.json"):
        if joke.index in PUBLISHED_LIST_LENGTHS:
            n_straight, n_punny = PUBLISHED_LIST_LENGTHS[joke.index]
            joke = msgspec.structs.replace(joke, straight=joke.straight[:n_straight], punny=joke.punny[:n_punny])
        as_published.append(joke)
    published = build_tests(as_published)
    assert hashlib.sha256(dumps_upstream(published).encode()).hexdigest() == PUBLISHED_SHA256
    assert selection_fingerprint(published) == PUBLISHED_TESTS_SELECTION_SHA256
    assert is_published_selection(published)
    changed = [msgspec.structs.replace(published[0], prompt=published[0].prompt + " "), *published[1:]]
    assert not is_published_selection(changed) and not is_published_selection(published[:98])

    other_lists = build_tests(load_puns(shared_puns / "puns_205.json"))  # today's lists, same selection
    cmp = compare_tests(other_lists, published)
    assert cmp.same_selection and cmp.lists_differ == 54
    assert not compare_tests(changed, published).same_selection


def test_delta_matches_to_the_published_whole_point() -> None:
    published = {"3b": 2.0, "8b": 2.0, "70b": 38.0, "3.3-70b": 36.0, "405b": 42.0}
    assert delta_matches(published)
    assert delta_matches({**published, "70b": 38.4})
    assert not delta_matches({**published, "70b": 36.0})
    assert not delta_matches({k: v for k, v in published.items() if k != "405b"})


def test_a_joke_without_classification_is_an_input_error() -> None:
    joke = PunEntry(index=3, id=3, sentence="A ___", straight=["a"], punny=["b"])
    with pytest.raises(InputError) as info:
        lists_as_classified([joke], {}, file="c.json")
    assert info.value.file == "c.json" and "joke index 3" in str(info.value)


def test_word_case_is_ignored_as_the_classify_stage_ignores_it() -> None:
    joke = PunEntry(index=0, id=0, sentence="A ___", straight=["Rest", "nap"], punny=["Loafed"])
    entry = msgspec.convert(
        {
            "index": 0,
            "sentence": "A ___",
            "prompt": "A",
            "existing_straight": ["nap"],
            "existing_punny": [],
            "models": {},
            "aggregated": {"word_counts": {}, "greedy_counts": {}, "total_samples": 0},
            "classifications": {"rest": "other", "loafed": "funny", "nap": "straight"},
        },
        ClassifiedEntry,
    )
    jokes, removed = lists_as_classified([joke], {"0": entry})
    assert (jokes[0].straight, jokes[0].punny) == (["nap"], ["Loafed"])
    assert removed == [RemovedWord(0, "Rest", "straight")]
