"""The funny-rate shift's interval, as the cloze report's table and its figure both show it.

The intervals themselves are :mod:`punchline.data.metrics.intervals`' (Wilson's for each rate; Newcombe's hybrid
score interval for the shift, a difference of two independent rates: the two contexts are different tests).
Here is only what the two readers share: the shift and its interval as printed, ``n/a`` when a context has no
answer (its rate, and so the shift, undefined).
"""

from __future__ import annotations

from punchline.data.metrics.intervals import Interval, newcombe_difference
from punchline.data.metrics.tables import NA
from punchline.pipelines.puns.data.schemas import ModelSummary


def shift_interval(m: ModelSummary) -> Interval | None:
    """Newcombe's interval of a model's funny-rate shift (funny minus straight context); None when either context
    has no answer."""
    return newcombe_difference(m.funny.funny, m.funny.n, m.straight.funny, m.straight.n)


def shift_shown(m: ModelSummary) -> tuple[str, str]:
    """The shift in points and its interval as the table prints them (``+38.0``, ``[+20.6, +52.1]``)."""
    iv = shift_interval(m)
    if iv is None:
        return NA, NA
    return f"{m.delta_funny_pp:+.1f}", f"[{iv.low * 100:+.1f}, {iv.high * 100:+.1f}]"
