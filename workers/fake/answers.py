"""Deterministic answers for the fake provider, derived only from the request content.

Every answer is a pure function of (request key, choice index, seed, model), so a test that replays
the same requests gets the same texts, and a split ``n`` call gives the same texts as one ``n`` call.
The fake recognises the prompt families punchline sends:

* pun completion (system prompt = :data:`data.completions.SYSTEM_PROMPT` or the cloze benchmark's):
  one word from the joke's straight or punny list, funnier for larger models and after punny context,
  sometimes with noise (``"Suit."``, ``" suit, "``) so that word extraction is exercised;
* candidate classification (``"classify each candidate word"``): a JSON object, sometimes fenced;
* curation repair prompts (:data:`data.curation.REPAIR_MARKER`): the joke as JSON, reworded;
* rating prompts (``"rate"`` + ``"json"``): ``[{"id", "rating"}]`` for prompts listing ``Joke id N:``
  lines (sometimes fenced; a reworded joke scores higher), else a JSON array of integer scores;
* Humor prompts (``ОТВЕТ`` and ``РЕШЕНИЕ``): two lines, with format variants; for an item of the
  fake's :class:`AnswerKey` the class and the letter are right as often as the model's size says
  (so that a demo's scores rank models as real runs would), else drawn at random;
* MERA's judge prompt (its ``### Ответ для оценки:`` section): a rubric score, ``Оценка: 2`` for an answer the
  robust parser reads as the reference, else ``Оценка: 0``, flipped now and then like ours;
* judge prompts (contain :data:`JUDGE_MARKER`, or ``"оцените"``): ``SCORE: 0|1``; a Humor judge prompt
  is graded against its reference with the robust parser, and the grade is flipped now and then (a
  judge that mostly agrees with exact match, but not always);
* generic prompts (the prompts pipeline's): a prompt with an ``Options: a | b | c`` line is answered with
  one of them, drawn from the request's seed (the fake knows no answers) — as JSON
  ``{"answer", "confidence"}`` when the prompt says ``JSON`` (sometimes fenced, sometimes prose: a parse
  failure), else ``Answer: <option>`` (sometimes hedged prose); a prompt with
  ``VERDICT`` and ``Reference:`` / ``Response:`` lines is graded ``VERDICT: correct|incorrect`` by
  whether the response names the reference, flipped now and then.
"""

from __future__ import annotations

import ast
import hashlib
import json
import math
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from punchline.data.humor.judge import (
    ANSWER_BEGIN,
    ANSWER_END,
    JUDGE_MARKER,
    MERA_ANSWER_HEADER,
    MERA_CRITERIA_HEADER,
    MERA_REFERENCE_HEADER,
    REFERENCE_LABEL,
)
from punchline.data.humor.loaders import load_items
from punchline.data.humor.parser import parsed_output
from punchline.data.humor.schema import CLASSES, HumorInputs, split_output
from punchline.data.puns.cloze_run import SYSTEM_PROMPT as CLOZE_SYSTEM_PROMPT
from punchline.data.puns.completions import SYSTEM_PROMPT
from punchline.data.puns.curation import REPAIR_MARKER

HUMOR_CLASSES: tuple[str, ...] = CLASSES  # the 12 canonical Humor classes
HUMOR_LETTERS: tuple[str, ...] = ("А", "Б", "В", "Г")

GENERIC_WORDS: tuple[str, ...] = ("time", "way", "day", "friend", "idea", "reason", "problem", "plan", "home", "job")

_SIZE_RE = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)b(?![a-z])")
_JOKE_BLOCK_RE = re.compile(r"Joke index (\d+):(.*?)(?=Joke index \d+:|\Z)", re.S)
_CANDIDATES_RE = re.compile(r"Candidates:\s*(\[.*?\])", re.S)
_KNOWN_RE = re.compile(r"Known (straight|punny):\s*(\[.*?\])", re.S)
_NUMBERED_RE = re.compile(r"^\s*(\d+)[.):]\s", re.M)
_JOKE_ID_RE = re.compile(r"^Joke id (\d+): (.*)$", re.M)
_REPAIR_JOKE_RE = re.compile(r"^Joke: (\{.*\})$", re.M)
REWORD_PREFIX = "Believe it or not, "


