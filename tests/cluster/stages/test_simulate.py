"""What the generic stages tell the simulated provider: every planned request is found by the prompt the simulator
reads off it, answered so that the stage's own parser reads it, right at the model's rate; a judge's request is
found around the answer it grades. Driver side (``simulated_answers``) and simulator side (:class:`StageBook`)
together, without HTTP: the prompts are the stage's planned requests, split as the simulator splits a request.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from punchline.cluster.config import load_config
from punchline.cluster.pipeline import StageContext
from punchline.cluster.stages import generate as prompts
from punchline.cluster.stages.outputs import OutputRow
from punchline.cluster.stages.simulate import split_prompt
from punchline.data.errors import InputError
from punchline.data.requests import ProviderRequest
from punchline.data.simulator import SimRequest
from punchline.data.stores.local import LocalStore
from punchline.workers.fake.stage_answers import StageBook

ROWS = 120


def config(tmp_path: Path, *, parse: str, extra: str = "", columns: str = "answer") -> Any:
    rows = [
        {"id": f"q{i:03d}", "question": f"Question {i}?", "options": ["A", "B", "C", "D"], columns: "ABCD"[i % 4]}
        for i in range(ROWS)
    ]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "c.toml").write_text(f"""
[run]
pipeline = "prompts"

[providers.sim]
kind = "openai"
base_url = "simulated"

[providers.sim.models]
small = {{ id = "sim-small-8b" }}
large = {{ id = "sim-large-70b" }}
judge = {{ id = "sim-judge-70b" }}

[prompts]
data = "rows.jsonl"
provider = "sim"
models = ["small", "large"]
n = 1
temperature = 1.0
prompt = \"\"\"{{{{ question }}}}
Options: {{{{ options | join(" | ") }}}}
Reply with the letter of one option.\"\"\"
{extra}

[prompts.parse]
{parse}

[prompts.judge]
model = "judge"
prompt = \"\"\"Question: {{{{ question }}}}
Reference: {{{{ row.{columns} }}}}
Response: {{{{ response | replace("\\n", " ") }}}}
Reply GRADE: yes or GRADE: no.\"\"\"
parse = {{ regex = 'GRADE: (?P<grade>yes|no)' }}
""")
    return load_config(tmp_path / "c.toml")


def sim_request(request: ProviderRequest, key: str) -> SimRequest:
    system, user = split_prompt(request.messages)
    return SimRequest(
        key=key, choice=0, model=request.model, system=system, user=user, temperature=1.0, seed=3,
        noise_rate=0.15, format_variant_rate=0.2, judge_flip_rate=0.05,
    )  # fmt: skip


def book_of(cfg: Any, accuracy: dict[str, float]) -> StageBook:
    answers = [a for stage in prompts.stages(cfg) for a in stage.simulated_answers(cfg)]
    return StageBook(answers, accuracy)


@pytest.mark.parametrize(
    "parse",
    [
        "regex = 'Answer:\\s*(?P<answer>[ABCD])'",
        'json_schema = { type = "object", required = ["answer"], properties = { answer = { enum = ["A", "B", "C"'
        ', "D"] } } }',
    ],
)
def test_every_planned_request_is_answered_as_its_parser_reads_right_at_its_models_rate(
    tmp_path: Path, parse: str
) -> None:
    cfg = config(tmp_path, parse=parse)
    book = book_of(cfg, {"small": 0.25, "large": 0.9})
    job = prompts.Job(cfg)
    assert job.compiled.parser is not None
    right: dict[str, list[bool]] = {"sim-small-8b": [], "sim-large-70b": []}
    units = list(prompts.GenerateStage().plan(StageContext(cfg, "r", LocalStore(str(tmp_path / "s")))))
    assert len(units) == ROWS * 2
    for i, unit in enumerate(units):
        text = book.answer(sim_request(unit.request, f"k{i}"))
        assert text is not None, unit.unit_id
        parsed = job.compiled.parser.parse(text)
        assert parsed.fields is not None, text  # the stage's own parser reads every answer
        row = job.rows[i // 2]
        right[unit.request.model].append(parsed.fields["answer"] == row.fields["answer"])
    small, large = (sum(v) / len(v) for v in right.values())
    assert abs(small - 0.25) < 0.12 and abs(large - 0.9) < 0.08  # 120 draws each: ~3 standard deviations


def test_a_judges_request_is_found_around_the_answer_and_graded_against_the_reference(tmp_path: Path) -> None:
    cfg = config(tmp_path, parse="regex = 'Answer:\\s*(?P<answer>[ABCD])'")
    book = book_of(cfg, {"judge": 0.9})
    job = prompts.Job(cfg)
    agree = 0
    for i, row in enumerate(job.rows):
        said = "ABCD"[(i // 4) % 4]
        out = OutputRow(row_id=row.id, model="small", sample=0, text=f"Let me think.\nAnswer: {said}")
        request = job.judge_request(row, out)
        text = book.answer(sim_request(request, f"j{i}"))
        assert text is not None and text.endswith(("GRADE: yes", "GRADE: no")), text
        agree += text.endswith("GRADE: yes") == (said == row.fields["answer"])
    assert abs(agree / ROWS - 0.9) < 0.08


def test_the_reference_column_is_named_or_found(tmp_path: Path) -> None:
    regex = "regex = 'Answer:\\s*(?P<option>[ABCD])'"
    found = prompts.GenerateStage().simulated_answers(config(tmp_path, parse=regex))[0]  # a column named "answer"
    assert found.field == "option" and sorted(set(found.prompts.values())) == ["A", "B", "C", "D"]
    named = config(tmp_path, parse=regex, extra='reference = "key"', columns="key")
    assert set(prompts.GenerateStage().simulated_answers(named)[0].prompts.values()) == set("ABCD")
    none = config(tmp_path, parse=regex, columns="key")  # no column it would guess: no reference
    assert set(prompts.GenerateStage().simulated_answers(none)[0].prompts.values()) == {None}
    missing = config(tmp_path, parse=regex, extra='reference = "gold"')
    with pytest.raises(InputError) as caught:
        prompts.check_inputs(missing)
    assert "gold" in str(caught.value) and "rows.jsonl" in str(caught.value)
