"""Figures of estimates with their intervals, as PNG and SVG bytes that are the same on every run.

* :func:`error_bars`: each model's score with its interval (grouped by metric when several are given); an
  undefined score is written ``n/a`` at its place, never drawn as a bar of 0;
* :func:`paired_differences`: two models on the same items: each pair's difference with its paired interval
  around a zero line, labelled with McNemar's mid-p when the outcomes are right/wrong;
* :func:`write_figure`: a figure's formats as artifacts ``<stem>.png`` and ``<stem>.svg`` through anything with a
  ``write_artifact(name, data)`` (a stage's context).

matplotlib is imported on first use (a second to import: a pipeline that draws nothing never pays it), with the
Agg canvas on a bare ``Figure`` (no pyplot state, safe in threads and workers), under the process's drawing lock
(:mod:`punchline.data.figures.drawing`). The bytes carry no date and no software version, and SVG ids use a fixed salt.
Colours are the Okabe-Ito palette, distinguishable with every common colour-vision deficiency.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

from punchline.data.figures.drawing import DRAWING, drawing
from punchline.data.metrics.paired import PairedComparison
from punchline.data.metrics.tables import NA, Estimate, pct

if TYPE_CHECKING:
    from matplotlib.figure import Figure

Format = Literal["png", "pdf", "svg"]
FORMATS: tuple[Format, ...] = ("png", "svg")  # a raster to look at, a vector to print and zoom
DPI = 150
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#E69F00", "#56B4E9", "#CC79A7", "#F0E442", "#999999")
METADATA: dict[Format, dict[str, str | None]] = {
    "png": {"Software": None},
    "pdf": {"CreationDate": None, "Producer": None, "Creator": None},
    "svg": {"Date": None, "Creator": None},
}
RC: dict[str, Any] = {"svg.hashsalt": "punchline", "svg.fonttype": "path", "pdf.fonttype": 42}


class ArtifactWriter(Protocol):
    """What a figure is written through: a stage's context (``StageContext``) is one."""

    def write_artifact(self, name: str, data: bytes) -> None: ...


def new_figure(width: float, height: float) -> Figure:
    """A bare Figure on the Agg canvas: no pyplot, no GUI backend."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: matplotlib takes a second to import
    from matplotlib.figure import Figure  # lazy: as above

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def render(fig: Figure, fmt: Format, *, dpi: int = DPI, rc: Mapping[str, Any] | None = None) -> bytes:
    """``fig`` as ``fmt`` bytes, the same on every run (``rc``: matplotlib settings beside :data:`RC`)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: as in new_figure

    if not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    buf = io.BytesIO()
    with drawing({**RC, **(rc or {})}):
        fig.savefig(buf, format=fmt, dpi=dpi, bbox_inches="tight", metadata=METADATA[fmt])
    return buf.getvalue()


def render_formats(fig: Figure, formats: Sequence[Format] = FORMATS, **kwargs: Any) -> dict[Format, bytes]:
    """``fig`` in each of ``formats`` (PNG and SVG by default)."""
    return {fmt: render(fig, fmt, **kwargs) for fmt in formats}


def write_figure(ctx: ArtifactWriter, stem: str, figure: Mapping[Format, bytes]) -> list[str]:
    """Write each format of ``figure`` as the artifact ``<stem>.<format>``; returns their names."""
    names = []
    for fmt, data in figure.items():
        ctx.write_artifact(f"{stem}.{fmt}", data)
        names.append(f"{stem}.{fmt}")
    return names


def _value(e: Estimate, scale: float) -> tuple[float, float, float] | None:
    """(value, below, above) scaled, or None when undefined."""
    if e.value is None:
        return None
    iv = e.interval
    low, high = (iv.low, iv.high) if iv is not None else (e.value, e.value)
    return scale * e.value, max(0.0, scale * (e.value - low)), max(0.0, scale * (high - e.value))


def _interval_note(estimates: Sequence[Estimate]) -> str:
    methods = sorted({e.method for e in estimates})
    level = f"{100 * estimates[0].level:g} %" if estimates else "95 %"
    names = {"wilson": "Wilson score", "clopper-pearson": "Clopper-Pearson", "bootstrap": "percentile bootstrap"}
    return f"error bars: {level} {', '.join(names[m] for m in methods)} intervals"


def error_bars(
    estimates: Mapping[str, Estimate] | Mapping[str, Mapping[str, Estimate]],
    *,
    title: str,
    ylabel: str,
    percent: bool = True,
    ylim: tuple[float, float] | None = None,
    formats: Sequence[Format] = FORMATS,
) -> dict[Format, bytes]:
    """Bars of each model's estimate with its interval: ``model -> estimate``, or ``metric -> model ->
    estimate`` for a group of bars per model (one colour a metric). ``percent``: rates shown in %, the axis
    0-100 unless ``ylim`` says otherwise. The title should name the metric; the note under the axes names the
    intervals and the n per bar."""
    with DRAWING:  # matplotlib's settings are read while the figure is built too: one figure at a time
        return render_formats(_error_bars(estimates, title, ylabel, percent, ylim), formats)


