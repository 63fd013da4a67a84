"""``punchline puns ...`` end to end through ``cluster.cli.main``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from punchline.cluster.cli.main import main
from punchline.pipelines.puns.data.cloze_report import classify_word


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def built(shared_puns: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("puns_cli")
    ranked, tests = d / "ranked.json", d / "tests.json"
    assert main(["puns", "rank", "--classified", str(shared_puns / "classified_completions.json"),
                 "--puns", str(shared_puns / "puns_205.json"), "--out", str(ranked),
                 "--plot", str(d / "tiers.png")]) == 0  # fmt: skip
    assert main(["puns", "cloze", "--puns", str(ranked), "--out", str(tests)]) == 0
    return ranked, tests


def test_rank_and_cloze(shared_puns: Path, built: tuple[Path, Path]) -> None:
    ranked, tests = built
    assert ranked.read_bytes() == (shared_puns / "puns_205.json").read_bytes()
    assert (ranked.parent / "tiers.png").read_bytes().startswith(b"\x89PNG")
    data = json.loads(tests.read_text())
    assert len(data) == 100 and [t["pair_id"] for t in data[:4]] == [0, 0, 1, 1]


def test_cloze_seed_and_pairs(capsys: pytest.CaptureFixture[str], built: tuple[Path, Path], tmp_path: Path) -> None:
    ranked, tests = built
    out = tmp_path / "t.json"
    code, stdout, _ = _run(capsys, "puns", "cloze", "--puns", str(ranked), "--seed", "7", "--pairs", "5",
                           "--out", str(out))  # fmt: skip
    assert code == 0 and "10 tests" in stdout
    data = json.loads(out.read_text())
    assert len(data) == 10
    assert [t["joke_c_index"] for t in data] != [t["joke_c_index"] for t in json.loads(tests.read_text())[:10]]


def test_cloze_report(capsys: pytest.CaptureFixture[str], shared_puns: Path, built: tuple[Path, Path],
                      tmp_path: Path) -> None:  # fmt: skip
    ranked, tests_path = built
    tests = json.loads(tests_path.read_text())
    puns = {p["index"]: p for p in json.loads(ranked.read_text())}

    def answers(pick: str) -> dict:
        return {str(i): {"pair_id": t["pair_id"], "type": t["type"], "raw_response": t[pick][0].title() + ".",
                         "extracted_word": t[pick][0].split()[0]} for i, t in enumerate(tests)}  # fmt: skip

    responses = {"follows": {"model_id": "org/f", "responses": answers("expected_completion")},
                 "contrary": {"model_id": "org/c", "responses": answers("contrast_completion")}}  # fmt: skip
    rpath = tmp_path / "responses.json"
    rpath.write_text(json.dumps(responses))
    out = tmp_path / "report"
    code, stdout, err = _run(capsys, "puns", "cloze-report", "--responses", str(rpath), "--tests",
                             str(tests_path), "--puns", str(ranked), "--out", str(out))  # fmt: skip
    assert code == 0, err
    assert "| follows | straight | 50 |" in stdout
    report = json.loads((out / "report.json").read_text())["models"]
    for nick, pick in (("follows", "expected_completion"), ("contrary", "contrast_completion")):
        want = {"straight": {"straight": 0, "funny": 0, "other": 0}, "funny": {"straight": 0, "funny": 0, "other": 0}}
        for t in tests:
            c = puns[t["joke_c_index"]]
            want[t["type"]][classify_word(t[pick][0].split()[0], c["straight"], c["punny"])] += 1
        for ctx in ("straight", "funny"):
            got = report[nick][ctx]
            assert got["n"] == 50
            assert {k: got[k] for k in ("straight", "funny", "other")} == want[ctx]
        delta = (want["funny"]["funny"] - want["straight"]["funny"]) * 100 / 50
        assert report[nick]["delta_funny_pp"] == pytest.approx(delta, abs=0.01)
    assert report["follows"]["delta_funny_pp"] > 80 and report["contrary"]["delta_funny_pp"] < -80
    figures = {f"{name}.{fmt}" for name in ("context_effect", "funny_shift") for fmt in ("png", "pdf", "svg")}
    assert {p.name for p in out.iterdir()} == {"report.json", "report.md", *figures}


def _bad_puns(shared_puns: Path, tmp_path: Path) -> Path:
    data = json.loads((shared_puns / "puns_205.json").read_text())
    data[17]["sentence"] = "Two ___ blanks ___"
    p = tmp_path / "bad_puns.json"
    p.write_text(json.dumps(data, indent=2))
    return p


def test_rank_bad_input_leaves_out_alone(capsys: pytest.CaptureFixture[str], shared_puns: Path,
                                         tmp_path: Path) -> None:  # fmt: skip
    bad = _bad_puns(shared_puns, tmp_path)
    out = tmp_path / "out.json"
    code, _, err = _run(capsys, "puns", "rank", "--classified", str(shared_puns / "classified_completions.json"),
                        "--puns", str(bad), "--out", str(out))  # fmt: skip
    assert code == 2
    assert str(bad) in err and "joke index 17 (position 17)" in err and "'sentence'" in err
    assert not out.exists()
    out.write_text("keep me")
    assert main(["puns", "rank", "--classified", str(bad), "--puns", str(bad), "--out", str(out)]) == 2
    assert out.read_text() == "keep me"
    # a --plot that is a folder is refused before anything is written
    code, _, err = _run(capsys, "puns", "rank", "--classified", str(shared_puns / "classified_completions.json"),
                        "--puns", str(shared_puns / "puns_205.json"), "--out", str(tmp_path / "new.json"),
                        "--plot", str(tmp_path))  # fmt: skip
    assert code == 2 and "is a directory" in err and not (tmp_path / "new.json").exists()


def test_cloze_errors(capsys: pytest.CaptureFixture[str], shared_puns: Path, built: tuple[Path, Path],
                      tmp_path: Path) -> None:  # fmt: skip
    ranked, _ = built
    out = tmp_path / "t.json"
    code, _, err = _run(capsys, "puns", "cloze", "--puns", str(ranked), "--pairs", "89", "--out", str(out))
    assert code == 2 and "need 89 straight_dominated" in err and "found 88" in err and not out.exists()
    code, _, err = _run(capsys, "puns", "cloze", "--puns", str(shared_puns / "nope.json"), "--out", str(out))
    assert code == 2 and "file not found" in err and not out.exists()
    unranked = tmp_path / "unranked.json"
    data = json.loads(ranked.read_text())
    data[3]["cloze_tier"] = "sideways"
    unranked.write_text(json.dumps(data))
    code, _, err = _run(capsys, "puns", "cloze", "--puns", str(unranked), "--out", str(out))
    assert code == 2 and "'cloze_tier'" in err and "position 3" in err and not out.exists()


def test_cloze_report_unknown_joke(capsys: pytest.CaptureFixture[str], built: tuple[Path, Path],
                                   tmp_path: Path) -> None:  # fmt: skip
    ranked, tests_path = built
    tests = json.loads(tests_path.read_text())
    tests[5]["joke_c_index"] = 4242
    bad_tests = tmp_path / "tests.json"
    bad_tests.write_text(json.dumps(tests))
    responses = tmp_path / "r.json"
    responses.write_text(json.dumps({"m": {"model_id": "x", "responses": {}}}))
    out = tmp_path / "report"
    code, _, err = _run(capsys, "puns", "cloze-report", "--responses", str(responses), "--tests", str(bad_tests),
                        "--puns", str(ranked), "--out", str(out))  # fmt: skip
    assert code == 2 and str(bad_tests) in err and "test 5" in err and "'joke_c_index'" in err and "4242" in err
    assert not out.exists()
    responses.write_text("{not json")
    code, _, err = _run(capsys, "puns", "cloze-report", "--responses", str(responses), "--tests", str(tests_path),
                        "--puns", str(ranked), "--out", str(out))  # fmt: skip
    assert code == 2 and "malformed JSON" in err and not out.exists()


def test_validate(capsys: pytest.CaptureFixture[str], shared_puns: Path) -> None:
    code, out, _ = _run(capsys, "puns", "validate", str(shared_puns / "puns_205.json"))
    assert code == 0 and "205 jokes" in out and "balanced 42" in out
