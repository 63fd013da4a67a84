"""The Humor pipeline's simulated answers (its ``simulate`` hook; :mod:`punchline.data.simulator` says how the
simulated provider asks for them).

* Humor prompts (``ОТВЕТ`` and ``РЕШЕНИЕ``): two lines, with format variants; for an item of the answer key
  (:class:`AnswerKey`: the run's own data, else the sample) the class and the letter are right as often as the
  model's size says (so that a demo's scores rank models as real runs would), else drawn at random;
* MERA's judge prompt (its ``### Ответ для оценки:`` section): a rubric score, ``Оценка: 2`` for an answer the
  robust parser reads as the reference, else ``Оценка: 0``, flipped now and then like ours;
* judge prompts (contain :data:`JUDGE_MARKER`, or ``"оцените"``): ``SCORE: 0|1``; a Humor judge prompt is
  graded against its reference with the robust parser, and the grade is flipped now and then (a judge that
  mostly agrees with exact match, but not always).
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass, field
from typing import Annotated

import msgspec

from punchline.data.simulator import Rate, SimRequest, by_size, sample_file
from punchline.pipelines.humor.data.judge import (
    ANSWER_BEGIN,
    ANSWER_END,
    JUDGE_MARKER,
    MERA_ANSWER_HEADER,
    MERA_CRITERIA_HEADER,
    MERA_REFERENCE_HEADER,
    REFERENCE_LABEL,
)
from punchline.pipelines.humor.data.loaders import load_items
from punchline.pipelines.humor.data.parser import parsed_output
from punchline.pipelines.humor.data.schema import CLASSES, HumorInputs, split_output

HUMOR_CLASSES: tuple[str, ...] = CLASSES  # the 12 canonical Humor classes
HUMOR_LETTERS: tuple[str, ...] = ("А", "Б", "В", "Г")


class HumorSimKnobs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What the simulated provider knows of Humor items, and how often each model names the right class."""

    answer_key: Annotated[
        str | list[str] | None,
        msgspec.Meta(
            description="Humor file(s), MERA layout, whose references the simulator knows; default: a run's own "
            "data, else data/samples/humor_sample.json"
        ),
    ] = None
    skill: Annotated[
        dict[str, Rate], msgspec.Meta(description="model-id substring -> P(right class) on a known Humor item")
    ] = {}


@dataclass
class AnswerKey:
    """Reference answers of Humor items, found by their texts inside a prompt.

    Items reuse each other's texts as options, so an item is recognised by its main text *and* its four
    options, in order, not by the main text alone.
    """

    items: list[tuple[tuple[str, ...], str]] = field(default_factory=list)  # (main text + options, "class,letter")

    def __post_init__(self) -> None:
        # longest first, so an item whose texts contain another item's texts is found first
        self.items = sorted((i for i in self.items if all(i[0]) and i[1]), key=lambda i: -sum(map(len, i[0])))

    @classmethod
    def load(cls, path: str | list[str] | None) -> AnswerKey:
        """Items of one or more MERA-layout files (JSON or parquet); items without a reference are skipped."""
        paths = [] if path is None else [path] if isinstance(path, str) else path
        return cls([(_texts(item.inputs), item.outputs) for p in paths for item in load_items(p)])

    def reference(self, prompt: str) -> str | None:
        return next((out for texts, out in self.items if _in_order(texts, prompt)), None)


@functools.lru_cache(maxsize=8)
def _answer_key(paths: tuple[str, ...]) -> AnswerKey:
    return AnswerKey.load(list(paths))


def answer_key_of(knobs: HumorSimKnobs) -> AnswerKey:
    """The answer key the knobs name (loaded once per set of files), else the sample's."""
    given = knobs.answer_key or sample_file("humor_sample.json")
    return _answer_key(tuple([given] if isinstance(given, str) else given or ()))


def _texts(inputs: HumorInputs) -> tuple[str, ...]:
    return (inputs.main_text, inputs.option_a, inputs.option_b, inputs.option_c, inputs.option_d)


