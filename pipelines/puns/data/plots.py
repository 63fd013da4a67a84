"""Tier and cloze report figures, rendered off-screen to PNG (200 dpi), PDF and SVG bytes.

We build ``Figure`` objects directly instead of using pyplot: no global backend state, no GUI, safe in worker
processes and threads. What a reviewer asks of a figure, and how these meet it:

* every rate carries its 95 % Wilson score interval (:mod:`punchline.data.metrics.intervals`), said on the
figure;
* a rate of 0 is drawn (a marker on the zero line and its interval), never an invisible bar; a rate over no
  answers is undefined and written ``n/a`` at its place, never drawn as a 0;
* titles name the metric (the models are the axis' labels);
* legends sit outside the axes, below them, so they cover no data;
* numbers are printed as ``report.md`` prints them (``52.0%``, ``+38.0 pp``);
* colours are the Okabe-Ito palette (distinguishable with every common colour-vision deficiency), with hatching
  as a second cue, so the figures also survive greyscale printing;
* the bytes are the same on every run: no creation date (PDF ``CreationDate``, SVG ``Date``), no software
  version (PNG ``Software``, PDF ``Producer``), a fixed SVG id salt, fonts embedded the same way each time
  (:func:`punchline.data.metrics.plots.render`, which every figure of punchline goes through).
"""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from punchline.data.figures.drawing import DRAWING
from punchline.data.metrics import plots as metric_plots
from punchline.data.metrics.intervals import wilson
from punchline.data.metrics.plots import Format
from punchline.data.metrics.tables import NA
from punchline.pipelines.puns.data.intervals import shift_shown
from punchline.pipelines.puns.data.schemas import ClozeReport, ContextSummary, PunEntry
from punchline.pipelines.puns.data.tiers import (
    BALANCED_MIN_BALANCE,
    FUNNY_DOMINATED_MIN_P_FUNNY,
    LEANING_MIN_BALANCE,
    MIN_P_FUNNY,
    mean_model_funny_rate,
    tier_counts,
)

FORMATS: tuple[Format, ...] = ("png", "pdf", "svg")
DPI = 200

# Okabe & Ito (2008), "Color Universal Design": blue, vermillion, grey; orange and reddish purple for the tiers
OKABE_ITO = {
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "orange": "#E69F00",
    "sky_blue": "#56B4E9",
    "bluish_green": "#009E73",
    "reddish_purple": "#CC79A7",
    "grey": "#999999",
    "black": "#000000",
}
COLORS = {"straight": OKABE_ITO["blue"], "funny": OKABE_ITO["vermillion"], "other": OKABE_ITO["grey"]}
HATCHES = {"straight": "", "funny": "//", "other": ".."}
INTERVAL_NOTE = "Error bars: 95 % Wilson score intervals"

_RC = {"hatch.linewidth": 0.6}  # beside the settings every figure of punchline is drawn with


def render(fig: Figure, fmt: Format) -> bytes:
    """The figure's bytes in ``fmt``, the same on every run."""
    FigureCanvasAgg(fig)
    return metric_plots.render(fig, fmt, dpi=DPI, rc=_RC)


def render_all(fig: Figure) -> dict[Format, bytes]:
    return {fmt: render(fig, fmt) for fmt in FORMATS}


def pct(rate: float) -> str:
    """A rate as ``report.md`` prints it."""
    return f"{rate * 100:.1f}%"


def _count(summary: ContextSummary, cls: str) -> int:
    return int(getattr(summary, cls))