def _error_bars(
    estimates: Mapping[str, Estimate] | Mapping[str, Mapping[str, Estimate]],
    title: str,
    ylabel: str,
    percent: bool,
    ylim: tuple[float, float] | None,
) -> Figure:
    series: dict[str, Mapping[str, Estimate]] = {}
    for key, given in estimates.items():
        if isinstance(given, Estimate):  # one series: model -> estimate
            series.setdefault("", {})[key] = given  # type: ignore[index]
        else:
            series[key] = given
    models = list(dict.fromkeys(m for s in series.values() for m in s))
    scale = 100.0 if percent else 1.0
    fig = new_figure(max(4.5, 0.9 * len(models) * max(1, len(series)) + 2.0), 3.8)
    ax = fig.add_subplot()
    width = 0.8 / max(1, len(series))
    every: list[Estimate] = []
    labelled: set[str] = set()  # a series' name goes into the legend once
    for i, (name, by_model) in enumerate(series.items()):
        colour = PALETTE[i % len(PALETTE)]
        for j, m in enumerate(models):
            e = by_model.get(m)
            x = j + (i - (len(series) - 1) / 2) * width
            if e is None:
                continue
            every.append(e)
            shown = _value(e, scale)
            if shown is None:
                ax.text(x, 0, NA, ha="center", va="bottom", fontsize=8, color=colour)
                continue
            value, below, above = shown
            ax.bar(x, value, width, color=colour, edgecolor="black", linewidth=0.6,
                   label=name if name and name not in labelled else None)  # fmt: skip
            labelled.add(name)
            ax.errorbar(x, value, yerr=[[below], [above]], fmt="none", ecolor="black", elinewidth=0.8, capsize=3)
            label = f"{pct(e.value)}" if percent else f"{e.value:.3f}"
            ax.annotate(label, (x, value + above), xytext=(0, 2), textcoords="offset points", ha="center",
                        va="bottom", fontsize=7.5)  # fmt: skip
    ax.set_xticks(range(len(models)), models)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.set_ylim(*(ylim if ylim is not None else ((0, 105) if percent else ax.get_ylim())))
    ax.spines[["top", "right"]].set_visible(False)
    ns = sorted({e.n for e in every})
    n_note = f"n = {ns[0]}" if len(ns) == 1 else f"n = {ns[0]}-{ns[-1]}" if ns else "n = 0"
    if len(series) > 1:
        ax.legend(frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=min(4, len(series)),
                  title=f"{_interval_note(every)}; {n_note} per bar")  # fmt: skip
    else:
        ax.set_xlabel(f"{_interval_note(every)}; {n_note} per bar", fontsize=8)
    fig.tight_layout()
    return fig


def paired_differences(
    comparisons: Mapping[str, Sequence[PairedComparison]] | Sequence[PairedComparison],
    *,
    title: str,
    xlabel: str = "difference a − b",
    percent: bool = True,
    formats: Sequence[Format] = FORMATS,
) -> dict[Format, bytes]:
    """Each pair's difference on its shared items with the paired bootstrap interval, one row a pair (and
    metric, given ``metric -> comparisons``), around a zero line; right/wrong outcomes add McNemar's mid-p."""
    with DRAWING:  # as in error_bars
        return render_formats(_paired_differences(comparisons, title, xlabel, percent), formats)


def _paired_differences(
    comparisons: Mapping[str, Sequence[PairedComparison]] | Sequence[PairedComparison],
    title: str,
    xlabel: str,
    percent: bool,
) -> Figure:
    groups = dict(comparisons) if isinstance(comparisons, Mapping) else {"": list(comparisons)}
    rows = [(metric, c) for metric, pairs in groups.items() for c in pairs]
    scale = 100.0 if percent else 1.0
    fig = new_figure(7.0, 1.2 + 0.5 * max(1, len(rows)))
    ax = fig.add_subplot()
    labels = []
    for y, (metric, c) in enumerate(reversed(rows)):
        colour = PALETTE[list(groups).index(metric) % len(PALETTE)]
        test = f", mid-p {c.test.p_mid:.3g}" if c.test is not None else ""
        labels.append(f"{metric + ': ' if metric else ''}{c.a} − {c.b} (n = {c.n}{test})")
        if c.difference is None:
            ax.text(0, y, NA, ha="center", va="center", fontsize=8)
            continue
        iv = c.interval
        d = scale * c.difference
        err = [[max(0.0, d - scale * iv.low)], [max(0.0, scale * iv.high - d)]] if iv is not None else None
        ax.errorbar(d, y, xerr=err, fmt="o", color=colour, ecolor=colour, capsize=3, markersize=5)
    ax.axvline(0, color="#666666", linewidth=0.8, linestyle="--")
    ax.set_yticks(range(len(rows)), labels)
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.set_xlabel(f"{xlabel}{', percentage points' if percent else ''}; 95 % paired bootstrap intervals")
    ax.set_title(title)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return fig