def _in_order(texts: tuple[str, ...], prompt: str) -> bool:
    main, *options = texts
    if main not in prompt:
        return False
    at = 0
    for text in options:
        at = prompt.find(text, at)
        if at < 0:
            return False
        at += len(text)
    return True


def humor_skill(model: str, overrides: dict[str, float]) -> float:
    """Probability of naming the right class of a Humor item (the letter is a little easier)."""
    return by_size(model, overrides, base=0.2, per_decade=0.2, cap=0.9)


def simulate(request: SimRequest) -> str | None:
    """The answer to one of Humor's prompts; None for any other prompt."""
    text = request.text
    knobs: HumorSimKnobs = request.knobs if isinstance(request.knobs, HumorSimKnobs) else HumorSimKnobs()
    if MERA_ANSWER_HEADER in text and MERA_CRITERIA_HEADER in text:
        return _mera_judge(request.rng(), request.judge_flip_rate, text)
    if JUDGE_MARKER in text or "оцените" in text.lower():
        return _judge(request.rng(), request.judge_flip_rate, text)
    if "ОТВЕТ" in text and "РЕШЕНИЕ" in text:
        reference = answer_key_of(knobs).reference(text)
        return _humor(request.rng(), request, knobs, reference)
    return None


def _humor(rng: random.Random, request: SimRequest, knobs: HumorSimKnobs, reference: str | None) -> str:
    cls = rng.choice(HUMOR_CLASSES)
    letter = rng.choice(HUMOR_LETTERS)
    right = split_output(reference) if reference is not None else None
    if right is not None:
        right_cls, right_letter = right
        skill = humor_skill(request.model, knobs.skill)
        if rng.random() < skill:
            cls = right_cls
        if rng.random() < min(0.95, skill + 0.1):
            letter = right_letter
    if rng.random() >= request.format_variant_rate:
        return f"ОТВЕТ {cls}\nРЕШЕНИЕ {letter}"
    variant = rng.randrange(3)
    if variant == 0:
        return f"**ОТВЕТ:** {cls}\n**РЕШЕНИЕ:** {letter}"
    if variant == 1:
        return f"ответ: {cls.lower()}\nрешение: {letter}"
    return f"Подумаем.\nОТВЕТ: «{cls}»\nРЕШЕНИЕ: {letter}."


# the reference and the graded answer inside :func:`data.humor.judge.judge_request`'s prompt
_JUDGE_REFERENCE_RE = re.compile(rf"^{re.escape(REFERENCE_LABEL)} (.*)$", re.M)
_JUDGE_ANSWER_RE = re.compile(rf"{re.escape(ANSWER_BEGIN)}\n(.*?)\n{re.escape(ANSWER_END)}", re.S)


def _judge(rng: random.Random, flip_rate: float, text: str) -> str:
    reference, graded = _JUDGE_REFERENCE_RE.search(text), _JUDGE_ANSWER_RE.search(text)
    if reference is None or graded is None:
        return f"SCORE: {1 if rng.random() < 0.7 else 0}"
    parsed = parsed_output(graded.group(1))
    right = parsed is not None and split_output(parsed) == split_output(reference.group(1))
    if rng.random() < flip_rate:
        right = not right
    return f"SCORE: {int(right)}"


_MERA_JUDGE_RE = re.compile(
    rf"{re.escape(MERA_REFERENCE_HEADER)}\n(.*?)\n\n{re.escape(MERA_ANSWER_HEADER)}\n(.*?)\n\n"
    rf"{re.escape(MERA_CRITERIA_HEADER)}",
    re.S,
)


def _mera_judge(rng: random.Random, flip_rate: float, text: str) -> str:
    m = _MERA_JUDGE_RE.search(text)
    if m is None:
        return f"Оценка: {rng.choice((0, 1, 2))}"
    parsed = parsed_output(m.group(2))
    right = parsed is not None and split_output(parsed) == split_output(m.group(1))
    if rng.random() < flip_rate:
        right = not right
    return f"Оценка: {2 if right else 0}"
