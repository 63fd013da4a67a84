"""The curation pipeline's simulated answers (its ``simulate`` hook; :mod:`punchline.data.simulator` says how the
simulated provider asks for them).

* repair prompts (:data:`data.puns.curation.REPAIR_MARKER`): the joke as JSON, reworded;
* rating prompts (``"rate"`` + ``"json"``, listing ``Joke id N:`` lines): ``[{"id", "rating"}]``, sometimes
  fenced; a reworded joke (the simulator's own repair) scores higher.
"""

from __future__ import annotations

import json
import random
import re

from punchline.data.simulator import SimRequest
from punchline.pipelines.curate.curation import REPAIR_MARKER

REWORD_PREFIX = "Believe it or not, "
_JOKE_ID_RE = re.compile(r"^Joke id (\d+): (.*)$", re.M)
_REPAIR_JOKE_RE = re.compile(r"^Joke: (\{.*\})$", re.M)


def simulate(request: SimRequest) -> str | None:
    """The answer to one of curation's prompts; None for any other prompt."""
    text = request.text
    if REPAIR_MARKER in text:
        return _repair(request.rng(), request.noise_rate, text)
    lower = text.lower()
    if "rate" in lower and "json" in lower:
        jokes = _JOKE_ID_RE.findall(text)
        if jokes:
            return _ratings(request.rng(), request.noise_rate, jokes)
    return None


def _ratings(rng: random.Random, noise_rate: float, jokes: list[tuple[str, str]]) -> str:
    items = []
    for id_s, sentence in jokes:
        score = rng.randint(3, 10)
        if sentence.startswith(REWORD_PREFIX):  # the simulator's own repair: usually an improvement
            score = min(10, score + 2)
        items.append({"id": int(id_s), "rating": score})
    body = json.dumps(items)
    return f"```json\n{body}\n```" if rng.random() < noise_rate else body


def _repair(rng: random.Random, noise_rate: float, text: str) -> str:
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
    return f"```json\n{body}\n```" if rng.random() < noise_rate else body
