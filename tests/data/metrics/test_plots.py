"""The figures: PNG beside SVG, the same bytes on every run, an undefined value written n/a."""

from __future__ import annotations

from punchline.data.metrics.paired import compare_models
from punchline.data.metrics.plots import error_bars, paired_differences, write_figure
from punchline.data.metrics.tables import proportion


class Sink:
    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}

    def write_artifact(self, name: str, data: bytes) -> None:
        self.files[name] = data


def test_error_bars_are_png_and_svg_deterministic_and_show_undefined() -> None:
    table = {"exact": {"a": proportion(5, 24), "b": proportion(0, 0)}, "judge": {"a": proportion(7, 24)}}
    fig = error_bars(table, title="Accuracy by model", ylabel="% right")
    assert fig["png"].startswith(b"\x89PNG") and b"<svg" in fig["svg"]
    assert error_bars(table, title="Accuracy by model", ylabel="% right") == fig
    svg = fig["svg"].decode()
    # text is drawn as paths (no font needed), each after a comment holding it
    assert "<!-- Accuracy by model -->" in svg and "<!-- n/a -->" in svg and "<!-- 20.8 -->" in svg
    assert "<!-- 0.0 -->" not in svg  # b's undefined rate is not drawn as a zero
    sink = Sink()
    assert write_figure(sink, "accuracy", fig) == ["accuracy.png", "accuracy.svg"]
    assert sink.files["accuracy.svg"] == fig["svg"]
    single = error_bars({"a": proportion(1, 2)}, title="t", ylabel="y", formats=("png",))
    assert list(single) == ["png"]


def test_paired_differences() -> None:
    pairs = compare_models({"a": {i: float(i % 2) for i in range(20)}, "b": {i: 0.0 for i in range(20)}})
    fig = paired_differences({"exact": pairs}, title="a against b on the same items")
    assert fig["png"].startswith(b"\x89PNG") and fig == paired_differences(
        {"exact": pairs}, title="a against b on the same items"
    )
    empty = compare_models({"a": {1: 1.0}, "b": {2: 1.0}})
    assert paired_differences(empty, title="none shared")["svg"].startswith(b"<?xml")
