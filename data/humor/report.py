"""Writing a scored Humor run: MERA submission, ``report.json``, ``report.md`` and a confusion PNG.

Every file is written via temp file + rename (``data.jsonio.atomic_write_bytes``).
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import msgspec

from punchline.data.humor.judge import DEFAULT_THRESHOLD, JudgeStats, judge_stats
from punchline.data.humor.metrics import UNPARSED, HumorMetrics, ItemScore, compute_metrics
from punchline.data.humor.schema import HumorFile, HumorItem, HumorShotsFile, HumorTestFile
from punchline.data.jsonio import atomic_write_bytes

SUBMISSION_NAME = "submission.json"
REPORT_JSON = "report.json"
REPORT_MD = "report.md"
CONFUSION_PNG = "confusion.png"


class HumorReport(HumorMetrics, kw_only=True):
    """``report.json``: every metric, the parsed answer of each item, and judge stats if judged."""

    answers: dict[int, str | None]  # id -> parsed "class,letter", None when unparsed
    judge: JudgeStats | None = None
    judge_scores: dict[int, float | None] | None = None


class ReportPaths(msgspec.Struct):
    submission: str
    report_json: str
    report_md: str
    confusion_png: str


def build_report(
    metrics: HumorMetrics,
    scores: Sequence[ItemScore],
    *,
    judge: JudgeStats | None = None,
    judge_scores: Mapping[int, float | None] | None = None,
) -> HumorReport:
    fields = {f: getattr(metrics, f) for f in metrics.__struct_fields__}
    return HumorReport(
        **fields,
        answers={s.id: s.parsed.as_output() for s in scores},
        judge=judge,
        judge_scores=dict(judge_scores) if judge_scores is not None else None,
    )


def submission(source: HumorFile | Sequence[HumorItem], answers: Mapping[int, str | None]) -> HumorFile:
    """The input's shape with ``outputs`` = parsed ``"class,letter"`` (``""`` when unparsed)."""
    items = source.data if isinstance(source, HumorTestFile | HumorShotsFile) else list(source)
    filled = [msgspec.structs.replace(it, outputs=answers.get(it.id) or "") for it in items]
    if isinstance(source, HumorTestFile):
        return HumorTestFile(access=source.access, data=filled)
    return HumorShotsFile(data=filled)


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def render_markdown(report: HumorReport) -> str:
    r = report
    out = [
        "# Humor (MERA) results",
        "",
        "| metric | value |",
        "|---|---|",
        f"| items | {r.n} (missing predictions: {r.n_missing}) |",
        f"| EM (robust parser), % | {_pct(r.em)} [{_pct(r.em_ci95.low)}, {_pct(r.em_ci95.high)}] |",
        f"| EM (official MERA reading), % | {_pct(r.em_mera)} |",
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
    if r.judge is not None:
        j = r.judge
        kappa = "–" if j.kappa_with_em is None else f"{j.kappa_with_em:.3f}"
        out += [
            "## LLM judge",
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
    out += [
        "## Per class",
        "",
        "| class | support | predicted | correct | precision | recall | F1 |",
        "|---|---|---|---|---|---|---|",
    ]
    for cls, st in r.per_class.items():
        out.append(
            f"| {cls} | {st.support} | {st.predicted} | {st.correct} | "
            f"{_pct(st.precision)} | {_pct(st.recall)} | {_pct(st.f1)} |"
        )
    letters = list(r.predicted_letters)
    out += [
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
    return "\n".join(out) + "\n"


def render_confusion_png(report: HumorReport) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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


def write_report(
    out_dir: str | os.PathLike[str],
    source: HumorFile | Sequence[HumorItem],
    report: HumorReport,
) -> ReportPaths:
    """Write the four outputs into ``out_dir`` (created if needed)."""
    out = Path(out_dir)
    paths = ReportPaths(
        submission=str(out / SUBMISSION_NAME),
        report_json=str(out / REPORT_JSON),
        report_md=str(out / REPORT_MD),
        confusion_png=str(out / CONFUSION_PNG),
    )
    sub = submission(source, report.answers)
    atomic_write_bytes(paths.submission, msgspec.json.format(msgspec.json.encode(sub), indent=2))
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
    judge_threshold: float = DEFAULT_THRESHOLD,
    resamples: int = 1000,
    seed: int = 0,
) -> tuple[HumorReport, ReportPaths]:
    """Score raw answers (id -> text) and optional judge scores, and write all outputs.

    The one entry point shared by ``punchline humor score`` and the engine's Humor pipeline.
    """
    items = source.data if isinstance(source, HumorTestFile | HumorShotsFile) else list(source)
    metrics, scores = compute_metrics(items, predictions, resamples=resamples, seed=seed)
    judge = None
    if judge_scores is not None:
        judge = judge_stats(judge_scores, {s.id: s.em for s in scores}, threshold=judge_threshold)
    report = build_report(metrics, scores, judge=judge, judge_scores=judge_scores)
    return report, write_report(out_dir, source, report)
