"""The Puns study's history: what its files looked like when each published number was made.

Upstream kept editing ``puns_205.json`` after the study: words were added to the jokes' straight and
punny lists after the completions were classified (and more after the cloze tests were written). The
classify stage trusts list membership (a listed word is straight or funny without asking the judge),
so running the pipeline over today's lists counts 24 words in 16 jokes as straight or funny that
upstream's classifier called "other", and ends with different tiers (44/53/24/84, 189 of 205 jokes
equal) and different cloze tests. The lists as they were at classification time are today's lists
minus the words the recorded classification calls "other" (:func:`lists_as_classified`); with them
the engine reproduces the published tiers and cloze tests exactly. The published analysis then scored
the recorded cloze answers against the lists of its own day, i.e. today's ``puns_205.json``.

The published numbers are kept here only to compare a reproduction with; nothing is computed from them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import msgspec

from punchline.data.errors import InputError
from punchline.data.storage.jsonio import dumps_upstream
from punchline.pipelines.puns.data.schemas import ClassifiedEntry, ClozeTest, PunEntry

#: Tier counts of the published ``puns_205.json`` (DATASET.md of davidbau/puns).
PUBLISHED_TIERS: dict[str, int] = {"balanced": 42, "leaning": 51, "funny_dominated": 24, "straight_dominated": 88}

#: Funny-rate shift (funny-primed minus straight-primed, percentage points) per model, as published
#: in EXPERIMENTS.md of davidbau/puns ("Context Effect: Funny-Rate Shift").
PUBLISHED_DELTA_PP: dict[str, float] = {"3b": 2.0, "8b": 2.0, "70b": 38.0, "3.3-70b": 36.0, "405b": 42.0}

#: :func:`selection_fingerprint` of the published ``contextual_cloze_tests_100.json`` (davidbau/puns
#: ``datasets/`` at b15585485ce1bbbce41c1198aa15880fb129fb18, sha256 7b45996d…ebcc6): which jokes are
#: paired, in which order, with which prompts, tiers and balances. The word lists are left out: the
#: published file carries the lists of the day it was written, which are neither today's nor those at
#: classification time. tests/pipelines/puns/data/test_puns_history.py recomputes it from the byte-exact reconstruction.
PUBLISHED_TESTS_SELECTION_SHA256 = "e284b0d26b14b47bdc1a890b1a599f2d97b3fd9efb06d45443291d6ca8fa7ce2"
PUBLISHED_TESTS = 100

#: The upstream files a reproduction reads, and where upstream's repository keeps the ones not shared.
UPSTREAM_PUNS = "puns_205.json"
UPSTREAM_RAW = "raw_completions.json"
UPSTREAM_CLASSIFIED = "classified_completions.json"
UPSTREAM_CLOZE_ANSWERS = ("cloze_benchmark_raw.json", "results/cloze_benchmark_raw.json")
UPSTREAM_CLOZE_TESTS = ("contextual_cloze_tests_100.json", "datasets/contextual_cloze_tests_100.json")


class RemovedWord(msgspec.Struct, frozen=True):
    """A list word that upstream's classifier called "other": it joined the list after classification."""

    index: int  # joke index
    word: str
    list: str  # "straight" or "punny"


def lists_as_classified(
    puns: list[PunEntry], classified: Mapping[str, ClassifiedEntry], *, file: str | None = None
) -> tuple[list[PunEntry], list[RemovedWord]]:
    """The jokes with every list word removed that the recorded classification calls "other".

    Words are compared lowercased, as the classify stage compares them. Every joke needs an entry in
    ``classified`` (the checkpoint of the same study); the order of the remaining words is kept.
    """
    out: list[PunEntry] = []
    removed: list[RemovedWord] = []
    for joke in puns:
        entry = classified.get(str(joke.index))
        if entry is None:
            raise InputError(f"joke index {joke.index} has no classification", file=file, record=str(joke.index))
        kept: dict[str, list[str]] = {}
        for which, words in (("straight", joke.straight), ("punny", joke.punny)):
            kept[which] = []
            for word in words:
                if entry.classifications.get(word.lower()) == "other":
                    removed.append(RemovedWord(joke.index, word, which))
                else:
                    kept[which].append(word)
        out.append(msgspec.structs.replace(joke, straight=kept["straight"], punny=kept["punny"]))
    return out, removed


def without_lists(test: ClozeTest) -> ClozeTest:
    return msgspec.structs.replace(test, expected_completion=[], contrast_completion=[])


def selection_fingerprint(tests: list[ClozeTest]) -> str:
    """sha256 of the tests without their word lists (in upstream's JSON layout)."""
    return hashlib.sha256(dumps_upstream([without_lists(t) for t in tests]).encode("utf-8")).hexdigest()


def is_published_selection(tests: list[ClozeTest]) -> bool:
    """Whether ``tests`` pair the published jokes with the published prompts, tiers and balances."""
    return len(tests) == PUBLISHED_TESTS and selection_fingerprint(tests) == PUBLISHED_TESTS_SELECTION_SHA256


class TestsComparison(msgspec.Struct, kw_only=True):
    """Our cloze tests against a published tests file."""

    __test__ = False  # not a pytest class

    same_selection: bool  # every field but the word lists equal, test by test
    lists_differ: int  # tests whose expected/contrast lists differ


def compare_tests(ours: list[ClozeTest], published: list[ClozeTest]) -> TestsComparison:
    same = len(ours) == len(published) and all(
        without_lists(a) == without_lists(b) for a, b in zip(ours, published, strict=False)
    )
    differ = sum(
        1
        for a, b in zip(ours, published, strict=False)
        if (a.expected_completion, a.contrast_completion) != (b.expected_completion, b.contrast_completion)
    )
    return TestsComparison(same_selection=same, lists_differ=differ)


def delta_matches(delta_pp: Mapping[str, float], published: Mapping[str, float] = PUBLISHED_DELTA_PP) -> bool:
    """Whether every published model's shift is reproduced (to the published whole point)."""
    return all(nick in delta_pp and round(delta_pp[nick]) == round(pp) for nick, pp in published.items())
