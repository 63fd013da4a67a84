"""Confidence intervals for the rates the cloze report shows (a rate is a count out of n answers).

Wilson's score interval rather than the normal approximation: with n = 15-50 answers per cell and rates at 0 % or
near it, the normal interval collapses to a point (0 ± 0) or leaves [0, 1]; Wilson's stays inside and is
honest about how little a 0/15 says (its upper end is about 20 %). The funny-rate shift is a difference of two
independent rates; its interval is Newcombe's hybrid score interval (method 10 of Newcombe 1998), built from
the two Wilson intervals.
"""

from __future__ import annotations

import math

Z95 = 1.959963984540054  # the standard normal's 97.5th percentile: two-sided 95 %


def wilson_interval(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of ``k`` successes out of ``n`` (``(0, 1)`` when ``n`` is 0: nothing known)."""
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def newcombe_difference(k1: int, n1: int, k2: int, n2: int, z: float = Z95) -> tuple[float, float]:
    """Newcombe's hybrid score interval of ``k1/n1 - k2/n2`` (two independent rates)."""
    p1 = k1 / n1 if n1 else 0.0
    p2 = k2 / n2 if n2 else 0.0
    l1, u1 = wilson_interval(k1, n1, z)
    l2, u2 = wilson_interval(k2, n2, z)
    d = p1 - p2
    return d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2), d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)
