"""MERA's judge: the prompt we send is byte-identical to what ``benchmark_tasks/mera_judge.py`` builds.

Transcribed from MERA-Evaluation/MERA ``benchmark_tasks/mera_judge.py`` at
4310d9836d03a1e70128fd65095cf6d04f96942b (``CRITERIA_NAME``, ``CRITERIA_RUBRICS``, ``JUDGE_PROMPT``,
``task_instruction``, ``build_judge_prompt``); the ``{reference}`` / ``{prediction}`` left in place are filled by
lm-eval's ``compute_llm_judge`` with ``str.format`` (which is why ``build_judge_prompt`` escapes the task's braces).
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from punchline.pipelines.humor.data.judge import mera_judge_request, mera_judge_score
from punchline.pipelines.humor.data.loaders import load_items
from punchline.pipelines.humor.data.mera import mera_readings
from punchline.pipelines.humor.data.schema import HumorItem
from tests.pipelines.humor.data.conftest import SAMPLE, make_item

CRITERIA_NAME = "Правильность ответа"

CRITERIA_RUBRICS = """0: Дан неправильный ответ или ответ отсутствует.

1: Ответ модели неполный (не на все вопросы задания получен ответ, в формулировке ответа отсутствует часть информации).

2: Ответ модели совпадает с эталонным или эквивалентен ему."""

JUDGE_PROMPT = """### Задание для оценки:
{instruction}

### Эталонный ответ:
{reference_answer}

### Ответ для оценки:
{answer}

### Критерий оценки:
{criteria_name}

### Шкала оценивания по критерию:
{criteria_rubrics}"""


def task_instruction(doc):  # type: ignore[no-untyped-def]
    instruction = doc.get("instruction") or ""
    try:
        return instruction.format(**(doc.get("inputs") or {}))
    except (KeyError, IndexError, ValueError):
        return instruction


def build_judge_prompt(instruction, template=None):  # type: ignore[no-untyped-def]
    template = JUDGE_PROMPT if template is None else template
    return (
        template.replace("{reference_answer}", "{reference}")
        .replace("{answer}", "{prediction}")
        .replace("{criteria_name}", CRITERIA_NAME)
        .replace("{criteria_rubrics}", CRITERIA_RUBRICS)
        .replace("{instruction}", instruction.replace("{", "{{").replace("}", "}}"))
    )


def official_prompt(item: HumorItem, answer: str) -> str:
    doc = msgspec.to_builtins(item)
    return build_judge_prompt(task_instruction(doc)).format(reference=doc["outputs"], prediction=answer)


SHARED_META = Path(__file__).resolve().parents[4].parent / "shared" / "data" / "humor" / "dataset_meta.json"


def _items() -> list[HumorItem]:
    items = load_items(SAMPLE)[:6]
    if SHARED_META.is_file():  # the official templates, when the shared data sits beside the checkout
        templates = json.loads(SHARED_META.read_text(encoding="utf-8"))["prompts"]
        items += [msgspec.structs.replace(items[i], instruction=t) for i, t in enumerate(templates)]
    # braces in the texts and a template that str.format cannot fill
    items.append(make_item(7, "ирония,Б", main="{option_a} и {не поле} }{"))
    items.append(make_item(8, "ирония,Б", instruction="Текст {main_text} и {0} {"))
    return items


@pytest.mark.parametrize(
    "answer",
    ["ОТВЕТ ирония\nРЕШЕНИЕ Б", "Ответ: {prediction} {reference}", "", "  ответ — каламбур, решение г \n"],
)
def test_the_prompt_sent_is_byte_identical_to_meras(answer: str) -> None:
    for item in _items():
        for reading in mera_readings(answer):
            request = mera_judge_request("p", "judge-model", item, reading)
            assert len(request.messages) == 1 and request.messages[0].role == "user"
            assert request.messages[0].content.encode() == official_prompt(item, reading).encode()
            assert (request.temperature, request.max_tokens) == (0.0, 256)


def test_scores_on_the_rubric_scale() -> None:
    assert mera_judge_score("2") == 1.0
    assert mera_judge_score("Оценка: 1 — ответ неполный") == 0.5
    assert mera_judge_score("0") == 0.0
    assert mera_judge_score("Оценка 2 из 2") == 1.0
    assert mera_judge_score("12 баллов") == 1.0  # the last number, over 2, clamped: as MERA reads it
    assert mera_judge_score("Оценка: 1 (шкала 0-2)") == 1.0  # the last number is the scale's 2
    assert mera_judge_score("Оценка: 0.5") == 0.25
    assert mera_judge_score("не знаю") == 0.0
    assert mera_judge_score(None) == 0.0  # the call failed


def official_compute_llm_judge_reading(content: str) -> float:
    """``compute_llm_judge``'s reading of the judge's reply (no ``score_regex``), transcribed from
    ``lm_eval/api/metrics_generative.py`` of artemorloff/lm-evaluation-harness at
    1a8000e7526d4b2c60f6d4410eeecac2d30714b5, then ``mera_judge.normalize_score`` and the ``except`` that scores a
    failure 0 (``mera_judge.compute_judge_score`` at 4310d9836d03a1e70128fd65095cf6d04f96942b)."""
    import re

    try:
        floats = re.findall(r"(\d+(?:\.\d+)?)", content)
        if floats:
            raw = float(floats[-1])
        else:
            raise ValueError(f"llm_judge could not parse a numeric score from: {content[:500]!r}")
        return min(max(float(raw) / 2.0, 0.0), 1.0)
    except Exception:
        return 0.0


def test_the_reply_is_read_as_meras_compute_llm_judge_reads_it() -> None:
    import random

    rng = random.Random(33)
    pieces = ["Оценка:", "2", "1", "0", " ", "\n", "из", "баллов", "0-2", "1.5", "10", "**", "Итог", ".", "—", "3"]
    replies = ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 8))) for _ in range(3000)]
    replies += ["2", "Оценка: 1 — ответ неполный", "Оценка 2 из 2", "", "0.75", "Score: 2/2", "1\n\nПояснение: 0"]
    differ = [r for r in replies if mera_judge_score(r) != official_compute_llm_judge_reading(r)]
    assert not differ, differ[:5]
