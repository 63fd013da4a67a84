"""Each built-in pipeline describes its own results (its ``results`` / ``artifact_results`` hooks), and the viewer
renders the sections with its own escaping: Puns' tiers and cloze report, Humor's per-model scores and its judges'
disagreements, the prompts pipeline's per-model counts. The engine names none of them (tests/cluster/test_registry.py).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec

from punchline.cluster.config import load_config
from punchline.cluster.pipeline_base import BasePipeline, WithDefaults, with_defaults
from punchline.cluster.result_sections import Link, ResultSection, ResultsView
from punchline.cluster.stages.generate import model_counts
from punchline.cluster.stages.outputs import OutputRow
from punchline.data.stores.local import LocalStore
from punchline.pipelines.humor.pipeline import PIPELINE as HUMOR
from punchline.pipelines.prompts.pipeline import PIPELINE as PROMPTS
from punchline.pipelines.puns.pipeline import PIPELINE as PUNS
from punchline.viewer.pipeline_results import RunPipeline, render_sections

ROOT = Path(__file__).resolve().parents[2]
LINK = "/run/r/artifact/"


def view_of(tmp_path: Path, files: dict[str, bytes], settings: Any = None) -> ResultsView:
    store = LocalStore(tmp_path)
    for name, data in files.items():
        store.put(f"r/artifacts/{name}", data)
    return ResultsView(store, "r", sorted(files), settings)


def test_puns_results_tiers_and_cloze(tmp_path: Path) -> None:
    ranked = [{"id": i, "cloze_tier": tier} for i, tier in enumerate(["balanced", "leaning", "balanced"])]
    report = b"# Cloze\n| Model | P(funny \\| funny ctx) |\n|---|---|\n| 3b | <b>13.3%</b> |\n"
    view = view_of(tmp_path, {"puns_ranked.json": msgspec.json.encode(ranked), "cloze_report/report.md": report})
    html = render_sections(PUNS.results(view), LINK)
    assert "<td>balanced</td><td>2</td>" in html and "<td>leaning</td><td>1</td>" in html
    assert "<th>P(funny | funny ctx)</th>" in html and "<td>&lt;b&gt;13.3%&lt;/b&gt;</td>" in html  # text, escaped
    assert PUNS.results(view_of(tmp_path / "none", {})) == []  # a run before its rank stage: nothing to show


def humor_report(em: float, ours: dict[str, Any], mera: dict[str, Any]) -> bytes:
    report = {
        "n": len(ours),
        "em": em,
        "em_ci95": {"low": em - 0.1, "high": em + 0.1},
        "judge_mera": 0.5,
        "judge_mera_ci95": {"low": 0.25, "high": 0.75},
        "judge_scores": ours,
        "judge_mera_scores": mera,
        "answers": {"1": "<script>alert(1)</script>", "2": "B"},
    }
    return msgspec.json.encode(report)


def test_humor_results_and_disagreements(tmp_path: Path) -> None:
    files = {
        "report/8b/report.json": humor_report(0.5, {"1": 1.0, "2": 0.0, "3": 1.0}, {"1": 0.0, "2": 0.0, "3": None}),
        "report/70b/report.json": humor_report(0.75, {"1": 1.0}, {"1": 1.0}),
        "answers/8b.jsonl": b"{}\n",
    }
    view = view_of(tmp_path, files)
    page = render_sections(HUMOR.results(view), LINK)
    table = re.search(r'<section class=\'results\' id="humor-results">(.*?)</section>', page)
    assert table is not None and table.group(1).count("<tr>") == 3  # a header and a row a model
    assert f"<a href='{LINK}report/8b/report.json'>8b</a>" in page
    assert "0.500 (0.400-0.600)" in page and "0.750 (0.650-0.850)" in page
    rows = re.findall(r"<tr><td><a [^>]*>(\w+)</a></td>.*?<td>(\d+)</td></tr>", page)
    assert rows == [("70b", "0"), ("8b", "2")]  # items the judges disagree on: 1 and 3

    shown = render_sections(HUMOR.artifact_results(view, "report/8b/report.json"), LINK, level=2)
    ci = re.search(r'id="humor-ci">(.*?)</section>', shown)
    assert ci is not None and "95% CI" in ci.group(1) and "em: 0.500 (95% CI 0.400-0.600)" in ci.group(1)
    assert 'id="disagreements"><h2>Items where the readings disagree (2)</h2>' in shown
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in shown and "<script>" not in shown  # an answer is text
    assert "<td>3</td><td>1</td><td>missing</td>" in shown  # MERA's judge had no score of item 3
    assert HUMOR.artifact_results(view, "answers/8b.jsonl") == []  # not a report: nothing above it
    agree = render_sections(HUMOR.artifact_results(view, "report/70b/report.json"), LINK)
    assert "(0)</h3><p>none</p>" in agree


def output_row(model: str, text: str | None, parsed: bool, verdict: str | None) -> bytes:
    row = OutputRow(
        row_id="q1",
        model=model,
        sample=0,
        text=text,
        parsed={"answer": "x"} if parsed else None,
        judge_parsed={"verdict": verdict} if verdict is not None else None,
    )
    return msgspec.json.encode(row) + b"\n"


def test_prompts_results_per_model(tmp_path: Path) -> None:
    settings = load_config(ROOT / "configs" / "prompts_demo.toml").settings
    lines = [
        output_row("8b", "a", True, "correct"),
        output_row("8b", "b", False, "incorrect"),
        output_row("8b", None, False, None),  # failed after its retries
        output_row("70b", "c", True, "correct"),
        output_row("70b", "d", True, "correct"),
        output_row("elsewhere", "e", True, "correct"),  # no model of this run's
    ]
    view = view_of(tmp_path, {"outputs.jsonl": b"".join(lines)}, settings)
    [section] = PROMPTS.results(view)
    assert section.anchor == "prompts-results"
    assert section.rows == [
        {"model": "8b", "samples": 3, "answered": 2, "parsed": "50%", "judge: correct": 1, "judge: incorrect": 1},
        {"model": "70b", "samples": 2, "answered": 2, "parsed": "100%", "judge: correct": 2, "judge: incorrect": 0},
    ]
    assert "<th>judge: incorrect</th>" in render_sections([section], LINK)
    # the headlines count the same way (one counting for both)
    counts = model_counts(settings, [msgspec.json.decode(line, type=OutputRow) for line in lines])
    assert [(c.model, c.answered, c.parsed, c.verdicts) for c in counts] == [
        ("8b", 2, 1, {"correct": 1, "incorrect": 1}),
        ("70b", 2, 2, {"correct": 2}),
    ]
    assert PROMPTS.results(view_of(tmp_path / "none", {})) == []  # no outputs yet
    [unreadable] = PROMPTS.results(view_of(tmp_path / "old", {"outputs.jsonl": lines[0]}, settings=None))
    assert "not readable" in unreadable.note


def test_a_large_outputs_file_is_counted_by_its_head(tmp_path: Path, monkeypatch: Any) -> None:
    settings = load_config(ROOT / "configs" / "prompts_demo.toml").settings
    line = output_row("8b", "a", True, "correct")
    view = view_of(tmp_path, {"outputs.jsonl": line * 10}, settings)
    monkeypatch.setattr(view, "read_head", lambda name: ((line * 10)[: len(line) * 3 + 5], True))
    [section] = PROMPTS.results(view)
    assert section.rows[0]["samples"] == 3 and "first 3 rows" in section.note  # the cut line is not read


class Broken:
    """A plug-in whose results hook raises, and whose artifact hook returns something that is no section."""

    name = "broken"

    def stages(self, cfg: Any) -> list[Any]:
        return []

    def results(self, view: ResultsView) -> list[ResultSection]:
        raise RuntimeError("boom\nsecond line")

    def artifact_results(self, view: ResultsView, artifact: str) -> Any:
        return "<b>raw html</b>"


def test_a_pipeline_that_cannot_answer_is_one_line(tmp_path: Path) -> None:
    view = view_of(tmp_path, {"x.json": b"{}"})
    missing = RunPipeline("no-such-pipeline", "")
    sections, note = missing.sections(view, "results")
    assert sections == [] and note.startswith("the no-such-pipeline pipeline cannot be loaded here: ConfigError")
    broken = RunPipeline(f"{__name__}:Broken", "[broken]\n")
    assert broken.sections(view, "results") == (
        [],
        f"the {__name__}:Broken pipeline's results failed: RuntimeError: boom",
    )
    sections, note = broken.sections(view, "artifact_results", "x.json")
    assert sections == [] and "returned str, not a list of ResultSection" in note
    assert "<b>" not in render_sections([], LINK, note)
    # a pipeline without the hooks (an object with name and stages) gets the defaults: nothing to show
    bare = with_defaults(type("Bare", (), {"name": "bare", "stages": lambda self, cfg: []})(), ["stages"])
    assert isinstance(bare, WithDefaults) and bare.results(view) == [] and bare.artifact_results(view, "x") == []
    assert BasePipeline().results(view) == []


def test_every_text_of_a_section_is_escaped(tmp_path: Path) -> None:
    section = ResultSection(
        title="<i>t</i>",
        anchor='a"b',
        items=["<li>"],
        rows=[{"name": Link("<x>", "../../etc/passwd?q='"), "v": 0.123456, "none": None}],
        note="&",
    )
    html = render_sections([section], LINK)
    assert "<i>" not in html and "&lt;i&gt;t&lt;/i&gt;" in html and 'id="a&quot;b"' in html
    assert f"<a href='{LINK}../../etc/passwd?q=&#x27;'>&lt;x&gt;</a>" in html  # quoted
    assert "<td>0.1235</td><td></td>" in html and "<p>&amp;</p>" in html
