"""Tier and cloze report figures, rendered off-screen (Agg) to PNG bytes so callers can write them atomically.

We build ``Figure`` objects directly instead of using pyplot: no global backend state, no GUI, safe
in worker processes and threads.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from punchline.data.puns.schemas import ClozeReport, PunEntry
from punchline.data.puns.tiers import (
    BALANCED_MIN_BALANCE,
    FUNNY_DOMINATED_MIN_P_FUNNY,
    LEANING_MIN_BALANCE,
    MIN_P_FUNNY,
    mean_model_funny_rate,
    tier_counts,
)

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


TIER_COLORS = {
    "balanced": "#7B61C9",
    "leaning": "#E8A33D",
    "funny_dominated": COLORS["funny"],
    "straight_dominated": COLORS["straight"],
}


def plot_tiers(puns: Sequence[PunEntry]) -> bytes:
    """Where each ranked joke falls among the tier thresholds, and how often each model puns.

    Left: balance against p_funny, one dot per joke coloured by tier, with the thresholds drawn, so a
    reader sees how close to a boundary the jokes sit (and how a change of threshold would move them).
    Right: each model's funny rate averaged over the jokes, the size effect the cloze tests build on.
    """
    ranked = [j for j in puns if isinstance(j.cloze_tier, str)]
    counts = tier_counts(ranked)
    fig = Figure(figsize=(11.0, 4.5))
    scatter, bars = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    for tier, color in TIER_COLORS.items():
        members = [j for j in ranked if j.cloze_tier == tier]
        scatter.scatter(
            [float(j.cloze_p_funny or 0) for j in members],
            [float(j.cloze_balance or 0) for j in members],
            s=18,
            alpha=0.75,
            color=color,
            label=f"{tier.replace('_', ' ')} ({counts[tier]})",
        )
    for y in (BALANCED_MIN_BALANCE, LEANING_MIN_BALANCE):
        scatter.axhline(y, color="#666666", linewidth=0.8, linestyle="--")
    for x in (MIN_P_FUNNY, FUNNY_DOMINATED_MIN_P_FUNNY):
        scatter.axvline(x, color="#666666", linewidth=0.8, linestyle=":")
    scatter.set_xlim(-0.02, 1.02)
    scatter.set_ylim(-0.02, 1.02)
    scatter.set_xlabel("P(funny) over all samples")
    scatter.set_ylabel("balance = min(P(straight), P(funny)) / max")
    scatter.set_title(f"Tiers of {len(ranked)} jokes")
    scatter.legend(fontsize=8, loc="upper right")

    by_model = mean_model_funny_rate(ranked)
    models = list(by_model)
    means = [100 * by_model[m] for m in models]
    bars.bar(range(len(models)), means, color=COLORS["funny"])
    for i, v in enumerate(means):
        bars.annotate(f"{v:.1f}%", (i, v), ha="center", va="bottom", fontsize=8)
    bars.set_xticks(range(len(models)))
    bars.set_xticklabels(models, rotation=30 if len(models) > 4 else 0)
    bars.set_ylabel("% of samples that are the pun")
    bars.set_ylim(0, max([*means, 1.0]) * 1.2)
    bars.set_title("Funny rate per model (mean over jokes)")
    return _png(fig)
