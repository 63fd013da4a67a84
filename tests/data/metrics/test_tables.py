"""Per-model estimates from rows, and undefined values shown as n/a (never 0.0)."""

from __future__ import annotations

import pytest

from punchline.data.metrics.paired import compare_models
from punchline.data.metrics.tables import (
    NA,
    comparison_rows,
    estimate,
    estimate_rows,
    markdown_table,
    mean,
    outcomes,
    per_model,
    proportion,
    shown,
)

ROWS = [
    {"model": "small", "id": 1, "sample": 0, "ok": True},
    {"model": "small", "id": 2, "sample": 0, "ok": False},
    {"model": "small", "id": 3, "sample": 0, "ok": None},  # no verdict: left out, not counted wrong
    {"model": "large", "id": 1, "sample": 0, "ok": True},
    {"model": "large", "id": 2, "sample": 0, "ok": True},
    {"model": "large", "id": 3, "sample": 0, "ok": True},
]


def test_outcomes_group_by_model_and_item_and_skip_undefined() -> None:
    got = outcomes(ROWS, lambda r: r["ok"])
    assert got == {"small": {(1, 0): 1.0, (2, 0): 0.0}, "large": {(1, 0): 1.0, (2, 0): 1.0, (3, 0): 1.0}}


def test_per_model_gives_rates_with_wilson_and_means_with_the_bootstrap() -> None:
    table = per_model(outcomes(ROWS, lambda r: r["ok"]))
    assert table["small"] == proportion(1, 2) and table["small"].method == "wilson"
    assert table["large"].value == 1.0 and table["large"].successes == 3
    assert per_model({"m": {1: 1.0, 2: 0.0}}, method="clopper-pearson")["m"].method == "clopper-pearson"
    graded = estimate([0.0, 0.5, 1.0])
    assert graded.method == "bootstrap" and graded.successes is None and graded.value == pytest.approx(0.5)
    assert estimate([0.0, 1.0], method="bootstrap").method == "bootstrap"
    with pytest.raises(ValueError):
        proportion(1, 2, method="bootstrap")


def test_undefined_is_shown_na() -> None:
    assert proportion(0, 0).value is None and shown(proportion(0, 0)) == NA and shown(mean([])) == NA
    assert shown(proportion(5, 24)) == "20.8 % [9.2, 40.5]"
    assert shown(mean([0.5, 0.5]), percent=False) == "0.500 [0.500, 0.500]"
    rows = estimate_rows({"exact": {"a": proportion(5, 24), "b": proportion(0, 0)}})
    assert rows == [
        {"model": "a", "exact": 0.208333, "exact_low": 0.092448, "exact_high": 0.404705, "exact_n": 24},
        {"model": "b", "exact": NA, "exact_low": NA, "exact_high": NA, "exact_n": 0},
    ]
    assert "| b | n/a | n/a | n/a | 0 |" in markdown_table(rows)


def test_comparison_rows() -> None:
    pairs = compare_models({"a": {1: 1.0, 2: 1.0, 3: 0.0}, "b": {1: 0.0, 2: 1.0, 3: 0.0}}, resamples=100)
    (row,) = comparison_rows({"exact": pairs})
    assert (row["metric"], row["a"], row["b"], row["items"], row["only_a"], row["only_b"]) == (
        "exact",
        "a",
        "b",
        3,
        1,
        0,
    )
    assert row["mcnemar_p_exact"] == 1.0 and row["mcnemar_p_mid"] == 0.5
    graded = compare_models({"a": {1: 0.5}, "b": {1: 0.0}})
    assert comparison_rows({"judge": graded})[0]["mcnemar_p_mid"] == NA
