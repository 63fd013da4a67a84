"""McNemar against Fagerland, Lydersen & Laake (2013) and hand counts; the paired bootstrap keeps the pairing."""

from __future__ import annotations

import pytest

from punchline.data.metrics.paired import compare, compare_models, mcnemar, paired_bootstrap


def test_mcnemar_on_fagerland_2013s_example() -> None:
    # Bentur et al. (2009) airway hyper-responsiveness, b = 1, c = 7: exact 0.070, mid-p 0.039 in the paper
    test = mcnemar(1, 7)
    assert test.p_exact == pytest.approx(18 / 256) and round(test.p_exact, 3) == 0.070
    assert test.p_mid == pytest.approx(10 / 256) and round(test.p_mid, 3) == 0.039
    assert mcnemar(7, 1).p_exact == test.p_exact  # two-sided


def test_mcnemar_without_discordant_items_or_balanced_is_1() -> None:
    assert (mcnemar(0, 0).p_exact, mcnemar(0, 0).p_mid) == (1.0, 1.0)
    assert mcnemar(4, 4).p_exact == 1.0
    big = mcnemar(900, 1000)  # 2**1900 overflows a float: summed in log space
    assert 0.01 < big.p_mid < big.p_exact < 0.05


def test_compare_binary_counts_the_table_on_shared_items() -> None:
    a = {1: 1, 2: 1, 3: 0, 4: 1, 5: 0, 9: 1}
    b = {1: 0, 2: 1, 3: 0, 4: 0, 5: 1, 8: 0}  # items 9 and 8 are not shared: left out
    c = compare("a", a, "b", b, resamples=500, seed=2)
    assert (c.n, c.both, c.neither) == (5, 1, 1)
    assert c.test is not None and (c.test.only_a, c.test.only_b) == (2, 1)
    assert c.mean_a == pytest.approx(3 / 5) and c.mean_b == pytest.approx(2 / 5)
    assert c.difference == pytest.approx(1 / 5)
    assert c.interval is not None and c.interval.low <= 0.2 <= c.interval.high
    assert compare("a", a, "b", b, resamples=500, seed=2) == c  # seeded


def test_compare_graded_outcomes_has_no_mcnemar_and_no_shared_items_is_undefined() -> None:
    c = compare("a", {1: 0.5, 2: 1.0}, "b", {1: 0.0, 2: 0.5})
    assert c.test is None and c.both is None and c.difference == pytest.approx(0.5)
    assert c.interval is not None and c.interval.low == c.interval.high == pytest.approx(0.5)  # every item +0.5
    empty = compare("a", {1: 1}, "b", {2: 1})
    assert empty.n == 0 and empty.difference is None and empty.interval is None and empty.mean_a is None


def test_paired_interval_is_narrower_than_the_unpaired_noise() -> None:
    # b is a, with 6 items of 60 flipped to right: a steady +10 points that independent intervals would drown
    a = [float(i % 2) for i in range(60)]
    b = [1.0 if i % 10 == 0 else x for i, x in enumerate(a)]
    iv = paired_bootstrap(b, a, resamples=2000, seed=0)
    assert iv is not None and 0.0 < iv.low < 0.1 < iv.high < 0.2
    with pytest.raises(ValueError, match="unequal"):
        paired_bootstrap([1.0], [])


def test_compare_models_takes_every_pair_in_order() -> None:
    outcomes = {"x": {1: 1.0}, "y": {1: 0.0}, "z": {1: 1.0}}
    assert [(c.a, c.b) for c in compare_models(outcomes)] == [("x", "y"), ("x", "z"), ("y", "z")]
