"""Per-model estimates from a stage's rows, and how a report shows them.

A plug-in's reduce has rows (one per item x model x sample); what it reports is, per model, a score with its
interval, and the models compared on the same items. Three steps, each a pure function:

* :func:`outcomes`: rows -> model -> item -> outcome (a bool or a number; a row whose outcome is ``None`` is
  left out: undefined for that row, not wrong);
* :func:`per_model`: -> model -> :class:`Estimate` (a rate with its Wilson, or Clopper-Pearson, interval when
  every outcome is right/wrong; otherwise a mean with its seeded bootstrap interval);
* :func:`estimate_rows` / :func:`comparison_rows`: -> rows for a CSV (``write_csv``) or :func:`markdown_table`,
  undefined values written ``n/a``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, Literal

import msgspec

from punchline.data.metrics.intervals import Interval, bootstrap_mean, clopper_pearson, ratio, wilson
from punchline.data.metrics.paired import PairedComparison, is_binary

NA = "n/a"  # how an undefined value (0/0) is shown: never "0.0"
Method = Literal["wilson", "clopper-pearson", "bootstrap"]


class Estimate(msgspec.Struct, frozen=True, kw_only=True):
    """A score over ``n`` outcomes with its interval. ``value`` ``None``: undefined (no outcome). A rate keeps
    its ``successes``; a mean has ``successes = None``. ``method`` names the interval."""

    value: float | None
    interval: Interval | None
    n: int
    successes: int | None = None
    method: Method
    level: float = 0.95


def proportion(successes: int, n: int, *, method: Method = "wilson", level: float = 0.95) -> Estimate:
    """``successes / n`` with its Wilson (default) or Clopper-Pearson interval; undefined when ``n`` is 0."""
    if method == "bootstrap":
        raise ValueError("a proportion's interval is wilson or clopper-pearson; a mean's is the bootstrap")
    find = wilson if method == "wilson" else clopper_pearson
    return Estimate(
        value=ratio(successes, n),
        interval=find(successes, n, level=level),
        n=n,
        successes=successes,
        method=method,
        level=level,
    )


def mean(values: Sequence[float], *, resamples: int = 1000, seed: int = 0, level: float = 0.95) -> Estimate:
    """The mean of ``values`` with its seeded percentile bootstrap interval; undefined when there are none."""
    n = len(values)
    return Estimate(
        value=sum(values) / n if n else None,
        interval=bootstrap_mean(values, resamples=resamples, seed=seed, level=level),
        n=n,
        method="bootstrap",
        level=level,
    )


def estimate(values: Sequence[float], *, method: Method = "wilson", resamples: int = 1000, seed: int = 0) -> Estimate:
    """A rate (:func:`proportion`, with ``method``) when every value is 0 or 1, else a :func:`mean`."""
    if method != "bootstrap" and is_binary(values):
        return proportion(int(sum(values)), len(values), method=method)
    return mean(values, resamples=resamples, seed=seed)


def outcomes(
    rows: Iterable[Mapping[str, Any]],
    outcome: Callable[[Mapping[str, Any]], float | None],
    *,
    model: str = "model",
    item: Sequence[str] = ("id", "sample"),
) -> dict[str, dict[Hashable, float]]:
    """model -> item -> outcome, in the rows' order. ``item``: the columns naming an item (what two models are
    paired on: a question and its sample, by default); a row whose ``outcome`` is ``None`` is left out."""
    out: dict[str, dict[Hashable, float]] = {}
    for row in rows:
        value = outcome(row)
        if value is not None:
            out.setdefault(str(row[model]), {})[tuple(row.get(c) for c in item)] = float(value)
    return out


def per_model(
    by_model: Mapping[str, Mapping[Hashable, float]], *, method: Method = "wilson", resamples: int = 1000, seed: int = 0
) -> dict[str, Estimate]:
    """Each model's :func:`estimate` over its outcomes."""
    return {
        m: estimate(list(values.values()), method=method, resamples=resamples, seed=seed)
        for m, values in by_model.items()
    }


def pct(value: float | None, digits: int = 1) -> str:
    """A rate in percent (``"41.7"``), or ``"n/a"`` when undefined."""
    return NA if value is None else f"{100 * value:.{digits}f}"


def shown(e: Estimate | None, *, percent: bool = True) -> str:
    """``"41.7 % [22.1, 61.3]"`` (or ``"0.417 [0.221, 0.613]"`` with ``percent=False``); ``"n/a"`` when undefined."""
    if e is None or e.value is None:
        return NA
    if not percent:
        iv = e.interval
        return f"{e.value:.3f}" + (f" [{iv.low:.3f}, {iv.high:.3f}]" if iv is not None else "")
    iv = e.interval
    return f"{pct(e.value)} %" + (f" [{pct(iv.low)}, {pct(iv.high)}]" if iv is not None else "")


def _cell(x: float | None) -> float | str:
    return NA if x is None else round(x, 6)


def estimate_rows(tables: Mapping[str, Mapping[str, Estimate]]) -> list[dict[str, Any]]:
    """One row per model: each metric (metric -> model -> estimate) with its ``_low``, ``_high`` and ``_n`` (the
    outcomes it is over), rounded to 6 digits; undefined cells ``n/a``."""
    rows: dict[str, dict[str, Any]] = {}
    for metric, by_model in tables.items():
        for m, e in by_model.items():
            row = rows.setdefault(m, {"model": m})
            iv = e.interval
            row[metric] = _cell(e.value)
            row[f"{metric}_low"] = _cell(iv.low if iv else None)
            row[f"{metric}_high"] = _cell(iv.high if iv else None)
            row[f"{metric}_n"] = e.n
    return list(rows.values())


def comparison_rows(comparisons: Mapping[str, Sequence[PairedComparison]]) -> list[dict[str, Any]]:
    """One row per metric and pair of models (metric -> comparisons): the items shared, both means, the
    difference with its paired bootstrap interval, and McNemar's p-values for right/wrong outcomes."""
    rows = []
    for metric, pairs in comparisons.items():
        for c in pairs:
            iv, test = c.interval, c.test
            rows.append(
                {
                    "metric": metric,
                    "a": c.a,
                    "b": c.b,
                    "items": c.n,
                    "mean_a": _cell(c.mean_a),
                    "mean_b": _cell(c.mean_b),
                    "difference": _cell(c.difference),
                    "difference_low": _cell(iv.low if iv else None),
                    "difference_high": _cell(iv.high if iv else None),
                    "only_a": test.only_a if test else NA,
                    "only_b": test.only_b if test else NA,
                    "mcnemar_p_exact": _cell(test.p_exact) if test else NA,
                    "mcnemar_p_mid": _cell(test.p_mid) if test else NA,
                }
            )
    return rows


def markdown_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """``rows`` as a Markdown table (columns in first-seen order, missing cells empty)."""
    columns = list(dict.fromkeys(c for row in rows for c in row))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"