class JokeRecord(msgspec.Struct):
    """The fields of a ``puns_205.json`` entry the fake needs (others are ignored)."""

    index: int
    sentence: str
    straight: list[str]
    punny: list[str]


@dataclass
class JokeBook:
    """The jokes the fake knows, indexed by their prompt (sentence up to the blank)."""

    jokes: list[JokeRecord] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.by_prompt = {_prompt_of(j.sentence): j for j in self.jokes if "___" in j.sentence}
        self.by_index = {j.index: j for j in self.jokes}

    @classmethod
    def load(cls, path: str | list[str] | None) -> JokeBook:
        """Jokes of one or more puns files (a later file's joke wins on an equal prompt)."""
        paths = [] if path is None else [path] if isinstance(path, str) else path
        jokes: list[JokeRecord] = []
        for p in paths:
            jokes.extend(msgspec.json.decode(Path(p).read_bytes(), type=list[JokeRecord]))
        return cls(jokes)


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


def _prompt_of(sentence: str) -> str:
    return sentence[: sentence.index("___")].rstrip()


def model_size_b(model: str) -> float | None:
    """Parameter count in billions parsed from a model id (``"...-405B-..."`` -> 405)."""
    sizes = [float(m) for m in _SIZE_RE.findall(model.lower())]
    return sizes[-1] if sizes else None


def _by_size(model: str, overrides: dict[str, float], *, base: float, per_decade: float, cap: float) -> float:
    """A per-model probability: the override whose pattern is in the model id, else one that grows with
    the log of the model's size (8B when the id names none)."""
    for pattern, value in overrides.items():
        if pattern in model:
            return value
    size = model_size_b(model) or 8.0
    return min(cap, base + per_decade * math.log10(max(size, 1.0)))


def base_funny_propensity(model: str, overrides: dict[str, float]) -> float:
    """Probability of a punny word with neutral context; larger models are funnier."""
    return _by_size(model, overrides, base=0.02, per_decade=0.1, cap=0.6)


def humor_skill(model: str, overrides: dict[str, float]) -> float:
    """Probability of naming the right class of a Humor item (the letter is a little easier)."""
    return _by_size(model, overrides, base=0.2, per_decade=0.2, cap=0.9)


def joke_factor(seed: int, prompt: str) -> float:
    """How pun-prone a joke is, fixed per joke: most jokes are heard straight, some invite the pun,
    a few are always punned, so the simulated data spreads over all four tiers as real data does."""
    r = rng_for(seed, prompt, 0, "joke").random()
    if r < 0.45:
        return 0.05
    if r < 0.88:
        return 0.5 + 2.5 * (r - 0.45) / 0.43
    return 50.0


