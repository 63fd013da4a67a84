import json
from pathlib import Path

import msgspec

from punchline.data.humor.judge import judge_stats
from punchline.data.humor.loaders import load_humor
from punchline.data.humor.metrics import compute_metrics
from punchline.data.humor.report import build_report, submission, write_report
from punchline.data.humor.schema import HumorTestFile
from tests.data.humor.conftest import make_item

ITEMS = [make_item(1, "ирония,Б"), make_item(2, "каламбур,А"), make_item(3, "не анекдот,Г")]
PREDS = {1: "ОТВЕТ: Ирония\nРЕШЕНИЕ: б", 2: "ОТВЕТ каламбур\nРЕШЕНИЕ А или Б", 3: "ОТВЕТ не анекдот\nРЕШЕНИЕ Г"}


def test_write_report(tmp_path: Path) -> None:
    metrics, scores = compute_metrics(ITEMS, PREDS, resamples=100)
    judge = judge_stats({1: 1.0, 2: None, 3: 0.0}, {s.id: s.em for s in scores})
    report = build_report(metrics, scores, judge=judge, judge_scores={1: 1.0, 2: None, 3: 0.0})
    source = HumorTestFile(access="private", data=ITEMS)
    paths = write_report(tmp_path / "out", source, report)

    sub = json.loads(Path(paths.submission).read_text(encoding="utf-8"))
    assert sub["access"] == "private"
    assert [d["outputs"] for d in sub["data"]] == ["ирония,Б", "", "не анекдот,Г"]
    assert sub["data"][0]["inputs"] == msgspec.to_builtins(ITEMS[0].inputs)
    # the submission reloads as a valid data file
    assert [it.outputs for it in load_humor(paths.submission).data] == ["ирония,Б", "", "не анекдот,Г"]

    rep = json.loads(Path(paths.report_json).read_text(encoding="utf-8"))
    assert rep["n"] == 3 and rep["em"] == 2 / 3 and rep["em_mera"] == 1.0  # MERA credits "А или Б" (its first letter)
    assert rep["answers"] == {"1": "ирония,Б", "2": None, "3": "не анекдот,Г"}
    assert (rep["ambiguous"], rep["ambiguous_rate"]) == (1, 1 / 3)  # "А или Б" is a hedge
    assert rep["judge"]["n_missing"] == 1 and rep["judge"]["n_scored"] == 2
    assert rep["judge_scores"] == {"1": 1.0, "2": None, "3": 0.0}
    for key in ("class_accuracy", "letter_accuracy", "per_class", "confusion", "predicted_letters", "em_ci95"):
        assert key in rep

    md = Path(paths.report_md).read_text(encoding="utf-8")
    assert "| ирония | 1 | 1 | 1 | 100.0 | 100.0 | 100.0 |" in md
    assert "| каламбур | 1 | 1 | 1 | 100.0 | 100.0 | 100.0 |" in md  # the class was read; the letter was a hedge
    assert "Cohen's kappa" in md
    assert "| ambiguous answers (hedges, answers that disagree), % | 33.3 (1) |" in md
    assert Path(paths.confusion_png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "confusion.png",
        "report.json",
        "report.md",
        "submission.json",
    ]


def test_submission_of_a_plain_list_uses_shots_layout() -> None:
    sub = submission(ITEMS, {1: "ирония,Б"})
    assert not isinstance(sub, HumorTestFile)
    assert [it.outputs for it in sub.data] == ["ирония,Б", "", ""]
