"""Tables and plots a plug-in's ``reduce`` writes as artifacts, byte-identical on every run.

A reduce must be a pure function of its results (a resumed run, or one on more workers, writes the same
bytes), so these helpers fix what a library would vary: a CSV's columns come in first-seen order with
``\\n`` line ends; a plot carries no date, no software version and a fixed SVG id salt. Plots use
matplotlib (imported on first use: a pipeline that draws nothing never loads it), in the Okabe-Ito
colour-blind-safe palette.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any, cast

from punchline.cluster.pipeline import StageContext
from punchline.data.errors import ConfigError
from punchline.data.figures.drawing import drawing

PALETTE = ("#0072B2", "#D55E00", "#009E73", "#E69F00", "#56B4E9", "#CC79A7", "#F0E442", "#999999")
_METADATA: dict[str, dict[str, str | None]] = {"png": {"Software": None}, "svg": {"Date": None, "Creator": None}}
_RC = {"svg.hashsalt": "punchline", "svg.fonttype": "path"}


def write_csv(ctx: StageContext, name: str, rows: Sequence[Mapping[str, Any]]) -> str:
    """``rows`` as the CSV artifact ``name`` (columns in first-seen order, missing cells empty); returns ``name``."""
    columns: dict[str, None] = {}
    for row in rows:
        columns.update(dict.fromkeys(row))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    ctx.write_artifact(name, buf.getvalue().encode())
    return name


def bar_plot(
    ctx: StageContext,
    name: str,
    values: Mapping[str, float] | Mapping[str, Mapping[str, float]],
    *,
    title: str = "",
    ylabel: str = "",
    ylim: tuple[float, float] | None = None,
) -> str:
    """A bar chart as the artifact ``name`` (``.png`` or ``.svg``); returns ``name``.

    ``values``: label -> height, or series -> (label -> height) for grouped bars (one colour a series)."""
    fmt = PurePosixPath(name).suffix.lstrip(".").lower()
    if fmt not in _METADATA:
        raise ConfigError(f"a plot is .png or .svg, not {name!r}", field="bar_plot")
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: as above
    from matplotlib.figure import Figure  # lazy: as above

    first = next(iter(values.values()), None)
    series: dict[str, Mapping[str, float]] = (
        {str(k): v for k, v in values.items() if isinstance(v, Mapping)}
        if isinstance(first, Mapping)
        else {"": cast(Mapping[str, float], values)}
    )
    labels = list(dict.fromkeys(label for s in series.values() for label in s))
    fig = Figure(figsize=(max(4.0, 0.9 * len(labels) * max(1, len(series)) + 1.5), 3.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    width = 0.8 / len(series)
    for i, (key, heights) in enumerate(series.items()):
        xs = [n + (i - (len(series) - 1) / 2) * width for n in range(len(labels))]
        ax.bar(xs, [float(heights.get(label, 0.0)) for label in labels], width, label=key or None,
               color=PALETTE[i % len(PALETTE)])  # fmt: skip
    ax.set_xticks(range(len(labels)), labels)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    if ylim is not None:
        ax.set_ylim(*ylim)
    if len(series) > 1:
        ax.legend(frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    buf = io.BytesIO()
    with drawing(_RC):  # matplotlib's settings are the process's: one figure at a time (data/figures/drawing.py)
        fig.savefig(buf, format=fmt, dpi=150, bbox_inches="tight", metadata=_METADATA[fmt])
    ctx.write_artifact(name, buf.getvalue())
    return name
