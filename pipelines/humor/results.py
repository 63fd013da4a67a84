"""What the viewer shows of a Humor run: each model's scores with their 95% CIs and how many items its two
judges disagree on (the run's page), and, above a model's ``report.json``, its scores and the items where the
readings disagree (our judge vs MERA's judge, with the model's answer).

Read from the reports as plain JSON, tolerantly: a report an older version wrote, with a field missing, still
shows what it has. Sections, not HTML (:mod:`punchline.cluster.result_sections`): the viewer escapes them.
"""

from __future__ import annotations

from typing import Any

from punchline.cluster.result_sections import Cell, Link, ResultSection, ResultsView
from punchline.pipelines.humor.data.report import REPORT_JSON
from punchline.pipelines.humor.settings import REPORT_PREFIX

CI_SCORES = ("em", "em_mera", "class_accuracy", "judge_mera")  # the scores a report gives a 95% CI of


def _is_report(artifact: str) -> bool:
    """``report/<model>/report.json``."""
    parts = artifact.split("/")
    return len(parts) == 3 and parts[0] == REPORT_PREFIX and parts[2] == REPORT_JSON


def with_ci(report: dict[str, Any], name: str, ci_label: str = "") -> str:
    """``0.523 (0.410-0.630)``: a score and its 95% CI (after ``ci_label``), as far as the report has them."""
    value, ci = report.get(name), report.get(f"{name}_ci95")
    if not isinstance(value, (int, float)):
        return ""
    if isinstance(ci, dict):
        return f"{value:.3f} ({ci_label}{ci.get('low', 0):.3f}-{ci.get('high', 0):.3f})"
    return f"{value:.3f}"


def disagreeing(report: dict[str, Any]) -> list[str] | None:
    """The items our judge and MERA's judge score differently, in item order; None without both judges."""
    ours, mera = report.get("judge_scores"), report.get("judge_mera_scores")
    if not isinstance(ours, dict) or not isinstance(mera, dict):
        return None
    items = sorted(set(ours) | set(mera), key=lambda i: (len(str(i)), str(i)))
    return [item for item in items if ours.get(item) != mera.get(item)]


def results(view: ResultsView) -> list[ResultSection]:
    """The run's page: one row a model, linking to its report."""
    rows: list[dict[str, Cell]] = []
    for rel in sorted(a for a in view.artifacts if _is_report(a)):
        report = view.read_json(rel)
        if not isinstance(report, dict):
            continue
        differ = disagreeing(report)
        rows.append(
            {
                "model": Link(rel.split("/")[1], rel),
                "n": report.get("n", ""),
                "EM (95% CI)": with_ci(report, "em"),
                "EM, MERA's reading": with_ci(report, "em_mera"),
                "class accuracy": with_ci(report, "class_accuracy"),
                "MERA judge": with_ci(report, "judge_mera"),
                "items the judges disagree on": len(differ) if differ is not None else 0,
            }
        )
    if not rows:
        return []
    note = "per-class scores with CIs and the disagreeing items: each model's report"
    return [ResultSection(anchor="humor-results", rows=rows, note=note)]


def artifact_results(view: ResultsView, artifact: str) -> list[ResultSection]:
    """Above a model's report: its scores with 95% CIs, and the items where the two judges disagree."""
    report = view.read_json(artifact) if _is_report(artifact) else None
    if not isinstance(report, dict):
        return []
    differ = disagreeing(report)
    if differ is None:
        return []
    out = []
    scores = [f"{name}: {with_ci(report, name, '95% CI ')}" for name in CI_SCORES if _has_ci(report, name)]
    if scores:
        out.append(ResultSection(title="Scores with 95% CIs", anchor="humor-ci", items=scores))
    ours, mera, given = report["judge_scores"], report["judge_mera_scores"], report.get("answers")
    answers: dict[str, Any] = given if isinstance(given, dict) else {}
    rows: list[dict[str, Cell]] = [
        {
            "item": item,
            "our judge": _judged(ours, item),
            "MERA judge": _judged(mera, item),
            "answer": _text(answers, item),
        }
        for item in differ
    ]
    title = f"Items where the readings disagree ({len(rows)})"
    out.append(ResultSection(title=title, anchor="disagreements", rows=rows, empty="none"))
    return out


def _has_ci(report: dict[str, Any], name: str) -> bool:
    return isinstance(report.get(name), (int, float)) and isinstance(report.get(f"{name}_ci95"), dict)


def _judged(scores: dict[str, Any], item: str) -> Cell:
    """A judge's score of ``item``; "missing" where it has none (a failed call: never a 0)."""
    value = scores.get(item)
    return "missing" if value is None else value if isinstance(value, (int, float)) else str(value)


def _text(answers: dict[str, Any], item: str) -> str:
    value = answers.get(item, "")
    return value if isinstance(value, str) else str(value)
