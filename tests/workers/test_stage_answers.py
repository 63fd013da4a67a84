"""The simulator's answers to a run's generic stages: they parse as the stage parses, right at each model's rate.

Through :class:`StageBook` directly (what the fake server asks after the pipelines' hooks) and the server's own
answer path (``answer_texts`` over a ``FakeConfig`` carrying ``stage_answers``), no HTTP needed: the texts are the
ones the online endpoints send.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from punchline.data.answer_format import ANSWER_MARK, AnswerParse, JudgedPrompt, StageAnswers, prompt_digest
from punchline.data.errors import ConfigError
from punchline.data.simulator import FakeConfig, SimRequest
from punchline.workers.fake.formats.json_text import SchemaText
from punchline.workers.fake.formats.regex_text import RegexText
from punchline.workers.fake.stage_answers import StageBook, default_accuracy, stage_answers

LETTERS = r"Answer:\s*(?P<answer>[ABCD])"
ROWS = 400


def request(
    user: str, *, key: str, model: str = "m-8b", choice: int = 0, system: str = "", seed: int = 0
) -> SimRequest:
    return SimRequest(
        key=key,
        choice=choice,
        model=model,
        system=system,
        user=user,
        temperature=1.0,
        seed=seed,
        noise_rate=0.15,
        format_variant_rate=0.2,
        judge_flip_rate=0.05,
    )


def letters_stage(rows: int = ROWS, parse: AnswerParse | None = None, field: str | None = "answer") -> StageAnswers:
    prompts = {prompt_digest("", f"Question {i}? Reply Answer: <letter>."): "ABCD"[i % 4] for i in range(rows)}
    return StageAnswers(
        stage="generate",
        parse=parse or AnswerParse(regex=LETTERS),
        field=field,
        prompts=prompts,
        models={"m-8b": ["small"], "m-70b": ["large"]},
    )


def share_right(book: StageBook, model: str, parse: Any) -> float:
    right = 0
    for i in range(ROWS):
        text = book.answer(request(f"Question {i}? Reply Answer: <letter>.", key=f"k{i}", model=model))
        assert text is not None
        assert parse(text) in "ABCD"  # every answer parses into an allowed value
        right += parse(text) == "ABCD"[i % 4]
    return right / ROWS


def test_answers_parse_and_are_right_at_each_models_rate() -> None:
    book = StageBook([letters_stage()], {"small": 0.3, "m-70b": 0.9})  # by nick or by id
    regex = re.compile(LETTERS)

    def parse(text: str) -> str:
        match = regex.search(text)
        assert match is not None, text
        return match.group("answer")

    small, large = share_right(book, "m-8b", parse), share_right(book, "m-70b", parse)
    assert abs(small - 0.3) < 0.08 and abs(large - 0.9) < 0.05  # 400 draws: within ~3 standard deviations
    # a model accuracy does not name: by its size
    assert abs(share_right(StageBook([letters_stage()], {}), "m-8b", parse) - default_accuracy("m-8b")) < 0.08


def test_a_draw_is_a_pure_function_of_seed_model_and_request() -> None:
    book = StageBook([letters_stage()], {"small": 0.5})
    ask = [request(f"Question {i}? Reply Answer: <letter>.", key=f"k{i}", choice=i % 3) for i in range(40)]
    first = [book.answer(r) for r in ask]
    assert [StageBook([letters_stage()], {"small": 0.5}).answer(r) for r in ask] == first  # a new book: same texts
    seeded = [book.answer(request(r.user, key=r.key, choice=r.choice, seed=7)) for r in ask]
    assert seeded != first  # another seed draws otherwise
    assert book.answer(request("a prompt of no stage", key="x")) is None  # the generic answers' to give


def test_a_json_schema_answer_is_valid_and_a_wrong_one_is_another_enum_member() -> None:
    schema = {
        "type": "object",
        "required": ["answer", "confidence"],
        "properties": {"answer": {"enum": ["A", "B", "C", "D"]}, "confidence": {"type": "number", "minimum": 0}},
    }
    book = StageBook([letters_stage(parse=AnswerParse(json_schema=schema))], {"small": 0.5})
    valid = SchemaText(schema).validator

    def parse(text: str) -> str:
        body = text.removeprefix("```json\n").removesuffix("\n```")  # the variant format: fenced
        value = json.loads(body)
        assert valid.is_valid(value), value
        return str(value["answer"])

    assert abs(share_right(book, "m-8b", parse) - 0.5) < 0.08


def test_free_text_right_is_the_reference_and_wrong_is_another_text() -> None:
    stage = StageAnswers(stage="g", prompts={prompt_digest("", "Capital of France?"): "Paris"})
    texts = {StageBook([stage], {"m-8b": 0.5}).answer(request("Capital of France?", key=f"k{i}")) for i in range(60)}
    assert "Paris" in texts and len(texts) > 1


def test_a_wrong_free_group_answer_is_another_option_of_the_prompt() -> None:
    prompt = "Which planet is closest to the Sun?\nOptions: Mercury | Venus | Mars | Earth"
    stage = StageAnswers(
        stage="g",
        parse=AnswerParse(regex=r"Answer:\s*(?P<option>\w+)"),
        field="option",
        prompts={prompt_digest("", prompt): "Mercury"},
    )
    book = StageBook([stage], {"m-8b": 0.0})  # always wrong
    picks = {re.sub(r".*Answer:\s*(\w+).*", r"\1", book.answer(request(prompt, key=f"k{i}")) or "", flags=re.S)
             for i in range(40)}  # fmt: skip
    assert picks == {"Venus", "Mars", "Earth"}


def test_a_judge_grades_the_answer_in_its_prompt_against_the_reference() -> None:
    template = "Reference: {ref}\nResponse: {answer}\nReply VERDICT: correct or VERDICT: incorrect."
    judged = [JudgedPrompt(pieces=f"\0{template.format(ref=r, answer=ANSWER_MARK)}".split(ANSWER_MARK), reference=r)
              for r in "ABCD"]  # fmt: skip
    judge = StageAnswers(
        stage="judge",
        parse=AnswerParse(regex=r"VERDICT: (?P<verdict>\w+)"),
        field="verdict",
        judged=judged,
        judged_parse=AnswerParse(regex=LETTERS),
        judged_field="answer",
    )
    book = StageBook([judge], {"j-70b": 0.9})
    agree = 0
    for i in range(ROWS):
        ref, said = "ABCD"[i % 4], "ABCD"[(i // 4) % 4]
        text = book.answer(request(template.format(ref=ref, answer=f"Answer: {said}"), key=f"j{i}", model="j-70b"))
        assert text is not None and text.removeprefix("Let me think.\n") in ("VERDICT: correct", "VERDICT: incorrect")
        agree += text.endswith("VERDICT: correct") == (ref == said)
    assert abs(agree / ROWS - 0.9) < 0.05
    other = request(template.format(ref="E", answer="Answer: A"), key="j", model="j-70b")  # no row's reference
    assert book.answer(other) is None


@pytest.mark.parametrize(
    ("regex", "values", "fits", "misfits"),
    [
        (LETTERS, ["A", "B", "C", "D"], "C", "E"),
        (r"VERDICT:\s*(?P<answer>correct|incorrect)", ["correct", "incorrect"], "incorrect", "maybe"),
        (r"(?P<answer>\d)/10", [str(d) for d in range(10)], "7", "10"),
        (r"Answer:\s*(?P<answer>\w+)", None, "Mercury", "carbon dioxide"),
    ],
)
def test_a_regex_is_written_with_a_chosen_group_value_or_refused(
    regex: str, values: list[str] | None, fits: str, misfits: str
) -> None:
    text = RegexText(regex)
    assert text.values("answer") == values
    written = text.text({"answer": fits})
    assert written is not None and re.search(regex, written).group("answer") == fits  # type: ignore[union-attr]
    assert text.text({"answer": misfits}) is None


def test_accuracy_naming_no_model_of_the_runs_stages_is_one_line() -> None:
    class Stage:
        def simulated_answers(self, cfg: object) -> list[StageAnswers]:
            return [letters_stage()]

    assert len(stage_answers(FakeConfig(accuracy={"small": 0.4, "m-70b": 0.8}), [Stage(), object()], None)) == 1
    with pytest.raises(ConfigError) as caught:
        stage_answers(FakeConfig(accuracy={"smal": 0.4}), [Stage()], None, "mc.toml")
    assert caught.value.field == "simulator.accuracy.smal" and "small" in str(caught.value)
    with pytest.raises(ConfigError):
        stage_answers(FakeConfig(accuracy={"small": 0.4}), [object()], None)  # no generic stage at all