def _bars_with_intervals(
    ax: Axes, xs: list[float], counts: list[int], ns: list[int], width: float, cls: str, label: str
) -> list[tuple[float, float] | None]:
    """Bars of ``counts / ns`` (in %) with their Wilson intervals, returned in %; a zero is a marker on the zero
    line; a rate over no answers is undefined: ``n/a`` at its place, its interval ``None``."""
    bounds: list[tuple[float, float] | None] = []
    for k, n in zip(counts, ns, strict=True):
        iv = wilson(k, n)
        bounds.append(None if iv is None else (100 * iv.low, 100 * iv.high))
    known = [(x, 100 * k / n, b) for x, k, n, b in zip(xs, counts, ns, bounds, strict=True) if b is not None]
    for x, b in zip(xs, bounds, strict=True):
        if b is None:
            ax.text(x, 1.0, NA, ha="center", va="bottom", fontsize=7, color=COLORS[cls], rotation=90)
    at, rates = [x for x, _, _ in known], [r for _, r, _ in known]
    lower = [max(0.0, r - b[0]) for _, r, b in known]  # 0 - 0.0 may be -1e-15
    upper = [max(0.0, b[1] - r) for _, r, b in known]
    ax.bar(at, rates, width, label=label, color=COLORS[cls], hatch=HATCHES[cls], edgecolor="black", linewidth=0.6)
    zeros = [x for x, r in zip(at, rates, strict=True) if r == 0]
    if zeros:  # an empty bar would vanish into the axis: mark it, in the series' colour
        ax.plot(zeros, [0.0] * len(zeros), linestyle="none", marker="D", markersize=4.5, color=COLORS[cls],
                markeredgecolor="black", markeredgewidth=0.6, clip_on=False, zorder=4)  # fmt: skip
    ax.errorbar(at, rates, yerr=[lower, upper], fmt="none", ecolor="black", elinewidth=0.8, capsize=2.5, zorder=3)
    return bounds


def _n_note(ns: list[int]) -> str:
    distinct = sorted(set(ns))
    return f"n = {distinct[0]} answers per bar" if len(distinct) == 1 else f"n = {distinct[0]}-{distinct[-1]} per bar"


def figure_context_effect(report: ClozeReport) -> Figure:
    """Share of straight / funny / other answers per model, one panel per priming context, with intervals."""
    models = list(report.models)
    fig = Figure(figsize=(max(7.0, 1.5 * len(models) * 2), 4.6))
    axes = fig.subplots(1, 2, sharey=True)
    width = 0.26
    ns: list[int] = []
    for ax, ctx in zip(axes, ("straight", "funny"), strict=True):
        summaries = [getattr(report.models[m], ctx) for m in models]
        ns += [s.n for s in summaries]
        for offset, cls in zip((-width, 0.0, width), ("straight", "funny", "other"), strict=True):
            xs = [i + offset for i in range(len(models))]
            counts = [_count(s, cls) for s in summaries]
            _bars_with_intervals(ax, xs, counts, [s.n for s in summaries], width, cls, cls.capitalize())
        ax.set_title(f"{ctx.capitalize()}-primed context")
        ax.set_xticks(range(len(models)))
        ax.set_xticklabels(models)
        ax.set_ylim(0, 105)
        ax.grid(axis="y", color="#DDDDDD", linewidth=0.6)
        ax.set_axisbelow(True)
    axes[0].set_ylabel("% of answers")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=3, frameon=False,
               title=f"Answer class  ·  {INTERVAL_NOTE}, {_n_note(ns)}")  # fmt: skip
    fig.suptitle("Share of answers by class (straight / funny / other) and priming context, per model")
    fig.tight_layout()
    return fig