def rng_for(seed: int, key: str, choice: int, salt: str = "") -> random.Random:
    digest = hashlib.sha256(f"{seed}|{key}|{choice}|{salt}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


@dataclass
class AnswerKnobs:
    seed: int = 0
    noise_rate: float = 0.15
    format_variant_rate: float = 0.2
    funny_propensity: dict[str, float] = field(default_factory=dict)
    humor_skill: dict[str, float] = field(default_factory=dict)
    judge_flip_rate: float = 0.05


def answer(
    book: JokeBook,
    knobs: AnswerKnobs,
    *,
    key: str,
    choice: int,
    model: str,
    system: str,
    user: str,
    temperature: float,
    answer_key: AnswerKey | None = None,
) -> str:
    """The text of one choice. At temperature 0 every choice of a key is the same (greedy)."""
    rng = rng_for(knobs.seed, key, 0 if temperature == 0 else choice)
    text = f"{system}\n{user}"
    if MERA_ANSWER_HEADER in text and MERA_CRITERIA_HEADER in text:
        return _mera_judge(rng, knobs, text)
    if JUDGE_MARKER in text or "оцените" in text.lower():
        return _judge(rng, knobs, text)
    if "ОТВЕТ" in text and "РЕШЕНИЕ" in text:
        reference = answer_key.reference(text) if answer_key else None
        return _humor(rng, knobs, model, reference)
    if "classify each candidate word" in text:
        return _classify(rng, knobs, book, text)
    if system.strip() in (SYSTEM_PROMPT, CLOZE_SYSTEM_PROMPT) or SYSTEM_PROMPT in text:
        return _pun_word(rng, knobs, book, model, user, greedy=temperature == 0)
    if REPAIR_MARKER in text:
        return _repair(rng, knobs, text)
    if "VERDICT" in text and _REFERENCE_RE.search(text) and _RESPONSE_RE.search(text):
        return _verdict(rng, knobs, text)
    options = _OPTIONS_RE.search(text)
    if options is not None:
        return _generic(rng, knobs, text, options.group(1))
    lower = text.lower()
    if "rate" in lower and "json" in lower:
        return _ratings(rng, knobs, text)
    return rng.choice(GENERIC_WORDS)


def _weighted_pick(rng: random.Random, words: list[str]) -> str:
    """Earlier words (more frequent upstream) are likelier: geometric weights."""
    weights = [0.5**i for i in range(len(words))]
    return rng.choices(words, weights=weights, k=1)[0]


def _context_bias(book: JokeBook, context: str) -> int:
    """+1 per filled context sentence completed with a punny word, -1 per straight one."""
    bias = 0
    for prompt, joke in book.by_prompt.items():
        pos = context.find(prompt)
        if pos < 0:
            continue
        rest = context[pos + len(prompt) :].split()
        if not rest:
            continue
        word = re.sub(r"[^a-zA-Z'-]", "", rest[0]).lower()
        if word in (w.lower() for w in joke.punny):
            bias += 1
        elif word in (w.lower() for w in joke.straight):
            bias -= 1
    return bias


def _find_target(book: JokeBook, user: str) -> tuple[JokeRecord | None, str]:
    text = user.rstrip()
    joke = book.by_prompt.get(text)
    if joke is not None:
        return joke, ""
    best: JokeRecord | None = None
    best_prompt = ""
    for prompt, candidate in book.by_prompt.items():
        if text.endswith(prompt) and len(prompt) > len(best_prompt):
            best, best_prompt = candidate, prompt
    return best, text[: len(text) - len(best_prompt)] if best else text


def _pun_word(rng: random.Random, knobs: AnswerKnobs, book: JokeBook, model: str, user: str, *, greedy: bool) -> str:
    joke, context = _find_target(book, user)
    if joke is None or not (joke.straight or joke.punny):
        word = rng.choice(GENERIC_WORDS)
    else:
        p = min(0.99, base_funny_propensity(model, knobs.funny_propensity) * joke_factor(knobs.seed, joke.sentence))
        bias = _context_bias(book, context) if context else 0
        if bias > 0:  # punny context unlocks the pun, the more so the larger the model
            size = model_size_b(model) or 8.0
            p = min(0.95, p * 2.5 + 0.1 + 0.12 * math.log10(max(size, 1.0)))
        elif bias < 0:
            p = p * 0.5
        # Greedy answers draw too (from an rng seeded by the key alone), so they are stable per
        # prompt but, over many jokes, funny at the model's propensity.
        punny = bool(joke.punny) and (rng.random() < p or not joke.straight)
        pool = joke.punny if punny else joke.straight
        word = pool[0] if greedy else _weighted_pick(rng, pool)
    if rng.random() < knobs.noise_rate:
        variant = rng.randrange(4)
        word = (f"{word.capitalize()}.", f" {word}, ", f"{word}!", f'"{word}"')[variant]
    return word


def _classify(rng: random.Random, knobs: AnswerKnobs, book: JokeBook, text: str) -> str:
    result: dict[str, dict[str, str]] = {}
    for index_s, block in _JOKE_BLOCK_RE.findall(text):
        cands = _literal_list(_CANDIDATES_RE.search(block))
        known = {kind: [w.lower() for w in _literal_list(m)] for kind, m in _iter_known(block)}
        joke = book.by_index.get(int(index_s))
        straight = {w.lower() for w in joke.straight} if joke else set(known.get("straight", []))
        punny = {w.lower() for w in joke.punny} if joke else set(known.get("punny", []))
        verdicts: dict[str, str] = {}
        for word in cands:
            if word.lower() in punny:
                verdicts[word] = "funny"
            elif word.lower() in straight:
                verdicts[word] = "straight"
            else:
                r = rng.random()
                verdicts[word] = "straight" if r < 0.5 else ("other" if r < 0.9 else "funny")
        result[index_s] = verdicts
    body = json.dumps(result)
    if rng.random() < knobs.noise_rate:
        body = f"```json\n{body}\n```"
    return body


def _iter_known(block: str) -> list[tuple[str, re.Match[str]]]:
    return [(m.group(1), m) for m in _KNOWN_RE.finditer(block)]


def _literal_list(match: re.Match[str] | None) -> list[str]:
    if match is None:
        return []
    try:
        value = ast.literal_eval(match.group(match.lastindex or 1))
    except (ValueError, SyntaxError):
        return []
    return [str(v) for v in value] if isinstance(value, list) else []


def _ratings(rng: random.Random, knobs: AnswerKnobs, text: str) -> str:
    jokes = _JOKE_ID_RE.findall(text)
    if not jokes:
        count = max(1, len(set(_NUMBERED_RE.findall(text))))
        return json.dumps([rng.randint(3, 10) for _ in range(count)])
    items = []
    for id_s, sentence in jokes:
        score = rng.randint(3, 10)
        if sentence.startswith(REWORD_PREFIX):  # the fake's own repair: usually an improvement
            score = min(10, score + 2)
        items.append({"id": int(id_s), "rating": score})
    body = json.dumps(items)
    return f"```json\n{body}\n```" if rng.random() < knobs.noise_rate else body


def _repair(rng: random.Random, knobs: AnswerKnobs, text: str) -> str:
    """The joke of a repair prompt with a reworded sentence that keeps its one blank."""
    match = _REPAIR_JOKE_RE.search(text)
    joke = json.loads(match.group(1)) if match else {}
    sentence = str(joke.get("sentence", "It is hard to improve a joke nobody has ___"))
    if not sentence.startswith(REWORD_PREFIX):
        sentence = REWORD_PREFIX + sentence[:1].lower() + sentence[1:]
    body = json.dumps(
        {
            "sentence": sentence,
            "straight": joke.get("straight") or ["answer"],
            "punny": joke.get("punny") or ["pun"],
            "explanation": str(joke.get("explanation", "")),
        }
    )
    return f"```json\n{body}\n```" if rng.random() < knobs.noise_rate else body


def _humor(rng: random.Random, knobs: AnswerKnobs, model: str, reference: str | None) -> str:
    cls = rng.choice(HUMOR_CLASSES)
    letter = rng.choice(HUMOR_LETTERS)
    right = split_output(reference) if reference is not None else None
    if right is not None:
        right_cls, right_letter = right
        skill = humor_skill(model, knobs.humor_skill)
        if rng.random() < skill:
            cls = right_cls
        if rng.random() < min(0.95, skill + 0.1):
            letter = right_letter
    if rng.random() >= knobs.format_variant_rate:
        return f"ОТВЕТ {cls}\nРЕШЕНИЕ {letter}"
    variant = rng.randrange(3)
    if variant == 0:
        return f"**ОТВЕТ:** {cls}\n**РЕШЕНИЕ:** {letter}"
    if variant == 1:
        return f"ответ: {cls.lower()}\nрешение: {letter}"
    return f"Подумаем.\nОТВЕТ: «{cls}»\nРЕШЕНИЕ: {letter}."


_OPTIONS_RE = re.compile(r"^Options:[ \t]*(.+)$", re.M)
_REFERENCE_RE = re.compile(r"^Reference:[ \t]*(.*)$", re.M)
_RESPONSE_RE = re.compile(r"^Response:[ \t]*(.*?)(?=^\w+:|\Z)", re.M | re.S)


def _generic(rng: random.Random, knobs: AnswerKnobs, text: str, options_line: str) -> str:
    """One of the prompt's options, in the format the prompt asks for."""
    options = [o.strip() for o in options_line.split("|") if o.strip()] or list(GENERIC_WORDS)
    pick = rng.choice(options)
    hedge = rng.random() < knobs.noise_rate / 2
    if "JSON" in text:
        if hedge:
            return f"I would say {pick}, but I am not sure."
        body = json.dumps({"answer": pick, "confidence": round(0.5 + rng.random() / 2, 2)})
        return f"```json\n{body}\n```" if rng.random() < knobs.format_variant_rate else body
    if hedge:
        return f"It could be {pick}, or perhaps not."
    return f"Answer: {pick}" if rng.random() >= knobs.format_variant_rate else f"Let me think.\nAnswer: {pick}."


def _verdict(rng: random.Random, knobs: AnswerKnobs, text: str) -> str:
    reference, response = _REFERENCE_RE.search(text), _RESPONSE_RE.search(text)
    assert reference is not None and response is not None
    ref = reference.group(1).strip().lower()
    right = bool(ref) and ref in response.group(1).lower()
    if rng.random() < knobs.judge_flip_rate:
        right = not right
    return f"VERDICT: {'correct' if right else 'incorrect'}"


# the reference and the graded answer inside :func:`data.humor.judge.judge_request`'s prompt
_JUDGE_REFERENCE_RE = re.compile(rf"^{re.escape(REFERENCE_LABEL)} (.*)$", re.M)
_JUDGE_ANSWER_RE = re.compile(rf"{re.escape(ANSWER_BEGIN)}\n(.*?)\n{re.escape(ANSWER_END)}", re.S)


def _judge(rng: random.Random, knobs: AnswerKnobs, text: str) -> str:
    reference, graded = _JUDGE_REFERENCE_RE.search(text), _JUDGE_ANSWER_RE.search(text)
    if reference is None or graded is None:
        return f"SCORE: {1 if rng.random() < 0.7 else 0}"
    parsed = parsed_output(graded.group(1))
    right = parsed is not None and split_output(parsed) == split_output(reference.group(1))
    if rng.random() < knobs.judge_flip_rate:
        right = not right
    return f"SCORE: {int(right)}"


_MERA_JUDGE_RE = re.compile(
    rf"{re.escape(MERA_REFERENCE_HEADER)}\n(.*?)\n\n{re.escape(MERA_ANSWER_HEADER)}\n(.*?)\n\n"
    rf"{re.escape(MERA_CRITERIA_HEADER)}",
    re.S,
)


def _mera_judge(rng: random.Random, knobs: AnswerKnobs, text: str) -> str:
    m = _MERA_JUDGE_RE.search(text)
    if m is None:
        return f"Оценка: {rng.choice((0, 1, 2))}"
    parsed = parsed_output(m.group(2))
    right = parsed is not None and split_output(parsed) == split_output(m.group(1))
    if rng.random() < knobs.judge_flip_rate:
        right = not right
    return f"Оценка: {2 if right else 0}"
