"""A unit's input row in the viewer: from a plug-in stage's ``<stage>.jsonl`` as from ``outputs.jsonl``, with the
column the config names as the reference (``[prompts] reference``) marked."""

from __future__ import annotations

import json
import time
from pathlib import Path

from punchline.data.storage.run_layout import RunLayout
from punchline.data.stores.local import LocalStore
from punchline.viewer.references import RowInputs, reference_names

RUN = "plugin-run"
CONFIG = """
[run]
pipeline = "mine"

[prompts]
reference = "gold"
"""


def _write(store: Path, name: str, rows: list[dict[str, object]]) -> None:
    path = store / RunLayout(RUN).artifact(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def _row(rows: RowInputs, unit_id: str) -> list[tuple[str, str, bool]]:
    """The unit's row, once the file's one pass has reached it (a hang guard, not a timing)."""
    for _ in range(3000):
        fields, note = rows.row(unit_id)
        if fields or not note.startswith("finding"):
            return fields
        time.sleep(0.01)
    raise AssertionError(f"no row for {unit_id}: {note}")


def _lines(questions: list[str], **more: object) -> list[dict[str, object]]:
    return [
        {"question": q, "gold": f"g{i}", "answer_text": "x", "row_id": f"r{i}", "model": m, "sample": 0, **more}
        for i, q in enumerate(questions)
        for m in ("a", "b")
    ]


def test_a_plugin_stage_s_rows_come_from_its_own_file_with_the_named_reference_marked(tmp_path: Path) -> None:
    store = tmp_path / "store"
    _write(store, "answer.jsonl", _lines(["q0", "q1", "q2"]))
    _write(store, "grade.jsonl", _lines(["q0", "q1", "q2"], verdict="correct"))
    _write(store, "notes.jsonl", [{"text": "no rows here"}])  # a stage's own file without output rows
    marked = reference_names(CONFIG)
    assert "gold" in marked and "question" not in marked
    rows = RowInputs(LocalStore(store), RUN, tmp_path / "view", marked)

    fields = _row(rows, "answer/r000000002/m0001")
    assert fields == [("question", "q2", False), ("gold", "g2", True), ("answer_text", "x", False)]
    assert _row(rows, "grade/r000000001/m0000/s0000")[:2] == [("question", "q1", False), ("gold", "g1", True)]
    kept = [tmp_path / "view" / "answer.rows", tmp_path / "view" / "grade.rows"]  # each file's index, kept apart
    for _ in range(3000):  # written once its pass ends (a hang guard)
        if all(path.is_file() for path in kept):
            break
        time.sleep(0.01)
    assert all(path.is_file() for path in kept)
    # a stage whose file holds no output rows reads outputs.jsonl, and says when there is none
    fields, note = rows.row("notes/r000000000/m0000")
    assert fields == [] and "outputs.jsonl" in note


def test_the_generic_stages_outputs_jsonl_serves_every_stage_without_a_file_of_its_own(tmp_path: Path) -> None:
    store = tmp_path / "store"
    _write(store, "outputs.jsonl", _lines(["q0", "q1"]))
    rows = RowInputs(LocalStore(store), RUN, None, reference_names('[prompts]\nreference = "question"\n'))
    assert _row(rows, "generate/r000000001/m0000")[0] == ("question", "q1", True)
    assert _row(rows, "judge/r000000000/m0000/s0000")[0] == ("question", "q0", True)
    assert reference_names("not [ toml") >= {"answer", "reference"}  # an unreadable config: the usual names