def figure_funny_shift(report: ClozeReport) -> Figure:
    """Funny-answer rate in each context with intervals, annotated with the shift (pp) as the table gives it."""
    models = list(report.models)
    fig = Figure(figsize=(max(6.0, 1.5 * len(models)), 4.8))
    ax = fig.subplots()
    width = 0.36
    tops = [0.0] * len(models)
    ns: list[int] = []
    for offset, ctx, cls in ((-width / 2, "straight", "straight"), (width / 2, "funny", "funny")):
        summaries = [getattr(report.models[m], ctx) for m in models]
        ns += [s.n for s in summaries]
        xs = [i + offset for i in range(len(models))]
        counts = [s.funny for s in summaries]
        bounds = _bars_with_intervals(
            ax, xs, counts, [s.n for s in summaries], width, cls, f"{ctx.capitalize()} context"
        )
        for i, (x, s, bound) in enumerate(zip(xs, summaries, bounds, strict=True)):
            if bound is None:  # undefined: written n/a by the bars
                continue
            ax.annotate(pct(s.p_funny), xy=(x, bound[1]), xytext=(0, 2), textcoords="offset points", ha="center",
                        va="bottom", fontsize=7.5)  # fmt: skip
            tops[i] = max(tops[i], bound[1])
    for i, m in enumerate(models):
        delta, interval = shift_shown(report.models[m])
        text = f"{delta} pp\n{interval}" if interval != NA else f"shift {NA}"
        ax.annotate(text, xy=(i, tops[i]), xytext=(0, 14), textcoords="offset points", ha="center", va="bottom",
                    fontsize=8, fontweight="bold", linespacing=1.1)  # fmt: skip
    ax.set_xticks(range(len(models)))
    ax.set_xticklabels(models)
    ax.set_ylabel("Funny answer rate (%)")
    ax.set_ylim(0, min(100.0, max([*tops, 1.0])) + 30)
    ax.grid(axis="y", color="#DDDDDD", linewidth=0.6)
    ax.set_axisbelow(True)
    ax.set_title("Funny-answer rate by priming context, per model (shift: funny minus straight context)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.09), ncol=2, frameon=False,
              title=f"{INTERVAL_NOTE}, {_n_note(ns)}; shift interval: Newcombe")  # fmt: skip
    fig.tight_layout()
    return fig


def plot_context_effect(report: ClozeReport, fmt: Format = "png") -> bytes:
    with DRAWING:
        return render(figure_context_effect(report), fmt)


def plot_funny_shift(report: ClozeReport, fmt: Format = "png") -> bytes:
    with DRAWING:
        return render(figure_funny_shift(report), fmt)


TIER_COLORS = {
    "balanced": OKABE_ITO["reddish_purple"],
    "leaning": OKABE_ITO["orange"],
    "funny_dominated": COLORS["funny"],
    "straight_dominated": COLORS["straight"],
}
TIER_MARKERS = {"balanced": "o", "leaning": "s", "funny_dominated": "^", "straight_dominated": "v"}


def figure_tiers(puns: Sequence[PunEntry]) -> Figure:
    """Where each ranked joke falls among the tier thresholds, and how often each model puns.

    Left: balance against p_funny, one dot per joke coloured (and shaped) by tier, with the thresholds drawn, so
    a reader sees how close to a boundary the jokes sit. Right: each model's funny rate averaged over the jokes,
    the size effect the cloze tests build on (a mean of per-joke rates, so no binomial interval is drawn).
    """
    ranked = [j for j in puns if isinstance(j.cloze_tier, str)]
    counts = tier_counts(ranked)
    fig = Figure(figsize=(11.0, 4.8))
    scatter, bars = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    for tier, color in TIER_COLORS.items():
        members = [j for j in ranked if j.cloze_tier == tier]
        scatter.scatter(
            [float(j.cloze_p_funny or 0) for j in members],
            [float(j.cloze_balance or 0) for j in members],
            s=18,
            alpha=0.8,
            color=color,
            marker=TIER_MARKERS[tier],
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
    scatter.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=4, frameon=False)

    by_model = mean_model_funny_rate(ranked)
    models = list(by_model)
    means = [100 * by_model[m] for m in models]
    bars.bar(range(len(models)), means, color=COLORS["funny"], hatch=HATCHES["funny"], edgecolor="black", linewidth=0.6)
    for i, v in enumerate(means):
        bars.annotate(f"{v:.1f}%", (i, v), ha="center", va="bottom", fontsize=8)
    bars.set_xticks(range(len(models)))
    bars.set_xticklabels(models, rotation=30 if len(models) > 4 else 0)
    bars.set_ylabel("% of samples that are the pun")
    bars.set_ylim(0, max([*means, 1.0]) * 1.2)
    bars.set_title("Funny rate per model (mean over jokes)")
    fig.tight_layout()
    return fig


def plot_tiers(puns: Sequence[PunEntry], fmt: Format = "png") -> bytes:
    with DRAWING:
        return render(figure_tiers(puns), fmt)
