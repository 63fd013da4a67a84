"""Two models compared on the same items: is the difference more than the items' noise?

Scores of two models on the same items are not independent (an easy item is easy for both), so comparing their
two intervals, or Newcombe's interval for independent rates, overstates the noise. What is compared instead is
each item's pair of outcomes:

* right/wrong outcomes: McNemar's test, which reads only the discordant items (right for one model, wrong for
  the other). The exact conditional p-value is conservative at small counts; the mid-p value keeps close to its
  nominal level and is what Fagerland, Lydersen & Laake (2013) recommend. For b = 1, c = 7: exact 0.070, mid-p
  0.039.
* any outcome (a 0/0.5/1 judge score, a latency): the paired bootstrap: items drawn with replacement, each
  bringing both models' outcomes, so the interval of the mean difference keeps the pairing. Seeded.

The difference's interval is the paired bootstrap's in both cases, so a binary and a graded metric read alike.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence

import msgspec

from punchline.data.metrics.intervals import Interval, bootstrap_mean


class McNemar(msgspec.Struct, frozen=True):
    """McNemar's test of ``only_a`` items right for model a alone against ``only_b`` right for b alone."""

    only_a: int
    only_b: int
    p_exact: float  # two-sided exact conditional (binomial) p-value
    p_mid: float  # two-sided mid-p value


def mcnemar(only_a: int, only_b: int) -> McNemar:
    """McNemar's exact and mid-p tests: under no difference, each discordant item is a fair coin's toss."""
    n = only_a + only_b
    m = min(only_a, only_b)
    if n == 0:
        return McNemar(only_a, only_b, 1.0, 1.0)
    half = n * math.log(2.0)  # in log space: 2**n overflows a float past 1023 items
    pmf = [math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) - half) for i in range(m + 1)]
    tail = sum(pmf)
    return McNemar(only_a, only_b, min(1.0, 2 * tail), min(1.0, 2 * tail - pmf[m]))


class PairedComparison(msgspec.Struct, frozen=True, kw_only=True):
    """Model ``a`` against model ``b`` on the ``n`` items both have an outcome for.

    ``difference`` is ``mean_a - mean_b`` with its paired bootstrap ``interval``; ``test`` is McNemar's when every
    outcome is 0 or 1 (``both``/``neither``: the concordant items), ``None`` otherwise. Any of the means is
    ``None`` (undefined) when no item is shared."""

    a: str
    b: str
    n: int
    mean_a: float | None
    mean_b: float | None
    difference: float | None
    interval: Interval | None
    test: McNemar | None = None
    both: int | None = None
    neither: int | None = None
    resamples: int
    seed: int


def is_binary(values: Sequence[float]) -> bool:
    """Every value is 0 or 1 (``True``/``False`` included): a right/wrong outcome."""
    return all(v in (0, 1) for v in values)


def paired_bootstrap(
    a: Sequence[float], b: Sequence[float], *, resamples: int = 1000, seed: int = 0, level: float = 0.95
) -> Interval | None:
    """The percentile bootstrap interval of ``mean(a) - mean(b)`` over paired items (``a[i]`` with ``b[i]``)."""
    if len(a) != len(b):
        raise ValueError(f"paired outcomes of unequal length: {len(a)} and {len(b)}")
    return bootstrap_mean([x - y for x, y in zip(a, b, strict=True)], resamples=resamples, seed=seed, level=level)


def compare(
    a_name: str,
    a: Mapping[Hashable, float],
    b_name: str,
    b: Mapping[Hashable, float],
    *,
    resamples: int = 1000,
    seed: int = 0,
) -> PairedComparison:
    """Compare two models' outcomes (item -> outcome) on the items both have, in ``a``'s item order."""
    shared = [item for item in a if item in b]
    xs, ys = [float(a[i]) for i in shared], [float(b[i]) for i in shared]
    n = len(shared)
    mean_a, mean_b = (sum(xs) / n, sum(ys) / n) if n else (None, None)
    binary = n > 0 and is_binary(xs) and is_binary(ys)
    only_a = sum(1 for x, y in zip(xs, ys, strict=True) if x > y)
    only_b = sum(1 for x, y in zip(xs, ys, strict=True) if y > x)
    both = sum(1 for x, y in zip(xs, ys, strict=True) if x == y == 1)
    return PairedComparison(
        a=a_name,
        b=b_name,
        n=n,
        mean_a=mean_a,
        mean_b=mean_b,
        difference=None if mean_a is None or mean_b is None else mean_a - mean_b,
        interval=paired_bootstrap(xs, ys, resamples=resamples, seed=seed),
        test=mcnemar(only_a, only_b) if binary else None,
        both=both if binary else None,
        neither=n - both - only_a - only_b if binary else None,
        resamples=resamples,
        seed=seed,
    )


def compare_models(
    outcomes: Mapping[str, Mapping[Hashable, float]], *, resamples: int = 1000, seed: int = 0
) -> list[PairedComparison]:
    """Every pair of models (model -> item -> outcome), in the mapping's order: the first against the second,
    and so on. Each pair has the same seed: its resamples are drawn from its own shared items."""
    models = list(outcomes)
    return [
        compare(a, outcomes[a], b, outcomes[b], resamples=resamples, seed=seed)
        for i, a in enumerate(models)
        for b in models[i + 1 :]
    ]
