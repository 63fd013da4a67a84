"""Intervals of a rate (k successes out of n) and of a mean, all two-sided at ``level`` (95 % by default).

Why these:

* :func:`wilson` for a rate: with tens of items and rates near 0 or 1 the normal approximation collapses to a
  point or leaves [0, 1]; Wilson's score interval stays inside and has close to its nominal coverage (Brown, Cai &
  DasGupta 2001). 5/24 gives [9.2 %, 40.5 %].
* :func:`clopper_pearson` when a guarantee is wanted: the exact binomial interval, never below its nominal
  coverage (so wider than Wilson's).
* :func:`bootstrap_mean` for a mean of anything else (a 0/0.5/1 judge score, an F1): the percentile bootstrap,
  seeded, so a report is the same bytes on every run. It is not used for a rate: at small n it is too narrow
  (5/24: [8.3 %, 37.5 %]).
* :func:`newcombe_difference` for a difference of two *independent* rates (two contexts, two item sets); two
  models on the *same* items are :mod:`.paired`'s.

``None`` is the answer when there is nothing to know (no items): an undefined interval, never ``[0, 0]``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

import msgspec

Z95 = 1.959963984540054  # the standard normal's 97.5th percentile: two-sided 95 %
BISECTIONS = 64  # halvings of [0, 1] for an exact bound: far below a float's resolution of a percentage


class Interval(msgspec.Struct, frozen=True):
    """A two-sided interval: ``low <= high``, both in the estimate's own unit (a rate: 0..1)."""

    low: float
    high: float


def ratio(k: float, n: float) -> float | None:
    """``k / n``, or ``None`` (undefined) when ``n`` is 0: a precision of a class never predicted is not 0."""
    return k / n if n else None


def _z(level: float) -> float:
    """The normal quantile of a two-sided ``level`` (1.96 for 0.95)."""
    if level == 0.95:
        return Z95
    return math.sqrt(2.0) * _erfinv(level)


def _erfinv(y: float) -> float:
    """The inverse error function, by bisection on :func:`math.erf` (only for a level other than 95 %)."""
    lo, hi = 0.0, 10.0
    for _ in range(BISECTIONS):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if math.erf(mid) < y else (lo, mid)
    return (lo + hi) / 2


def wilson(k: int, n: int, *, level: float = 0.95) -> Interval | None:
    """Wilson's score interval of ``k`` successes out of ``n`` (``None`` when ``n`` is 0)."""
    if n <= 0:
        return None
    z = _z(level)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return Interval(max(0.0, centre - half), min(1.0, centre + half))


def _log_pmf(i: int, n: int, p: float) -> float:
    return math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * math.log(p) + (n - i) * math.log1p(-p)


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p), summed in log space (exact to a float's precision)."""
    if k < 0:
        return 0.0
    if k >= n or p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    return min(1.0, sum(math.exp(_log_pmf(i, n, p)) for i in range(k + 1)))


def _bisect(f: Callable[[float], float], target: float, increasing: bool) -> float:
    """The p in [0, 1] where the monotone ``f(p)`` crosses ``target``."""
    lo, hi = 0.0, 1.0
    for _ in range(BISECTIONS):
        mid = (lo + hi) / 2
        below = f(mid) < target
        lo, hi = (mid, hi) if below == increasing else (lo, mid)
    return (lo + hi) / 2


def clopper_pearson(k: int, n: int, *, level: float = 0.95) -> Interval | None:
    """The Clopper-Pearson (exact binomial) interval of ``k`` out of ``n`` (``None`` when ``n`` is 0).

    Its ends are where a binomial tail equals ``(1 - level) / 2``: the low end is the p at which seeing ``k`` or
    more is that unlikely, the high end the p at which seeing ``k`` or fewer is."""
    if n <= 0:
        return None
    alpha = (1 - level) / 2
    low = 0.0 if k <= 0 else _bisect(lambda p: 1.0 - binomial_cdf(k - 1, n, p), alpha, increasing=True)
    high = 1.0 if k >= n else _bisect(lambda p: binomial_cdf(k, n, p), alpha, increasing=False)
    return Interval(low, high)


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of already sorted values, interpolating linearly between closest ranks (numpy's
    default)."""
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def bootstrap_mean(
    values: Sequence[float], *, resamples: int = 1000, seed: int = 0, level: float = 0.95
) -> Interval | None:
    """The percentile bootstrap interval of the mean of ``values`` (``None`` when there are none).

    Seeded (:class:`random.Random`), so the same values give the same interval on every run and machine."""
    n = len(values)
    if n == 0 or resamples <= 0:
        return None
    rng = random.Random(seed)
    means = sorted(sum(rng.choices(values, k=n)) / n for _ in range(resamples))
    tail = (1 - level) / 2
    return Interval(quantile(means, tail), quantile(means, 1 - tail))


def newcombe_difference(k1: int, n1: int, k2: int, n2: int, *, level: float = 0.95) -> Interval | None:
    """Newcombe's hybrid score interval of ``k1/n1 - k2/n2``, two independent rates (method 10 of Newcombe
    1998, built from the two Wilson intervals); ``None`` when either rate is undefined."""
    w1, w2 = wilson(k1, n1, level=level), wilson(k2, n2, level=level)
    if w1 is None or w2 is None:
        return None
    p1, p2 = k1 / n1, k2 / n2
    d = p1 - p2
    return Interval(
        d - math.sqrt((p1 - w1.low) ** 2 + (w2.high - p2) ** 2),
        d + math.sqrt((w1.high - p1) ** 2 + (p2 - w2.low) ** 2),
    )
