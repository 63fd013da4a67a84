"""Cloze scoring arithmetic on a hand-computed example, and the report files."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from matplotlib.transforms import Bbox

from punchline.data.errors import InputError
from punchline.data.metrics.intervals import Interval, newcombe_difference, wilson
from punchline.pipelines.puns.data.cloze_report import build_report, classify_word, score, to_markdown, write_report
from punchline.pipelines.puns.data.cloze_run import MAX_TOKENS, STOP, cloze_request, to_response
from punchline.pipelines.puns.data.schemas import ClozeModelResponses, ClozeResponse, ClozeTest, PunEntry

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _png_dpi(blob: bytes) -> float:
    """The resolution a PNG declares (its pHYs chunk, pixels per metre)."""
    at = blob.index(b"pHYs")
    x_ppm, y_ppm, unit = struct.unpack(">IIB", blob[at + 4 : at + 13])
    assert unit == 1 and x_ppm == y_ppm
    return x_ppm * 0.0254


def _test(pair: int, kind: str, c: int) -> ClozeTest:
    return ClozeTest(pair_id=pair, type=kind, prompt=f"ctx {pair} {kind} The target", expected_completion=[],  # type: ignore[arg-type]
                     contrast_completion=[], joke_a_index=90, joke_b_index=91, joke_c_index=c,
                     joke_c_sentence="The target ___", joke_a_tier="balanced", joke_b_tier="leaning",
                     joke_c_tier="straight_dominated", joke_c_balance=0.0)  # fmt: skip


PUNS = [
    PunEntry(index=0, id=0, sentence="The baker ___", straight=["Rest", "fell asleep"], punny=["loafed", "rose up"]),
    PunEntry(index=1, id=1, sentence="The fish ___", straight=["swam"], punny=["schooled", "swam"]),
]
# pairs 0 and 1 target joke 0, pair 2 targets joke 1; tests file order: s0 f0 s1 f1 s2 f2
TESTS = [_test(p, k, c) for p, c in ((0, 0), (1, 0), (2, 1)) for k in ("straight", "funny")]


def _responses(words: list[str], nick: str = "m") -> dict[str, ClozeModelResponses]:
    return {
        nick: ClozeModelResponses(
            model_id=f"org/{nick}",
            responses={str(i): to_response(TESTS[i], w) for i, w in enumerate(words)},
        )
    }


def test_classify_word_rules() -> None:
    straight, punny = PUNS[0].straight, PUNS[0].punny
    assert classify_word("rest", straight, punny) == "straight"  # case-insensitive
    assert classify_word("fell", straight, punny) == "straight"  # first word of a phrase
    assert classify_word("asleep", straight, punny) == "other"  # only the first word counts
    assert classify_word("rose", straight, punny) == "funny"
    assert classify_word("", straight, punny) == "other"
    assert classify_word("swam", PUNS[1].straight, PUNS[1].punny) == "straight"  # straight list first


def test_hand_computed_report() -> None:
    # straight ctx: rest (S), swam (S on joke 1), xyz (O) -> n=3, S=2, F=0, O=1
    # funny ctx:    loafed (F), Rose. (F), schooled (F)   -> n=3, S=0, F=3, O=0
    # model two answers only two straight tests: fell (S), schooled (F on joke 1)
    responses = _responses(["rest", "loafed", "xyz", "Rose.", "swam", "schooled"])
    responses.update(
        {"two": ClozeModelResponses(model_id="org/two", responses={
            "0": to_response(TESTS[0], "fell"), "4": to_response(TESTS[4], "schooled")})}
    )  # fmt: skip
    report = build_report(responses, TESTS, PUNS)
    m = report.models["m"]
    assert (m.straight.n, m.straight.straight, m.straight.funny, m.straight.other) == (3, 2, 0, 1)
    assert (m.funny.n, m.funny.straight, m.funny.funny, m.funny.other) == (3, 0, 3, 0)
    assert (m.straight.p_straight, m.straight.p_other, m.funny.p_funny) == (0.6667, 0.3333, 1.0)
    assert m.delta_funny_pp == 100.0
    two = report.models["two"]
    assert (two.straight.n, two.straight.straight, two.straight.funny) == (2, 1, 1)
    assert (two.funny.n, two.funny.p_funny) == (0, 0.0)
    assert two.delta_funny_pp == -50.0
    md = to_markdown(report)
    assert "| m | straight | 3 | 2 | 0 | 1 | 66.7% | 0.0% | 33.3% |" in md
    # model two answered no funny-context test: its funny rate, and so its shift, are undefined: n/a, never 0.0
    assert "| two | 50.0% | [9.5, 90.5] | n/a | n/a | n/a | n/a |" in md
    assert "| two | funny | 0 | 0 | 0 | 0 | n/a | n/a | n/a |" in md
    assert "| m | 0.0% | [0.0, 56.1] | 100.0% | [43.9, 100.0] | +100.0 | [+20.6, +100.0] |" in md
    assert "95 % Wilson score intervals" in md


def test_write_report_files(tmp_path: Path) -> None:
    report = build_report(_responses(["rest", "loafed", "xyz", "rose", "swam", "schooled"]), TESTS, PUNS)
    out = tmp_path / "report"
    paths = write_report(report, out)
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in paths)
    data = json.loads((out / "report.json").read_text())
    assert list(data) == ["models"]
    assert list(data["models"]["m"]) == ["straight", "funny", "delta_funny_pp"]
    assert {k: data["models"]["m"]["funny"][k] for k in ("n", "straight", "funny", "other")} == {
        "n": 3, "straight": 0, "funny": 3, "other": 0}  # fmt: skip
    assert data["models"]["m"]["delta_funny_pp"] == pytest.approx(100 * (3 / 3 - 0 / 3))
    assert (out / "report.md").read_text().startswith("| Model | Context |")
    for name in ("context_effect", "funny_shift"):
        blob = (out / f"{name}.png").read_bytes()
        assert blob.startswith(PNG_MAGIC) and blob.rstrip(b"\x00").endswith(b"IEND\xaeB`\x82")
        assert round(_png_dpi(blob)) >= 200  # 7874 pixels per metre
        pdf, svg = (out / f"{name}.pdf").read_bytes(), (out / f"{name}.svg").read_bytes()
        assert pdf.startswith(b"%PDF-") and b"CreationDate" not in pdf
        assert svg.startswith(b"<?xml") and b"<svg" in svg and b"<dc:date>" not in svg
    again = write_report(report, tmp_path / "again")  # another rendering: the same bytes, every file
    for first, second in zip(paths, again, strict=True):
        assert first.read_bytes() == second.read_bytes(), first.name


def test_mismatched_response_is_an_input_error() -> None:
    bad = {"m": ClozeModelResponses(model_id="x", responses={
        "1": ClozeResponse(pair_id=0, type="straight", raw_response="a", extracted_word="a")})}  # fmt: skip
    with pytest.raises(InputError) as info:
        score(bad, TESTS, PUNS, file="r.json")
    assert "model 'm' response '1'" in str(info.value) and info.value.field == "pair_id"
    with pytest.raises(InputError, match="no test at position '9'"):
        score({"m": ClozeModelResponses(model_id="x", responses={"9": bad["m"].responses["1"]})}, TESTS, PUNS)


def test_cloze_request_and_response() -> None:
    req = cloze_request("together", "meta-llama/X", TESTS[1])
    assert req.messages[-1].content == TESTS[1].prompt and req.messages[0].role == "system"
    assert (req.temperature, req.max_tokens, req.stop, req.n) == (0.0, MAX_TOKENS, STOP, 1)
    assert req.key() != cloze_request("together", "meta-llama/X", TESTS[0]).key()
    r = to_response(TESTS[3], "  Schooled!\n")
    assert (r.pair_id, r.type, r.raw_response, r.extracted_word) == (1, "funny", "Schooled!", "schooled")
    assert to_response(TESTS[0], None).extracted_word == ""


def test_wilson_and_newcombe_intervals_match_published_values() -> None:
    # Newcombe (1998), Stat. Med. 17:857-872: 0/10 -> (0, 0.2775), 5/10 -> (0.2366, 0.7634),
    # 56/70 - 48/80 -> (0.0524, 0.3339)
    def bounds(iv: Interval | None) -> tuple[float, float]:
        assert iv is not None
        return iv.low, iv.high

    assert bounds(wilson(0, 10)) == (0.0, pytest.approx(0.2775, abs=1e-4))
    assert bounds(wilson(5, 10)) == (pytest.approx(0.2366, abs=1e-4), pytest.approx(0.7634, abs=1e-4))
    lo, hi = bounds(newcombe_difference(56, 70, 48, 80))
    assert (lo, hi) == (pytest.approx(0.0524, abs=1e-4), pytest.approx(0.3339, abs=1e-4))
    assert wilson(0, 0) is None  # nothing known: undefined, not [0, 1] read as a measurement
    assert bounds(wilson(0, 15))[1] == pytest.approx(0.2039, abs=1e-4)  # what n = 15 says about a 0


def _overlap(a: Bbox, b: Bbox) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_figures_show_zeros_intervals_and_the_tables_numbers_with_legends_clear_of_the_axes() -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.collections import LineCollection

    from punchline.pipelines.puns.data.plots import OKABE_ITO, figure_context_effect, figure_funny_shift

    # model m never puns in straight context (0 of 3): that series must still be drawn
    report = build_report(_responses(["rest", "loafed", "xyz", "rose", "swam", "schooled"]), TESTS, PUNS)
    md = to_markdown(report)
    for make in (figure_context_effect, figure_funny_shift):
        fig = make(report)
        FigureCanvasAgg(fig).draw()
        renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
        axes = fig.axes
        legends = [*fig.legends, *(ax.get_legend() for ax in axes if ax.get_legend() is not None)]
        assert legends
        for legend in legends:
            assert not any(_overlap(legend.get_window_extent(renderer), ax.get_window_extent(renderer)) for ax in axes)
        zero_markers = [
            ln for ax in axes for ln in ax.lines if ln.get_marker() == "D" and list(ln.get_ydata()) == [0.0]
        ]
        assert zero_markers, make.__name__
        whiskers = [c for ax in axes for c in ax.collections if isinstance(c, LineCollection)]
        assert whiskers  # the interval of every bar, the zeros' included
        faces = {p.get_facecolor()[:3] for ax in axes for p in ax.patches}
        okabe = {tuple(int(h[i : i + 2], 16) / 255 for i in (1, 3, 5)) for h in OKABE_ITO.values()}
        assert faces and all(
            any(all(abs(a - b) < 1e-3 for a, b in zip(face, rgb, strict=True)) for rgb in okabe) for face in faces
        )
    shift = figure_funny_shift(report)
    texts = [t.get_text() for t in shift.axes[0].texts]
    m = report.models["m"]
    assert f"{m.delta_funny_pp:+.1f} pp" in "\n".join(texts) and f"| {m.delta_funny_pp:+.1f} |" in md
    for rate in (m.straight.p_funny, m.funny.p_funny):
        label = f"{rate * 100:.1f}%"
        assert label in texts and f"| {label} |" in md


def test_an_undefined_rate_is_drawn_na_not_zero() -> None:
    from punchline.pipelines.puns.data.plots import figure_context_effect, figure_funny_shift

    responses = _responses(["rest", "loafed", "xyz", "Rose.", "swam", "schooled"])
    responses["two"] = ClozeModelResponses(model_id="org/two", responses={"0": to_response(TESTS[0], "fell")})
    report = build_report(responses, TESTS, PUNS)  # two: no funny-context answer
    shift = figure_funny_shift(report)
    texts = [t.get_text() for t in shift.axes[0].texts]
    assert texts.count("n/a") == 1 and "shift n/a" in texts  # two's funny-context rate and its shift
    assert "Funny-answer rate" in shift.axes[0].get_title()
    context = figure_context_effect(report)
    assert sum(t.get_text() == "n/a" for ax in context.axes for t in ax.texts) == 3  # straight, funny, other
