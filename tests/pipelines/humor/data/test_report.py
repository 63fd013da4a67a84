import json
import zipfile
from pathlib import Path

import pytest

from punchline.pipelines.humor.data.judge import judge_stats
from punchline.pipelines.humor.data.metrics import compute_metrics
from punchline.pipelines.humor.data.report import build_report, headlines, write_report
from punchline.pipelines.humor.data.schema import HumorTestFile
from tests.pipelines.humor.data.conftest import make_item

ITEMS = [make_item(1, "ирония,Б"), make_item(2, "каламбур,А"), make_item(3, "не анекдот,Г")]
PREDS = {1: "ОТВЕТ: Ирония\nРЕШЕНИЕ: б", 2: "ОТВЕТ каламбур\nРЕШЕНИЕ А или Б", 3: "  ОТВЕТ не анекдот\nРЕШЕНИЕ Г"}


def test_write_report(tmp_path: Path) -> None:
    metrics, scores = compute_metrics(ITEMS, PREDS, resamples=100)
    judge = judge_stats({1: 1.0, 2: None, 3: 0.0}, {s.id: s.em for s in scores})
    report = build_report(
        metrics, scores, judge=judge, judge_scores={1: 1.0, 2: None, 3: 0.0}, judge_mera_scores={1: 1.0, 2: 0.5}
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
    assert Path(paths.confusion_png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "Humor.json",
        "confusion.png",
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
