"""Writing a scored Humor run: ``report.json``, ``report.md``, a confusion PNG and MERA's submission files.

The submission (``Humor.json`` + ``logs_public.zip``, :mod:`punchline.pipelines.humor.data.submission`) carries the
model's own text and is written only when every item has an answer. Every file is written via temp file +
rename (``data.jsonio.atomic_write_bytes``).
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from punchline.data.drawing import drawing
from punchline.data.storage.jsonio import atomic_write_bytes, check_out_dir
from punchline.pipelines.humor.data.judge import (
    DEFAULT_THRESHOLD,
    JudgeStats,
    count_failed_calls,
    judge_stats,
    load_judge_scores,
    load_mera_judge_scores,
)
from punchline.pipelines.humor.data.loaders import check_unique_ids, load_humor, load_predictions
from punchline.pipelines.humor.data.metrics import (
    UNPARSED,
    HumorMetrics,
    Interval,
    ItemScore,
    bootstrap_ci,
    compute_metrics,
)
from punchline.pipelines.humor.data.schema import HumorFile, HumorItem, HumorShotsFile, HumorTestFile
from punchline.pipelines.humor.data.submission import SUBMISSION_FILE, submission_files

REPORT_JSON = "report.json"
REPORT_MD = "report.md"
CONFUSION_PNG = "confusion.png"


class HumorReport(HumorMetrics, kw_only=True):
    """``report.json``: every metric, the parsed answer of each item, and judge stats if judged."""

    answers: dict[int, str | None]  # id -> parsed "class,letter", None when unparsed
    judge: JudgeStats | None = None
    judge_scores: dict[int, float | None] | None = None
    judge_mera: float | None = None  # MERA's judge_score: mean over items (a missing answer scores 0)
    judge_mera_ci95: Interval | None = None
    judge_mera_scores: dict[int, float] | None = None
    judge_mera_failed_calls: int | None = None  # MERA's judge calls that failed (each scored 0, as in MERA)


class ReportPaths(msgspec.Struct):
    submission: str | None  # Humor.json; None when some item has no answer
    report_json: str
    report_md: str
    confusion_png: str


def build_report(
    metrics: HumorMetrics,
    scores: Sequence[ItemScore],
    *,
    judge: JudgeStats | None = None,
    judge_scores: Mapping[int, float | None] | None = None,
    judge_mera_scores: Mapping[int, float] | None = None,
    judge_mera_failed_calls: int | None = None,
) -> HumorReport:
    """``judge_mera_scores``: item id -> MERA judge score; an item without one scores 0 (as in MERA).
    ``judge_mera_failed_calls``: how many of MERA's judge calls failed (each scored 0)."""
    fields = {f: getattr(metrics, f) for f in metrics.__struct_fields__}
    mera_values = [float(judge_mera_scores.get(s.id, 0.0)) for s in scores] if judge_mera_scores is not None else None
    return HumorReport(
        **fields,
        answers={s.id: s.parsed.as_output() for s in scores},
        judge=judge,
        judge_scores=dict(judge_scores) if judge_scores is not None else None,
        judge_mera=sum(mera_values) / len(mera_values) if mera_values else None,
        judge_mera_ci95=(
            bootstrap_ci(mera_values, resamples=metrics.bootstrap_resamples, seed=metrics.bootstrap_seed + 4)
            if mera_values
            else None
        ),
        judge_mera_scores=dict(judge_mera_scores) if judge_mera_scores is not None else None,
        judge_mera_failed_calls=judge_mera_failed_calls if judge_mera_scores is not None else None,
    )


class Headline(msgspec.Struct, frozen=True):
    """One number of the end-of-run summary."""

    label: str
    value: float | None
    low: float | None = None  # 95 % bootstrap interval, when there is one
    high: float | None = None

    def shown(self) -> str:
        """``"41.7 % [22.1, 61.3]"``; ``"–"`` when there is no value (e.g. no judge configured)."""
        if self.value is None:
            return "–"
        interval = (
            f" [{100 * self.low:.1f}, {100 * self.high:.1f}]" if self.low is not None and self.high is not None else ""
        )
        return f"{100 * self.value:.1f} %{interval}"


