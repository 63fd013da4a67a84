"""Cloze report figures, rendered off-screen (Agg) to PNG bytes so callers can write them atomically.

We build ``Figure`` objects directly instead of using pyplot: no global backend state, no GUI, safe
in worker processes and threads.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

if TYPE_CHECKING:
    from data.cloze_report import ClozeReport

COLORS = {"straight": "#4A90D9", "funny": "#E85D75", "other": "#AAAAAA"}
DPI = 120


def _png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    return buf.getvalue()


def plot_context_effect(report: ClozeReport) -> bytes:
    """Share of straight / funny / other answers per model, one panel per priming context."""
    models = list(report.models)
    fig = Figure(figsize=(max(6.0, 1.6 * len(models) * 2), 4.5))
    axes = fig.subplots(1, 2, sharey=True)
    width = 0.27
    for ax, ctx in zip(axes, ("straight", "funny"), strict=True):
        for offset, cls in zip((-width, 0.0, width), ("straight", "funny", "other"), strict=True):
            values = [getattr(getattr(report.models[m], ctx), f"p_{cls}") * 100 for m in models]
            xs = [i + offset for i in range(len(models))]
            ax.bar(xs, values, width, label=cls.capitalize(), color=COLORS[cls])
        ax.set_title(f"{ctx.capitalize()}-primed context")
        ax.set_xticks(range(len(models)))
        ax.set_xticklabels(models)
        ax.set_ylim(0, 105)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("% of answers")
    fig.suptitle("Answer class by priming context")
    return _png(fig)


def plot_funny_shift(report: ClozeReport) -> bytes:
    """Funny-answer rate in each context, annotated with the shift in percentage points."""
    models = list(report.models)
    fig = Figure(figsize=(max(5.0, 1.4 * len(models)), 4.5))
    ax = fig.subplots()
    width = 0.35
    straight = [report.models[m].straight.p_funny * 100 for m in models]
    funny = [report.models[m].funny.p_funny * 100 for m in models]
    ax.bar([i - width / 2 for i in range(len(models))], straight, width, label="Straight context",
           color=COLORS["straight"])  # fmt: skip
    ax.bar([i + width / 2 for i in range(len(models))], funny, width, label="Funny context", color=COLORS["funny"])
    for i, m in enumerate(models):
        ax.annotate(f"{report.models[m].delta_funny_pp:+.0f}pp", xy=(i, max(straight[i], funny[i]) + 2),
                    ha="center", va="bottom", fontweight="bold")  # fmt: skip
    ax.set_xticks(range(len(models)))
    ax.set_xticklabels(models)
    ax.set_ylabel("Funny answer rate (%)")
    ax.set_ylim(0, max([*funny, *straight, 0.0]) + 15)
    ax.set_title("Context effect on pun answers")
    ax.legend()
    return _png(fig)
