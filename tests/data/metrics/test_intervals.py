"""Intervals against published values: Wilson and Clopper-Pearson from Newcombe (1998, Table I), exact bounds with
closed forms, and the bootstrap's percentile interval (seeded: the same on every run)."""

from __future__ import annotations

import math

import pytest

from punchline.data.metrics.intervals import (
    Interval,
    binomial_cdf,
    bootstrap_mean,
    clopper_pearson,
    newcombe_difference,
    ratio,
    wilson,
)


def _pct(iv: Interval | None, digits: int = 1) -> tuple[float, float]:
    assert iv is not None
    return round(100 * iv.low, digits), round(100 * iv.high, digits)


def test_wilson_of_5_out_of_24_is_the_issues_figure() -> None:
    assert _pct(wilson(5, 24)) == (9.2, 40.5)


@pytest.mark.parametrize(
    ("k", "n", "wilson_4dp", "exact_4dp"),
    [  # Newcombe (1998), "Two-sided confidence intervals for the single proportion", Table I
        (81, 263, (0.2553, 0.3662), (0.2527, 0.3676)),
        (15, 148, (0.0624, 0.1605), (0.0578, 0.1617)),
        (0, 20, (0.0, 0.1611), (0.0, 0.1684)),
        (1, 29, (0.0061, 0.1718), (0.0009, 0.1776)),
    ],
)
def test_wilson_and_clopper_pearson_match_newcombe_table_1(
    k: int, n: int, wilson_4dp: tuple[float, float], exact_4dp: tuple[float, float]
) -> None:
    w, cp = wilson(k, n), clopper_pearson(k, n)
    assert w is not None and cp is not None
    assert (round(w.low, 4), round(w.high, 4)) == wilson_4dp
    assert (round(cp.low, 4), round(cp.high, 4)) == exact_4dp


def test_clopper_pearson_ends_with_closed_forms() -> None:
    none_of_10 = clopper_pearson(0, 10)
    assert none_of_10 is not None and none_of_10.low == 0.0
    assert none_of_10.high == pytest.approx(1 - 0.025 ** (1 / 10), abs=1e-12)  # (1 - p)^10 = 0.025
    all_of_10 = clopper_pearson(10, 10)
    assert all_of_10 is not None and all_of_10.high == 1.0 and all_of_10.low == pytest.approx(0.025 ** (1 / 10))
    one_of_10 = clopper_pearson(1, 10)
    assert one_of_10 is not None and one_of_10.low == pytest.approx(1 - 0.975 ** (1 / 10), abs=1e-12)
    assert round(one_of_10.high, 4) == 0.4450


def test_exact_is_wider_than_wilson_and_a_lower_level_narrower() -> None:
    w, cp, w90 = wilson(5, 24), clopper_pearson(5, 24), wilson(5, 24, level=0.90)
    assert w is not None and cp is not None and w90 is not None
    assert cp.low < w.low and cp.high > w.high
    assert w.low < w90.low and w90.high < w.high
    assert w90.high == pytest.approx(0.3705, abs=1e-4)  # z = 1.6449


def test_undefined_is_none_never_zero() -> None:
    assert ratio(0, 0) is None and ratio(0, 5) == 0.0
    assert wilson(0, 0) is None and clopper_pearson(0, 0) is None
    assert bootstrap_mean([]) is None
    assert newcombe_difference(1, 0, 1, 3) is None


def test_binomial_cdf() -> None:
    assert binomial_cdf(1, 8, 0.5) == pytest.approx(9 / 256)
    assert binomial_cdf(8, 8, 0.3) == 1.0 and binomial_cdf(-1, 8, 0.3) == 0.0
    assert binomial_cdf(500, 1000, 0.5) == pytest.approx(0.5 + 0.5 * math.comb(1000, 500) / 2**1000, rel=1e-9)


def test_bootstrap_is_seeded_and_narrower_than_wilson_at_small_n() -> None:
    values = [1.0] * 5 + [0.0] * 19
    assert bootstrap_mean(values, seed=3) == bootstrap_mean(values, seed=3)
    assert _pct(bootstrap_mean(values)) == (8.3, 37.5)  # the percentile bootstrap the issue measured
    assert bootstrap_mean([1.0] * 20) == Interval(1.0, 1.0)
    graded = bootstrap_mean([0.0, 0.5, 1.0, 0.5, 0.5, 1.0], resamples=2000, seed=1)
    assert graded is not None and 0.2 < graded.low < 7 / 12 < graded.high <= 1.0


def test_newcombe_difference_contains_the_difference() -> None:
    iv = newcombe_difference(56, 70, 48, 80)  # Newcombe (1998b), example (a): 0.0524 to 0.3339
    assert iv is not None and (round(iv.low, 4), round(iv.high, 4)) == (0.0524, 0.3339)
