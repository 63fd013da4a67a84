"""The Puns pipeline's simulated answers (its ``simulate`` hook; :mod:`punchline.data.simulator` says how the
simulated provider asks for them).

* pun completion (system prompt = :data:`data.puns.completions.SYSTEM_PROMPT` or the cloze benchmark's): one word
  from the joke's straight or punny list, funnier for larger models and after punny context, sometimes with noise
  (``"Suit."``, ``" suit, "``) so that word extraction is exercised; the jokes are the answer key's
  (``[simulator.pipeline_knobs.puns] answer_key``, default the sample's);
* candidate classification (``"classify each candidate word"``): a JSON object, sometimes fenced.
"""

from __future__ import annotations

import ast
import functools
import json
import math
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import msgspec

from punchline.data.simulator import Rate, SimRequest, by_size, model_size_b, rng_for, sample_file
from punchline.pipelines.puns.data.cloze_run import SYSTEM_PROMPT as CLOZE_SYSTEM_PROMPT
from punchline.pipelines.puns.data.completions import SYSTEM_PROMPT

GENERIC_WORDS: tuple[str, ...] = ("time", "way", "day", "friend", "idea", "reason", "problem", "plan", "home", "job")

_JOKE_BLOCK_RE = re.compile(r"Joke index (\d+):(.*?)(?=Joke index \d+:|\Z)", re.S)
_CANDIDATES_RE = re.compile(r"Candidates:\s*(\[.*?\])", re.S)
_KNOWN_RE = re.compile(r"Known (straight|punny):\s*(\[.*?\])", re.S)


class PunsSimKnobs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The jokes the simulated provider knows, and how funny each model is."""

    answer_key: Annotated[
        str | list[str] | None,
        msgspec.Meta(description="puns JSON file(s) whose jokes it knows; default: data/samples/puns_sample.json"),
    ] = None
    funny_propensity: Annotated[
        dict[str, Rate], msgspec.Meta(description="model-id substring -> P(punny word) in a neutral context")
    ] = {}


class JokeRecord(msgspec.Struct):
    """The fields of a ``puns_205.json`` entry the simulator needs (others are ignored)."""

    index: int
    sentence: str
    straight: list[str]
    punny: list[str]


@dataclass
class JokeBook:
    """The jokes the simulator knows, indexed by their prompt (sentence up to the blank)."""

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


@functools.lru_cache(maxsize=8)
def _book(paths: tuple[str, ...]) -> JokeBook:
    return JokeBook.load(list(paths))


def book_of(knobs: PunsSimKnobs) -> JokeBook:
    """The jokes the knobs name (loaded once per set of files), else the sample's."""
    given = knobs.answer_key or sample_file("puns_sample.json")
    return _book(tuple([given] if isinstance(given, str) else given or ()))


def _prompt_of(sentence: str) -> str:
    return sentence[: sentence.index("___")].rstrip()


def base_funny_propensity(model: str, overrides: dict[str, float]) -> float:
    """Probability of a punny word with neutral context; larger models are funnier."""
    return by_size(model, overrides, base=0.02, per_decade=0.1, cap=0.6)


def joke_factor(seed: int, prompt: str) -> float:
    """How pun-prone a joke is, fixed per joke: most jokes are heard straight, some invite the pun,
    a few are always punned, so the simulated data spreads over all four tiers as real data does."""
    r = rng_for(seed, prompt, 0, "joke").random()
    if r < 0.45:
        return 0.05
    if r < 0.88:
        return 0.5 + 2.5 * (r - 0.45) / 0.43
    return 50.0


def simulate(request: SimRequest) -> str | None:
    """The answer to one of Puns' prompts; None for any other prompt."""
    text = request.text
    knobs: PunsSimKnobs = request.knobs if isinstance(request.knobs, PunsSimKnobs) else PunsSimKnobs()
    if "classify each candidate word" in text:
        return _classify(request.rng(), request.noise_rate, book_of(knobs), text)
    if request.system.strip() in (SYSTEM_PROMPT, CLOZE_SYSTEM_PROMPT) or SYSTEM_PROMPT in text:
        return _pun_word(request, knobs, book_of(knobs))
    return None


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


def _pun_word(request: SimRequest, knobs: PunsSimKnobs, book: JokeBook) -> str:
    rng, model = request.rng(), request.model
    joke, context = _find_target(book, request.user)
    if joke is None or not (joke.straight or joke.punny):
        word = rng.choice(GENERIC_WORDS)
    else:
        p = min(0.99, base_funny_propensity(model, knobs.funny_propensity) * joke_factor(request.seed, joke.sentence))
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
        word = pool[0] if request.greedy else _weighted_pick(rng, pool)
    if rng.random() < request.noise_rate:
        variant = rng.randrange(4)
        word = (f"{word.capitalize()}.", f" {word}, ", f"{word}!", f'"{word}"')[variant]
    return word


def _classify(rng: random.Random, noise_rate: float, book: JokeBook, text: str) -> str:
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
    if rng.random() < noise_rate:
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
