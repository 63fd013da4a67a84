import json
import zipfile
from pathlib import Path

import pytest

from punchline.pipelines.humor.data.judge import judge_stats
from punchline.pipelines.humor.data.metrics import compute_metrics
from punchline.pipelines.humor.data.report import (
    JudgeRetry,
    build_report,
    confusion_title,
    headlines,
    judge_retries,
    retries_of_report,
    write_report,
)
from punchline.pipelines.humor.data.schema import HumorTestFile
from tests.pipelines.humor.data.conftest import make_item

ITEMS = [make_item(1, "ирония,Б"), make_item(2, "каламбур,А"), make_item(3, "не анекдот,Г")]
PREDS = {1: "ОТВЕТ: Ирония\nРЕШЕНИЕ: б", 2: "ОТВЕТ каламбур\nРЕШЕНИЕ А или Б", 3: "  ОТВЕТ не анекдот\nРЕШЕНИЕ Г"}


def test_write_report(tmp_path: Path) -> None:
    metrics, scores = compute_metrics(ITEMS, PREDS, resamples=100)
    judge = judge_stats({1: 1.0, 2: None, 3: 0.0}, {s.id: s.em for s in scores})
    report = build_report(
        metrics,
        scores,
        judge=judge,
        judge_scores={1: 1.0, 2: None, 3: 0.0},
        judge_mera_scores={1: 1.0, 2: 0.5},
        model="70b",
    )
    source = HumorTestFile(access="private", data=ITEMS)
    paths = write_report(tmp_path / "out", source, report, PREDS, stamp="2026-12-01T17-00-00.000000")

    # MERA's submission: the model's own text (lstripped), never our parser's reading of it
    assert paths.submission is not None
    sub = json.loads(Path(paths.submission).read_text(encoding="utf-8"))
    assert sub == {"data": {"test": [{"outputs": PREDS[i].lstrip(), "meta": {"id": i}} for i in (1, 2, 3)]}}

    rep = json.loads(Path(paths.report_json).read_text(encoding="utf-8"))
    assert rep["n"] == 3 and rep["em"] == 2 / 3 and rep["em_mera"] == 1.0  # MERA credits "А или Б" (its first letter)
    assert rep["answers"] == {"1": "ирония,Б", "2": None, "3": "не анекдот,Г"}
    assert (rep["ambiguous"], rep["ambiguous_rate"]) == (1, 1 / 3)  # "А или Б" is a hedge
    assert rep["judge"]["n_missing"] == 1 and rep["judge"]["n_scored"] == 2
    assert rep["judge_scores"] == {"1": 1.0, "2": None, "3": 0.0}
    assert rep["judge_mera"] == pytest.approx(0.5)  # (1 + 0.5 + 0) / 3: item 3 has no MERA judgement -> 0
    for key in ("class_accuracy", "per_class", "per_class_ci95", "confusion", "em_ci95", "em_mera_ci95"):
        assert key in rep

    md = Path(paths.report_md).read_text(encoding="utf-8")
    assert "| ирония | 1 | 1 | 1 | 100.0 [" in md and "| F1 [95 % CI] |" in md
    assert "Cohen's kappa" in md and "## MERA's judge" in md
    assert "| ambiguous answers (hedges, answers that disagree), % | 33.3 (1) |" in md
    assert md.startswith("# Humor (MERA) results: 70b\n")
    # оксюморон: neither present nor predicted: precision, recall and F1 undefined, shown n/a, never 0.0
    assert "| оксюморон | 0 | 0 | 0 | n/a | n/a | n/a |" in md
    assert rep["per_class"]["оксюморон"]["precision"] is None and rep["model"] == "70b"
    assert "| EM (MERA's reading), % | 100.0 [43.9, 100.0] |" in md  # 3/3, Wilson's interval
    assert "| каламбур | 1 | 1 | 1 | 100.0 [20.7, 100.0] | 100.0 [20.7, 100.0] |" in md  # 1/1: Wilson
    assert "judge calls asked again: none" in md
    assert Path(paths.confusion_png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the figure names the model and MERA's score (not our parser's EM: 66.7 %), in its PNG and its SVG
    title = confusion_title(report)
    assert title == "Humor, 70b: class confusion (n = 3; EM, MERA's reading: 100.0 % [43.9, 100.0])"
    assert f"<!-- {title} -->" in Path(paths.confusion_svg).read_text(encoding="utf-8").replace("&#39;", "'")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "Humor.json",
        "confusion.png",
        "confusion.svg",
        "logs_public.zip",
        "report.json",
        "report.md",
    ]
    with zipfile.ZipFile(tmp_path / "out" / "logs_public.zip") as zf:
        assert sorted(zf.namelist()) == [
            "results_2026-12-01T17-00-00.000000.json",
            "samples_humor_2026-12-01T17-00-00.000000.jsonl",
        ]

    lines = {h.label: h for h in headlines(report)}
    assert lines["EM (MERA's reading)"].value == 1.0 and lines["EM (our robust parser)"].value == pytest.approx(2 / 3)
    assert lines["judge (MERA's prompt, 0/1/2 over 2)"].value == pytest.approx(0.5)
    assert lines["judge (ours, binary pass rate)"].value == 0.5


