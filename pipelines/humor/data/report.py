"""Writing a scored Humor run: ``report.json``, ``report.md``, the confusion figure (PNG and SVG) and MERA's
submission files.

The submission (``Humor.json`` + ``logs_public.zip``, :mod:`punchline.pipelines.humor.data.submission`) carries the
model's own text and is written only when every item has an answer. Every file is written via temp file +
rename (``data.jsonio.atomic_write_bytes``).

Under the ``mera`` preset MERA's judge posts each call once and scores a failed one 0; a call asked again later
(``retry-failed``) or retried within the run departs from that, so the report lists every such call
(:class:`JudgeRetry`, :func:`judge_retries`): a score that moved is never silent.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import msgspec

from punchline.data.figures.drawing import drawing
from punchline.data.metrics.intervals import Interval, bootstrap_mean
from punchline.data.metrics.plots import Format, new_figure, render_formats
from punchline.data.metrics.tables import NA, pct
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
from punchline.pipelines.humor.data.metrics import UNPARSED, HumorMetrics, ItemScore, compute_metrics
from punchline.pipelines.humor.data.schema import HumorFile, HumorItem, HumorShotsFile, HumorTestFile
from punchline.pipelines.humor.data.submission import SUBMISSION_FILE, submission_files

if TYPE_CHECKING:
    from matplotlib.figure import Figure

REPORT_JSON = "report.json"
REPORT_MD = "report.md"
CONFUSION_PNG = "confusion.png"
CONFUSION_SVG = "confusion.svg"


class JudgeRetry(msgspec.Struct, kw_only=True):
    """An item whose MERA judge calls were asked more than once: ``by`` ``retry-failed`` (calls that had failed,
    scored 0, answered on a later ask of the run: ``calls`` of them) or ``within the run`` (``calls`` failed
    attempts retried before the answer: the ``punchline`` preset's retries). ``score_before`` is the item's MERA
    judge score with those calls failed (0 each), ``score_after`` with their answers; None where not known."""

    item: int
    model: str | None  # the model whose answer was judged
    judge: str | None  # the judge model's id
    by: Literal["retry-failed", "within the run"]
    calls: int
    score_before: float | None = None
    score_after: float | None = None


class HumorReport(HumorMetrics, kw_only=True):
    """``report.json``: every metric, the parsed answer of each item, and judge stats if judged."""

    model: str | None = None  # the model scored (its nick in a run; the predictions file's name in `humor score`)
    answers: dict[int, str | None]  # id -> parsed "class,letter", None when unparsed
    judge: JudgeStats | None = None
    judge_scores: dict[int, float | None] | None = None
    judge_mera: float | None = None  # MERA's judge_score: mean over items (a missing answer scores 0)
    judge_mera_ci95: Interval | None = None
    judge_mera_scores: dict[int, float] | None = None
    judge_mera_failed_calls: int | None = None  # MERA's judge calls that failed (each scored 0, as in MERA)
    judge_mera_retried: list[JudgeRetry] | None = None  # MERA's judge calls asked again (not MERA's protocol)


class ReportPaths(msgspec.Struct):
    submission: str | None  # Humor.json; None when some item has no answer
    report_json: str
    report_md: str
    confusion_png: str
    confusion_svg: str


def build_report(
    metrics: HumorMetrics,
    scores: Sequence[ItemScore],
    *,
    judge: JudgeStats | None = None,
    judge_scores: Mapping[int, float | None] | None = None,
    judge_mera_scores: Mapping[int, float] | None = None,
    judge_mera_failed_calls: int | None = None,
    judge_mera_retried: Sequence[JudgeRetry] | None = None,
    model: str | None = None,
) -> HumorReport:
    """``judge_mera_scores``: item id -> MERA judge score; an item without one scores 0 (as in MERA).
    ``judge_mera_failed_calls``: how many of MERA's judge calls failed (each scored 0); ``judge_mera_retried``:
    those asked again (:func:`judge_retries`). ``model``: the model scored, named in the figure's title."""
    fields = {f: getattr(metrics, f) for f in metrics.__struct_fields__}
    mera_values = [float(judge_mera_scores.get(s.id, 0.0)) for s in scores] if judge_mera_scores is not None else None
    return HumorReport(
        **fields,
        model=model,
        answers={s.id: s.parsed.as_output() for s in scores},
        judge=judge,
        judge_scores=dict(judge_scores) if judge_scores is not None else None,
        judge_mera=sum(mera_values) / len(mera_values) if mera_values else None,
        judge_mera_ci95=(
            bootstrap_mean(mera_values, resamples=metrics.bootstrap_resamples, seed=metrics.bootstrap_seed + 4)
            if mera_values
            else None
        ),
        judge_mera_scores=dict(judge_mera_scores) if judge_mera_scores is not None else None,
        judge_mera_failed_calls=judge_mera_failed_calls if judge_mera_scores is not None else None,
        judge_mera_retried=list(judge_mera_retried) if judge_mera_retried is not None else None,
    )


class _KeptRetries(msgspec.Struct):
    """What a later reduce reads back of an earlier ``report.json``: the retries it listed."""

    judge_mera_retried: list[JudgeRetry] | None = None


def retries_of_report(raw: bytes) -> list[JudgeRetry]:
    """The MERA judge retries an earlier ``report.json`` lists (none in one written before they were kept)."""
    return msgspec.json.decode(raw, type=_KeptRetries).judge_mera_retried or []


def judge_retries(
    before: Mapping[int, tuple[float, int]] | None,
    after: Mapping[int, tuple[float, int]],
    retried_within: Mapping[int, int],
    *,
    model: str | None,
    judge: str | None,
    earlier: Sequence[JudgeRetry] = (),
) -> list[JudgeRetry]:
    """The MERA judge calls of one model asked more than once, ``earlier`` ones first (a later report keeps them).

    ``before``/``after``: item id -> (MERA judge score, failed calls) as the run's previous reduce wrote them and as
    they are now (None: no previous reduce). An item with fewer failed calls now than before had them asked again
    (``retry-failed``: a MERA judge call is never retried by a plain resume) and answered; one that failed again
    looks the same as one not asked again, so it is not listed. ``retried_within``: item id -> failed attempts its
    calls retried within the run."""
    out = list(earlier)
    for item, (score, failed) in after.items():
        was = before.get(item) if before is not None else None
        if was is not None and was[1] > failed:
            out.append(JudgeRetry(item=item, model=model, judge=judge, by="retry-failed", calls=was[1] - failed,
                                  score_before=was[0], score_after=score))  # fmt: skip
        if retried_within.get(item):
            out.append(JudgeRetry(item=item, model=model, judge=judge, by="within the run",
                                  calls=retried_within[item], score_after=score))  # fmt: skip
    return out


class Headline(msgspec.Struct, frozen=True):
    """One number of the end-of-run summary."""

    label: str
    value: float | None
    low: float | None = None  # its 95 % interval, when there is one
    high: float | None = None

    def shown(self) -> str:
        """``"41.7 % [22.1, 61.3]"``; ``"–"`` when there is no value (e.g. no judge configured)."""
        if self.value is None:
            return "–"
        interval = f" [{pct(self.low)}, {pct(self.high)}]" if self.low is not None and self.high is not None else ""
        return f"{pct(self.value)} %{interval}"


def headlines(report: HumorReport) -> list[Headline]:
    """The numbers a Humor run ends with: EM under both readings and both judges (None: not judged)."""
    judge = report.judge

    def line(label: str, value: float | None, ci: Interval | None) -> Headline:
        return Headline(label, value, ci.low if ci else None, ci.high if ci else None)

    return [
        line("EM (MERA's reading)", report.em_mera, report.em_mera_ci95),
        line("EM (our robust parser)", report.em, report.em_ci95),
        line("judge (MERA's prompt, 0/1/2 over 2)", report.judge_mera, report.judge_mera_ci95),
        Headline("judge (ours, binary pass rate)", judge.pass_rate if judge is not None else None),
    ]


def _pct(x: float | None) -> str:
    """A rate in %, ``n/a`` when undefined (0/0)."""
    return pct(x)


def _ci(iv: Interval | None) -> str:
    return f"[{pct(iv.low)}, {pct(iv.high)}]" if iv is not None else f"[{NA}]"


def _summary_lines(r: HumorReport) -> list[str]:
    """The headline table and the intervals' note."""
    return [
        f"# Humor (MERA) results{f': {r.model}' if r.model else ''}",
        "",
        "| metric | value |",
        "|---|---|",
        f"| items | {r.n} (missing predictions: {r.n_missing}) |",
        f"| EM (MERA's reading), % | {_pct(r.em_mera)} {_ci(r.em_mera_ci95)} |",
        f"| EM (our robust parser), % | {_pct(r.em)} {_ci(r.em_ci95)} |",
        f"| class accuracy, % | {_pct(r.class_accuracy)} {_ci(r.class_accuracy_ci95)} |",
        f"| letter accuracy, % | {_pct(r.letter_accuracy)} |",
        f"| macro F1 (classes), % | {_pct(r.macro_f1)} |",
        f"| «не анекдот» precision / recall, % | {_pct(r.not_a_joke_precision)} / {_pct(r.not_a_joke_recall)} |",
        f"| parse failures, % | {_pct(r.parse_failure_rate)} (class {_pct(r.class_parse_failure_rate)}, "
        f"letter {_pct(r.letter_parse_failure_rate)}) |",
        f"| ambiguous answers (hedges, answers that disagree), % | {_pct(r.ambiguous_rate)} ({r.ambiguous}) |",
        "",
        "Intervals (95 %): Wilson score intervals for the rates (EM, class accuracy, precision, recall); percentile "
        f"bootstrap for MERA's judge score and F1 ({r.bootstrap_resamples} resamples, seed {r.bootstrap_seed}). "
        f"{NA}: undefined (0/0, e.g. the precision of a class never predicted).",
        "",
    ]


def _judge_lines(r: HumorReport) -> list[str]:
    """A section per configured judge (MERA's, ours)."""
    out: list[str] = []
    if r.judge_mera is not None:
        out += [
            "## MERA's judge",
            "",
            f"judge_score (MERA's prompt, 0/1/2 rubric over 2, best over MERA's readings, 0 on a failed call): "
            f"{_pct(r.judge_mera)} % {_ci(r.judge_mera_ci95)}",
            "",
            f"failed judge calls (each scored 0; the mera preset does not retry them within the run): "
            f"{r.judge_mera_failed_calls or 0}",
            "",
            *_retry_lines(r.judge_mera_retried or []),
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


def _retry_lines(retried: Sequence[JudgeRetry]) -> list[str]:
    """The MERA judge calls asked more than once, each item's score before and after (MERA asks once)."""
    if not retried:
        return ["judge calls asked again: none", ""]
    calls = {by: sum(x.calls for x in retried if x.by == by) for by in ("retry-failed", "within the run")}
    out = [
        f"judge calls asked again (MERA asks each once; the scores below are not MERA's protocol): "
        f"{calls['retry-failed']} failed calls answered after retry-failed, {calls['within the run']} failed "
        "attempts retried within the run",
        "",
        "| item | model | judge | asked again by | calls | MERA judge score before → after |",
        "|---|---|---|---|---|---|",
    ]
    for x in retried:
        out.append(f"| {x.item} | {x.model or NA} | {x.judge or NA} | {x.by} | {x.calls} | "
                   f"{_score(x.score_before)} → {_score(x.score_after)} |")  # fmt: skip
    return [*out, ""]


def _score(x: float | None) -> str:
    return NA if x is None else f"{x:g}"


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

        def cell(x: float | None, iv: Interval | None) -> str:
            return NA if x is None else f"{_pct(x)} {_ci(iv)}"

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


def confusion_title(report: HumorReport) -> str:
    """The figure's title: the model, and MERA's score (EM under MERA's reading, the submission's) with its
    interval: the figure is shown beside MERA's leaderboard, so it names MERA's number, not our parser's."""
    iv = report.em_mera_ci95
    return (
        f"Humor, {report.model or 'model'}: class confusion (n = {report.n}; "
        f"EM, MERA's reading: {_pct(report.em_mera)} % {_ci(iv)})"
    )


def render_confusion(report: HumorReport) -> dict[Format, bytes]:
    """The confusion figure as PNG and SVG bytes (the same on every run)."""
    with drawing():  # matplotlib's settings are the process's: one figure at a time (data/figures/drawing.py)
        return render_formats(_confusion_figure(report), dpi=100)


def render_confusion_png(report: HumorReport) -> bytes:
    return render_confusion(report)["png"]


def _confusion_figure(report: HumorReport) -> Figure:
    conf = report.confusion
    fig = new_figure(10, 8.5)
    ax = fig.add_subplot()
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
    ax.set_title(confusion_title(report))
    fig.tight_layout()
    return fig


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
        confusion_svg=str(out / CONFUSION_SVG),
    )
    if complete and predictions is not None:
        files = submission_files(items, dict(predictions), stamp=stamp)
        for name, data in files.items():
            atomic_write_bytes(out / name, data)
    atomic_write_bytes(paths.report_json, msgspec.json.format(msgspec.json.encode(report), indent=2))
    atomic_write_bytes(paths.report_md, render_markdown(report).encode("utf-8"))
    figure = render_confusion(report)
    atomic_write_bytes(paths.confusion_png, figure["png"])
    atomic_write_bytes(paths.confusion_svg, figure["svg"])
    return paths


def score_and_write(
    out_dir: str | os.PathLike[str],
    source: HumorFile | Sequence[HumorItem],
    predictions: Mapping[int, str],
    *,
    judge_scores: Mapping[int, float | None] | None = None,
    judge_mera_scores: Mapping[int, float] | None = None,
    judge_mera_failed_calls: int | None = None,
    judge_mera_retried: Sequence[JudgeRetry] | None = None,
    judge_threshold: float = DEFAULT_THRESHOLD,
    resamples: int = 1000,
    seed: int = 0,
    stamp: str | None = None,
    model: str | None = None,
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
        judge_mera_retried=judge_mera_retried,
        model=model,
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
        model=Path(predictions_path).stem,
    )
