from pathlib import Path

import pytest

from punchline.data.errors import InputError
from punchline.pipelines.humor.data.prompts import (
    answer_request,
    load_official_templates,
    missing_placeholders,
    render_instruction,
    render_prompt,
    shot_answer,
)
from punchline.pipelines.humor.data.schema import HumorInputs
from tests.pipelines.humor.data.conftest import make_item

INPUTS = HumorInputs(
    main_text="Текст со {скобками} и {option_a} внутри",
    option_a="вариант {А}",
    option_b="Б-текст",
    option_c="В-текст",
    option_d="Г-текст",
    context="КОНТЕКСТ",
)


def test_official_templates_render(shared_humor: Path) -> None:
    templates = load_official_templates(shared_humor / "dataset_meta.json")
    assert len(templates) == 5
    for template in templates:
        assert missing_placeholders(template) == []
        text = render_instruction(template, INPUTS)
        # the literal "{option_a}" inside the main text is not re-substituted
        assert "Текст со {скобками} и {option_a} внутри" in text
        assert "А. вариант {А}\nБ. Б-текст\nВ. В-текст\nГ. Г-текст" in text
        assert "Контекст:\nКОНТЕКСТ" in text
        assert "{context}" not in text and "{main_text}" not in text and "{option_b}" not in text
        assert "ОТВЕТ" in text and "РЕШЕНИЕ" in text


def test_missing_placeholders() -> None:
    assert missing_placeholders("{context} {main_text} {option_a} {option_c}") == ["option_b", "option_d"]


def test_k_shot_prompt_and_request() -> None:
    shots = [make_item(1, "ирония,Б"), make_item(2, "капитан Очевидность,Г")]
    item = make_item(3, "")
    prompt = render_prompt(item, shots)
    first, second, target = prompt.split("\n\nЗадача.")
    assert first.endswith("А. текст А 1\nБ. текст Б 1\nВ. текст В 1\nГ. текст Г 1\nОТВЕТ ирония\nРЕШЕНИЕ Б")
    assert second.endswith("ОТВЕТ капитан Очевидность\nРЕШЕНИЕ Г")
    assert target.endswith("Г. текст Г 3") and "основной текст 3" in target
    assert render_prompt(item) == render_instruction(item.instruction, item.inputs)
    req = answer_request("fake", "m-8b", item, shots)
    assert req.temperature == 0.0 and req.messages[-1].content == prompt
    assert req.key() == answer_request("fake", "m-8b", item, shots).key()


def test_answers_may_be_256_tokens_long_by_default() -> None:
    # lm-eval's default for generation; 64 cut the reasoning some models write before the answer
    assert answer_request("fake", "m", make_item(3, "")).max_tokens == 256


def test_shot_without_answer_is_an_error() -> None:
    with pytest.raises(InputError) as err:
        shot_answer(make_item(9, ""))
    assert err.value.record == 9


def test_bad_meta_file(tmp_path: Path) -> None:
    p = tmp_path / "m.json"
    p.write_text('{"prompts": "x"}')
    with pytest.raises(InputError, match="list of strings"):
        load_official_templates(p)
