"""Stage 5 reproduces every ``cloze_*`` field of the published ``puns_205.json``."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from punchline.data.errors import InputError
from punchline.pipelines.puns.data.puns_io import dump_puns, load_classified, load_puns
from punchline.pipelines.puns.data.schemas import ClassifiedEntry, ModelCompletions, PunEntry
from punchline.pipelines.puns.data.tiers import apply_rankings, assign_tier, mean_model_funny_rate, rank, tier_counts

CLOZE_FIELDS = (
    "cloze_balance",
    "cloze_p_straight",
    "cloze_p_funny",
    "cloze_p_other",
    "cloze_tier",
    "cloze_model_funny_rate",
)


def _strip(joke: PunEntry) -> PunEntry:
    return msgspec.structs.replace(joke, **{f: msgspec.UNSET for f in CLOZE_FIELDS})


def test_golden_rank_reproduces_puns_205(shared_puns: Path, tmp_path: Path) -> None:
    src = shared_puns / "puns_205.json"
    published = load_puns(src)
    rankings = rank(load_classified(shared_puns / "classified_completions.json"))
    ranked = apply_rankings([_strip(j) for j in published], rankings)
    for got, want in zip(ranked, published, strict=True):
        for field in CLOZE_FIELDS:
            assert getattr(got, field) == getattr(want, field), (want.index, field)
    assert tier_counts(ranked) == {"balanced": 42, "leaning": 51, "funny_dominated": 24, "straight_dominated": 88}
    out = tmp_path / "puns.json"
    dump_puns(out, ranked)
    assert out.read_bytes() == src.read_bytes()


@pytest.mark.parametrize(
    ("balance", "p_funny", "tier"),
    [
        (0.3, 0.05, "balanced"),
        (0.2999, 0.05, "leaning"),
        (0.3, 0.0499, "straight_dominated"),
        (0.0501, 0.5, "leaning"),
        (0.05, 0.51, "funny_dominated"),
        (0.05, 0.5, "straight_dominated"),
        (0.0, 1.0, "funny_dominated"),
        (0.0, 0.0, "straight_dominated"),
    ],
)
def test_tier_thresholds(balance: float, p_funny: float, tier: str) -> None:
    assert assign_tier(balance, p_funny) == tier


def _entry(samples: dict[str, list[str]], classes: dict) -> ClassifiedEntry:
    from punchline.pipelines.puns.data.completions import aggregate

    models = {k: ModelCompletions(greedy="", samples=v) for k, v in samples.items()}
    return ClassifiedEntry(
        index=3,
        sentence="A ___",
        prompt="A",
        existing_straight=["s"],
        existing_punny=["f"],
        models=models,
        aggregated=aggregate(models),
        classifications=classes,
    )


def test_hand_computed_ranking() -> None:
    entry = _entry(
        {"m1": ["s", "s", "f"], "m2": ["f", "x", "y"], "m3": []}, {"s": "straight", "f": "funny", "x": "other"}
    )
    r = rank({"3": entry})[3]
    assert (r.p_straight, r.p_funny, r.p_other) == (0.3333, 0.3333, 0.3333)
    assert r.balance == 1.0 and r.tier == "balanced"
    assert r.model_funny_rate == {"m1": 0.3333, "m2": 0.3333, "m3": 0}


def test_no_samples_gives_zeros() -> None:
    r = rank([_entry({"m": []}, {})])[3]
    assert (r.balance, r.p_straight, r.p_funny, r.p_other, r.tier) == (0.0, 0, 0, 0, "straight_dominated")


def test_apply_rankings_requires_every_joke() -> None:
    joke = PunEntry(index=9, id=9, sentence="A ___", straight=["a"], punny=["b"])
    with pytest.raises(InputError) as info:
        apply_rankings([joke], {})
    assert "joke index 9" in str(info.value)
    assert apply_rankings([joke], {}, strict=False) == [joke]


def test_mean_model_funny_rate_over_the_jokes_that_have_one() -> None:
    def joke(i: int, rates: dict[str, float] | None) -> PunEntry:
        entry = PunEntry(index=i, id=i, sentence="A ___", straight=["a"], punny=["b"])
        return entry if rates is None else msgspec.structs.replace(entry, cloze_model_funny_rate=rates)

    puns = [joke(0, {"8b": 0.1, "70b": 0.5}), joke(1, {"8b": 0.3, "70b": 0.2, "405b": 0.9}), joke(2, None)]
    means = mean_model_funny_rate(puns)
    assert list(means) == ["8b", "70b", "405b"]  # first-seen (config) order, not sorted
    assert means == pytest.approx({"8b": 0.2, "70b": 0.35, "405b": 0.9})
    assert mean_model_funny_rate([joke(3, None)]) == {}


def test_tiers_plot_is_a_deterministic_png(shared_puns: Path) -> None:
    from punchline.pipelines.puns.data.plots import plot_tiers

    puns = load_puns(shared_puns / "puns_205.json")
    first = plot_tiers(puns)
    assert first.startswith(b"\x89PNG\r\n\x1a\n") and len(first) > 20_000
    assert plot_tiers(puns) == first  # the same bytes every time: artifacts compare byte for byte
    assert plot_tiers(puns[:10]) != first
    assert plot_tiers([PunEntry(index=0, id=0, sentence="A ___", straight=["a"], punny=["b"])]).startswith(b"\x89PNG")
