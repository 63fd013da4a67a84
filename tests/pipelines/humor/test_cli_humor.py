import json
from pathlib import Path

import pytest

from punchline.cluster.cli.main import main

SAMPLE = Path(__file__).resolve().parents[3] / "data" / "samples" / "humor_sample.json"


def _predictions(tmp_path: Path, lines: list[str]) -> Path:
    p = tmp_path / "pred.jsonl"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


def test_validate_sample(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["humor", "validate", str(SAMPLE)]) == 0
    out = capsys.readouterr().out
    assert "24 items" in out and "OK" in out
    assert main(["humor", "validate", str(SAMPLE), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["n"] == 24 and rep["errors"] == [] and rep["chi2_p_value"] == 1.0


def test_validate_bad_file_exits_non_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(SAMPLE.read_text(encoding="utf-8"))
    data["data"][0]["outputs"] = "сарказм,Б"
    data["data"][1]["meta"]["id"] = data["data"][2]["meta"]["id"]
    data["data"][3]["inputs"]["option_b"] = data["data"][3]["inputs"]["main_text"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    assert main(["humor", "validate", str(bad), "--json"]) == 1
    rep = json.loads(capsys.readouterr().out)
    assert {e["field"] for e in rep["errors"]} == {"outputs", "meta.id", "inputs.option_b"}
    assert main(["humor", "validate", str(bad)]) == 1
    assert "3 errors" in capsys.readouterr().out


def test_score_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    items = json.loads(SAMPLE.read_text(encoding="utf-8"))["data"]
    lines = []
    for k, item in enumerate(items):
        cls, letter = item["outputs"].split(",")
        if k < 12:  # right, in the official format
            text = f"ОТВЕТ {cls}\nРЕШЕНИЕ {letter}"
        elif k < 18:  # right, in a format only the robust parser reads
            text = f"**Ответ:** «{cls}»\n**Решение:** {letter}"
        elif k < 23:  # unparseable
            text = "Затрудняюсь ответить."
        else:
            continue  # one missing prediction
        lines.append(json.dumps({"id": item["meta"]["id"], "text": text}, ensure_ascii=False))
    preds = _predictions(tmp_path, lines)
    judge = tmp_path / "judge.jsonl"
    judge.write_text(
        "\n".join(
            [
                json.dumps({"id": items[0]["meta"]["id"], "score": 1}),
                json.dumps({"id": items[1]["meta"]["id"], "text": "SCORE: 0"}),
            ]
        )
    )
    out = tmp_path / "out"
    argv = ["humor", "score", "--data", str(SAMPLE), "--predictions", str(preds), "--out", str(out)]
    mera_judge = tmp_path / "judge_mera.jsonl"
    mera_judge.write_text(
        json.dumps({"id": items[0]["meta"]["id"], "text": "Оценка: 2"})
        + "\n"
        + json.dumps({"id": items[1]["meta"]["id"], "score": 0.5})
        + "\n"
    )
    argv += ["--judge-mera-scores", str(mera_judge)]
    assert main([*argv, "--judge-scores", str(judge), "--bootstrap", "200"]) == 0
    printed = capsys.readouterr().out
    assert "EM (MERA's reading)" in printed and "50.0 %" in printed
    rep = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert rep["n"] == 24 and rep["n_missing"] == 1
    assert rep["em"] == pytest.approx(18 / 24) and rep["em_mera"] == pytest.approx(12 / 24)
    assert rep["parse_failure_rate"] == pytest.approx(6 / 24)
    assert rep["judge"]["n_scored"] == 2 and rep["judge"]["n_missing"] == 22
    assert rep["judge_mera"] == pytest.approx(1.5 / 24)  # 1 + 0.5; items without a MERA judgement score 0
    assert not (out / "Humor.json").exists()  # one item has no answer: no MERA submission
    assert (out / "report.md").is_file() and (out / "confusion.png").stat().st_size > 1000


def test_score_bad_prediction_line_names_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    preds = _predictions(tmp_path, ['{"id": 1, "text": "x"}', '{"id": 2}'])
    argv = ["humor", "score", "--data", str(SAMPLE), "--predictions", str(preds), "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "line 2" in err and "text" in err
    assert not (tmp_path / "o").exists()


def test_run_takes_the_run_options_and_names_a_missing_config(capsys: pytest.CaptureFixture[str]) -> None:
    from punchline.cluster.cli.main import build_parser
    from punchline.pipelines.humor.commands import cmd_run

    args = build_parser().parse_args(["humor", "run", "--store", "s3://b/p", "configs/humor.toml", "--offline"])
    assert args.func is cmd_run and args.config == "configs/humor.toml"
    assert args.store == "s3://b/p" and args.offline is True
    assert main(["humor", "run", "nonexistent.toml"]) == 2
    assert "nonexistent.toml" in capsys.readouterr().err