def headlines(report: HumorReport) -> list[Headline]:
    """The numbers a Humor run ends with: EM under both readings and both judges (None: not judged)."""
    judge = report.judge
    mera_ci = report.judge_mera_ci95
    return [
        Headline("EM (MERA's reading)", report.em_mera, report.em_mera_ci95.low, report.em_mera_ci95.high),
        Headline("EM (our robust parser)", report.em, report.em_ci95.low, report.em_ci95.high),
        Headline(
            "judge (MERA's prompt, 0/1/2 over 2)",
            report.judge_mera,
            mera_ci.low if mera_ci else None,
            mera_ci.high if mera_ci else None,
        ),
        Headline("judge (ours, binary pass rate)", judge.pass_rate if judge is not None else None),
    ]


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def _summary_lines(r: HumorReport) -> list[str]:
    """The headline table and the intervals' note."""
    return [
        "# Humor (MERA) results",
        "",
        "| metric | value |",
        "|---|---|",
        f"| items | {r.n} (missing predictions: {r.n_missing}) |",
        f"| EM (MERA's reading), % | {_pct(r.em_mera)} [{_pct(r.em_mera_ci95.low)}, {_pct(r.em_mera_ci95.high)}] |",
        f"| EM (our robust parser), % | {_pct(r.em)} [{_pct(r.em_ci95.low)}, {_pct(r.em_ci95.high)}] |",
        f"| class accuracy, % | {_pct(r.class_accuracy)} "
        f"[{_pct(r.class_accuracy_ci95.low)}, {_pct(r.class_accuracy_ci95.high)}] |",
        f"| letter accuracy, % | {_pct(r.letter_accuracy)} |",
        f"| macro F1 (classes), % | {_pct(r.macro_f1)} |",
        f"| «не анекдот» precision / recall, % | {_pct(r.not_a_joke_precision)} / {_pct(r.not_a_joke_recall)} |",
        f"| parse failures, % | {_pct(r.parse_failure_rate)} (class {_pct(r.class_parse_failure_rate)}, "
        f"letter {_pct(r.letter_parse_failure_rate)}) |",
        f"| ambiguous answers (hedges, answers that disagree), % | {_pct(r.ambiguous_rate)} ({r.ambiguous}) |",
        "",
        f"Intervals: 95 % percentile bootstrap, {r.bootstrap_resamples} resamples, seed {r.bootstrap_seed}.",
        "",
    ]


def _judge_lines(r: HumorReport) -> list[str]:
    """A section per configured judge (MERA's, ours)."""
    out: list[str] = []
    if r.judge_mera is not None:
        ci = r.judge_mera_ci95
        interval = f" [{_pct(ci.low)}, {_pct(ci.high)}]" if ci is not None else ""
        out += [
            "## MERA's judge",
            "",
            f"judge_score (MERA's prompt, 0/1/2 rubric over 2, best over MERA's readings, 0 on a failed call): "
            f"{_pct(r.judge_mera)} %{interval}",
            "",
            f"failed judge calls (scored 0, not retried under the mera preset): {r.judge_mera_failed_calls or 0}",
            "",
        ]
    if r.judge is not None:
        j = r.judge
        kappa = "–" if j.kappa_with_em is None else f"{j.kappa_with_em:.3f}"
        out += [
            "## Our judge",
            "",
            "| metric | value |",
            "|---|---|",
            f"| scale | {j.scale} (pass: score ≥ {j.threshold:g}) |",
            f"| judged / missing | {j.n_scored} / {j.n_missing} |",
            f"| pass rate, % | {_pct(j.pass_rate)} |",
            f"| agreement with EM, % | {_pct(j.agreement_with_em)} |",
            f"| Cohen's kappa with EM | {kappa} |",
            "",
        ]
    return out


def _per_class_lines(r: HumorReport) -> list[str]:
    """The per-class table with its intervals."""
    out = [
        "## Per class",
        "",
        "| class | support | predicted | correct | precision [95 % CI] | recall [95 % CI] | F1 [95 % CI] |",
        "|---|---|---|---|---|---|---|",
    ]
    for cls, st in r.per_class.items():
        class_ci = r.per_class_ci95[cls]

        def cell(x: float, iv: Interval) -> str:
            return f"{_pct(x)} [{_pct(iv.low)}, {_pct(iv.high)}]"

        out.append(
            f"| {cls} | {st.support} | {st.predicted} | {st.correct} | "
            f"{cell(st.precision, class_ci.precision)} | {cell(st.recall, class_ci.recall)} | "
            f"{cell(st.f1, class_ci.f1)} |"
        )
    return out


def _letter_and_confusion_lines(r: HumorReport) -> list[str]:
    """The letters' position bias and the confusion matrix."""
    letters = list(r.predicted_letters)
    out = [
        "",
        "## Letters (position bias)",
        "",
        "| | " + " | ".join(letters) + " |",
        "|---" * (len(letters) + 1) + "|",
        "| predicted | " + " | ".join(str(r.predicted_letters[x]) for x in letters) + " |",
        "| reference | " + " | ".join(str(r.reference_letters.get(x, 0)) for x in letters) + " |",
        "",
        "## Confusion matrix (rows: reference, columns: predicted)",
        "",
        "| reference \\ predicted | " + " | ".join(r.confusion.cols) + " |",
        "|---" * (len(r.confusion.cols) + 1) + "|",
    ]
    for name, row in zip(r.confusion.rows, r.confusion.counts, strict=True):
        out.append(f"| {name} | " + " | ".join(str(c) for c in row) + " |")
    return out


def render_markdown(report: HumorReport) -> str:
    r = report
    out = [*_summary_lines(r), *_judge_lines(r), *_per_class_lines(r), *_letter_and_confusion_lines(r)]
    return "\n".join(out) + "\n"


def render_confusion_png(report: HumorReport) -> bytes:
    import matplotlib  # lazy: matplotlib takes a second to import; only the PNG needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: as above (after choosing the Agg backend)

    with drawing():  # pyplot's figures are the process's: one drawing at a time (data/drawing.py)
        return _confusion_png(report, plt)


