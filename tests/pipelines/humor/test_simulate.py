"""The Humor pipeline's simulated answers (its ``simulate`` hook, as the fake provider asks it): right answers as
often as the model's size says, a judge that grades against the reference."""

from __future__ import annotations

from pathlib import Path

import pytest

from punchline.data.simulator import sample_file
from punchline.pipelines.humor.data.judge import judge_request, parse_score
from punchline.pipelines.humor.data.loaders import load_items
from punchline.pipelines.humor.data.parser import parsed_output
from punchline.pipelines.humor.data.prompts import mera_task_text, render_prompt
from punchline.pipelines.humor.simulate import HUMOR_CLASSES, AnswerKey, humor_skill
from tests.fixtures.simulated import ask

SAMPLE = Path(sample_file("humor_sample.json") or "missing")
ITEMS = load_items(SAMPLE)
KEY = AnswerKey.load(str(SAMPLE))
SMALL, LARGE = "meta-llama/Llama-3.2-3B-Instruct-Turbo", "meta-llama/Meta-Llama-3.1-405B-Instruct-Turbo"


def test_every_sample_item_is_found_with_its_own_reference() -> None:
    # the sample reuses texts across items (an item's main text is another's option), so a lookup by
    # main text alone would answer some items with another item's reference
    assert all(KEY.reference(render_prompt(item)) == item.outputs for item in ITEMS)
    assert all(KEY.reference(mera_task_text(item)) == item.outputs for item in ITEMS)  # the mera preset's prompt
    assert KEY.reference("a prompt about something else") is None


def _accuracy(model: str, skill: dict[str, float] | None = None, draws: int = 20) -> tuple[float, float]:
    knobs = {"humor": {"skill": skill or {}}}
    cls_right = letter_right = 0
    for item in ITEMS:
        right_cls, right_letter = item.outputs.split(",")
        prompt = render_prompt(item)
        for d in range(draws):
            text = ask(prompt, key=f"{item.id}-{d}", model=model, knobs=knobs)
            got = parsed_output(text)
            assert got is not None, text
            cls, letter = got.split(",")
            cls_right += cls == right_cls
            letter_right += letter == right_letter
    n = len(ITEMS) * draws
    return cls_right / n, letter_right / n


@pytest.mark.parametrize("model", [SMALL, LARGE])
def test_class_and_letter_are_right_as_often_as_the_model_size_says(model: str) -> None:
    skill = humor_skill(model, {})
    cls_acc, letter_acc = _accuracy(model)
    # right by skill, or by luck among 12 classes / 4 letters
    assert cls_acc == pytest.approx(skill + (1 - skill) / len(HUMOR_CLASSES), abs=0.07)
    letter_skill = min(0.95, skill + 0.1)
    assert letter_acc == pytest.approx(letter_skill + (1 - letter_skill) / 4, abs=0.07)


def test_skill_grows_with_size_and_can_be_set_per_model() -> None:
    assert humor_skill(SMALL, {}) < humor_skill(LARGE, {})
    cls_acc, _ = _accuracy(SMALL, {"3B": 1.0}, draws=2)
    assert cls_acc == 1.0


def test_an_unknown_item_gets_a_valid_random_answer() -> None:
    item = ITEMS[0]
    other = render_prompt(item).replace(item.inputs.main_text, "Совсем другой текст.")
    texts = {ask(other, key=str(i), model=LARGE) for i in range(40)}
    classes = {parsed_output(t).split(",")[0] for t in texts}  # type: ignore[union-attr]
    assert classes <= set(HUMOR_CLASSES) and len(classes) > 4  # not pinned to the reference


def _judge(item_answer: str, item_index: int, flip_rate: float, key: str = "j") -> float:
    req = judge_request("p", "judge", ITEMS[item_index], item_answer)
    system, user = (m.content for m in req.messages)
    return parse_score(ask(user, system=system, key=key, model="judge", judge_flip_rate=flip_rate))


def test_judge_grades_against_the_reference_and_sometimes_disagrees() -> None:
    exact = 0.0
    for i, item in enumerate(ITEMS):
        cls, letter = item.outputs.split(",")
        assert _judge(f"**ОТВЕТ:** {cls.upper()}\n**РЕШЕНИЕ:** {letter}", i, exact) == 1.0
        wrong = "А" if letter != "А" else "Б"
        assert _judge(f"ОТВЕТ {cls}\nРЕШЕНИЕ {wrong}", i, exact) == 0.0
        assert _judge("не знаю", i, exact) == 0.0
    noisy = 0.2
    cls, letter = ITEMS[0].outputs.split(",")
    scores = [_judge(f"ОТВЕТ {cls}\nРЕШЕНИЕ {letter}", 0, noisy, key=str(k)) for k in range(200)]
    assert 0.1 < scores.count(0.0) / len(scores) < 0.3


def test_meras_judge_prompt_gets_a_rubric_score_graded_against_the_reference() -> None:
    from punchline.pipelines.humor.data.judge import mera_judge_request, mera_judge_score

    item = ITEMS[0]
    cls, letter = item.outputs.split(",")
    wrong = next(c for c in HUMOR_CLASSES if c != cls)
    for reading, expected in [(f"ОТВЕТ {cls}\nРЕШЕНИЕ {letter}", 1.0), (f"{wrong},{letter}", 0.0)]:
        request = mera_judge_request("p", "judge", item, reading)
        text = ask(request.messages[0].content, key=request.key(), model="judge", judge_flip_rate=0.0)
        assert mera_judge_score(text) == expected, text


def test_the_fake_honours_stop_sequences_over_http(fake) -> None:  # type: ignore[no-untyped-def]
    """The mera preset relies on the stop: the fake cuts its answer at the first stop sequence, as a real API."""
    import asyncio

    import msgspec

    from punchline.pipelines.humor.data.prompts import mera_answer_request
    from punchline.workers.providers import make_provider

    async def complete(stop: tuple[str, ...]) -> str:
        request = msgspec.structs.replace(mera_answer_request("fake", LARGE, ITEMS[0]), stop=stop)
        provider = make_provider("fake", fake.provider_settings("openai", timeout_s=5))
        try:
            return (await provider.complete(request)).texts[0]
        finally:
            await provider.aclose()

    whole = asyncio.run(complete(("\n\n",)))
    assert "\n" in whole and "\n\n" not in whole  # the fake's Humor answers are two lines
    cut = asyncio.run(complete(("\n",)))  # another request, so another draw: but always its first line only
    assert cut and "\n" not in cut and cut.lower().startswith(("ответ", "**ответ", "подумаем"))