def test_no_submission_while_an_item_has_no_answer(tmp_path: Path) -> None:
    preds = {1: PREDS[1]}
    metrics, scores = compute_metrics(ITEMS, preds, resamples=10)
    paths = write_report(tmp_path, ITEMS, build_report(metrics, scores), preds)
    assert paths.submission is None and not (tmp_path / "Humor.json").exists()
    assert headlines(build_report(metrics, scores))[2].value is None  # not judged


def test_judge_retries_list_each_call_asked_again_and_keep_earlier_ones() -> None:
    before = {1: (0.0, 2), 2: (0.5, 1), 3: (1.0, 0), 4: (0.0, 1)}
    after = {1: (1.0, 0), 2: (0.5, 1), 3: (1.0, 0), 4: (0.5, 0)}  # 2 failed again (or was not asked): not listed
    earlier = [JudgeRetry(item=9, model="70b", judge="j", by="retry-failed", calls=1, score_before=0, score_after=1)]
    got = judge_retries(before, after, {3: 2}, model="70b", judge="j", earlier=earlier)
    assert got == [
        earlier[0],
        JudgeRetry(item=1, model="70b", judge="j", by="retry-failed", calls=2, score_before=0.0, score_after=1.0),
        JudgeRetry(item=3, model="70b", judge="j", by="within the run", calls=2, score_after=1.0),
        JudgeRetry(item=4, model="70b", judge="j", by="retry-failed", calls=1, score_before=0.0, score_after=0.5),
    ]
    assert judge_retries(None, after, {}, model="70b", judge="j") == []  # the stage's first reduce
    assert judge_retries(after, after, {}, model="70b", judge="j", earlier=got) == got  # a reduce again: the same


def test_retries_are_in_report_json_and_md(tmp_path: Path) -> None:
    metrics, scores = compute_metrics(ITEMS, PREDS, resamples=10)
    retried = [JudgeRetry(item=2, model="70b", judge="j", by="retry-failed", calls=1, score_before=0, score_after=0.5)]
    report = build_report(
        metrics, scores, judge_mera_scores={1: 1.0, 2: 0.5}, judge_mera_failed_calls=0, judge_mera_retried=retried
    )
    paths = write_report(tmp_path, ITEMS, report, PREDS)
    assert retries_of_report(Path(paths.report_json).read_bytes()) == retried
    md = Path(paths.report_md).read_text(encoding="utf-8")
    assert "judge calls asked again (MERA asks each once" in md and "1 failed calls answered after retry-failed" in md
    assert "| 2 | 70b | j | retry-failed | 1 | 0 → 0.5 |" in md
    assert retries_of_report(b'{"n": 3}') == []  # a report written before retries were kept