def _confusion_png(report: HumorReport, plt: Any) -> bytes:
    conf = report.confusion
    fig, ax = plt.subplots(figsize=(10, 8.5))
    try:
        ax.imshow(conf.counts, cmap="Blues", aspect="auto")
        ax.set_xticks(range(len(conf.cols)), labels=conf.cols, rotation=60, ha="right")
        ax.set_yticks(range(len(conf.rows)), labels=conf.rows)
        peak = max((max(row) for row in conf.counts), default=0)
        for i, row in enumerate(conf.counts):
            for j, count in enumerate(row):
                if count:
                    color = "white" if count > peak / 2 else "black"
                    ax.text(j, i, str(count), ha="center", va="center", color=color, fontsize=8)
        ax.set_xlabel(f"predicted ({UNPARSED}: no class read)")
        ax.set_ylabel("reference")
        ax.set_title(f"Humor: class confusion (n={report.n}, EM={100 * report.em:.1f} %)")
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100)
    finally:
        plt.close(fig)
    return buf.getvalue()


def _items(source: HumorFile | Sequence[HumorItem]) -> list[HumorItem]:
    return source.data if isinstance(source, HumorTestFile | HumorShotsFile) else list(source)


def write_report(
    out_dir: str | os.PathLike[str],
    source: HumorFile | Sequence[HumorItem],
    report: HumorReport,
    predictions: Mapping[int, str] | None = None,
    *,
    stamp: str | None = None,
) -> ReportPaths:
    """Write the outputs into ``out_dir`` (created if needed); MERA's submission files too when
    ``predictions`` (id -> raw text) answers every item (``stamp``: the logs' run stamp, by default one
    derived from the answers)."""
    out = Path(out_dir)
    items = _items(source)
    complete = predictions is not None and all(it.id in predictions for it in items)
    paths = ReportPaths(
        submission=str(out / SUBMISSION_FILE) if complete else None,
        report_json=str(out / REPORT_JSON),
        report_md=str(out / REPORT_MD),
        confusion_png=str(out / CONFUSION_PNG),
    )
    if complete and predictions is not None:
        files = submission_files(items, dict(predictions), stamp=stamp)
        for name, data in files.items():
            atomic_write_bytes(out / name, data)
    atomic_write_bytes(paths.report_json, msgspec.json.format(msgspec.json.encode(report), indent=2))
    atomic_write_bytes(paths.report_md, render_markdown(report).encode("utf-8"))
    atomic_write_bytes(paths.confusion_png, render_confusion_png(report))
    return paths


def score_and_write(
    out_dir: str | os.PathLike[str],
    source: HumorFile | Sequence[HumorItem],
    predictions: Mapping[int, str],
    *,
    judge_scores: Mapping[int, float | None] | None = None,
    judge_mera_scores: Mapping[int, float] | None = None,
    judge_mera_failed_calls: int | None = None,
    judge_threshold: float = DEFAULT_THRESHOLD,
    resamples: int = 1000,
    seed: int = 0,
    stamp: str | None = None,
) -> tuple[HumorReport, ReportPaths]:
    """Score raw answers (id -> text) and optional judge scores (ours and MERA's), and write all outputs.

    The one entry point shared by ``punchline humor score`` and the engine's Humor pipeline.
    """
    metrics, scores = compute_metrics(_items(source), predictions, resamples=resamples, seed=seed)
    judge = None
    if judge_scores is not None:
        judge = judge_stats(judge_scores, {s.id: s.em for s in scores}, threshold=judge_threshold)
    report = build_report(
        metrics,
        scores,
        judge=judge,
        judge_scores=judge_scores,
        judge_mera_scores=judge_mera_scores,
        judge_mera_failed_calls=judge_mera_failed_calls,
    )
    return report, write_report(out_dir, source, report, predictions, stamp=stamp)


def score_files(
    out_dir: str,
    data_path: str,
    predictions_path: str,
    *,
    judge_scores_path: str | None = None,
    judge_mera_scores_path: str | None = None,
    judge_threshold: float = DEFAULT_THRESHOLD,
    resamples: int = 1000,
    seed: int = 0,
) -> tuple[HumorReport, ReportPaths]:
    """``punchline humor score``: every file read and checked (and ``out_dir`` found writable) before
    anything is written, then :func:`score_and_write`."""
    check_out_dir(out_dir)
    source = load_humor(data_path)
    check_unique_ids(source.data, data_path)
    predictions = load_predictions(predictions_path)
    judge_scores = load_judge_scores(judge_scores_path) if judge_scores_path else None
    judge_mera_scores = load_mera_judge_scores(judge_mera_scores_path) if judge_mera_scores_path else None
    failed = count_failed_calls(judge_mera_scores_path) if judge_mera_scores_path else None
    return score_and_write(
        out_dir,
        source,
        predictions,
        judge_scores=judge_scores,
        judge_mera_scores=judge_mera_scores,
        judge_mera_failed_calls=failed,
        judge_threshold=judge_threshold,
        resamples=resamples,
        seed=seed,
    )
