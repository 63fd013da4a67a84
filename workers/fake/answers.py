"""Deterministic answers for the fake provider, derived only from the request content.

Every answer is a pure function of (request key, choice index, seed, model), so a test that replays
the same requests gets the same texts, and a split ``n`` call gives the same texts as one ``n`` call.

The installed pipelines answer their own requests first (:mod:`punchline.workers.fake.simulators` finds their
``simulate`` hooks; the built-ins' are in ``pipelines/<name>/simulate.py``); then the run's generic stages
(:mod:`punchline.workers.fake.stage_answers`: what each parses, right at each model's accuracy); a prompt none of
them claims gets a generic answer, from the prompt alone (the fake knows no answers):

* a prompt with ``VERDICT`` and ``Reference:`` / ``Response:`` lines is graded ``VERDICT: correct|incorrect`` by
  whether the response names the reference, flipped now and then;
* a prompt with an ``Options: a | b | c`` line is answered with one of them, drawn from the request's seed — as
  JSON ``{"answer", "confidence"}`` when the prompt says ``JSON`` (sometimes fenced, sometimes prose: a parse
  failure), else ``Answer: <option>`` (sometimes hedged prose);
* a prompt asking to rate (``"rate"`` + ``"json"``): a JSON array of integer scores, one per numbered line;
* anything else: one common word.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence

import msgspec

from punchline.data.simulator import SimRequest
from punchline.workers.fake.simulators import Simulator
from punchline.workers.fake.stage_answers import GENERIC_WORDS, StageBook, prompt_options

_NUMBERED_RE = re.compile(r"^\s*(\d+)[.):]\s", re.M)
_REFERENCE_RE = re.compile(r"^Reference:[ \t]*(.*)$", re.M)
_RESPONSE_RE = re.compile(r"^Response:[ \t]*(.*?)(?=^\w+:|\Z)", re.M | re.S)


def answer(
    request: SimRequest,
    simulators: Sequence[Simulator] = (),
    knobs: dict[str, object] | None = None,
    stages: StageBook | None = None,
) -> str:
    """The text of one choice: the first installed pipeline's that claims the prompt (each given its own knobs,
    ``knobs[name]``), else the run's generic stages' (``stages``), else a generic one. At temperature 0 every
    choice of a key is the same (greedy)."""
    for sim in simulators:
        own = (knobs or {}).get(sim.name)
        text = sim.simulate(msgspec.structs.replace(request, knobs=own) if own is not None else request)
        if text is not None:
            return text
    if stages:
        text = stages.answer(request)
        if text is not None:
            return text
    return generic(request)


def generic(request: SimRequest) -> str:
    """The answer to a prompt no pipeline claims (see the module doc)."""
    rng = request.rng()
    text = request.text
    if "VERDICT" in text and _REFERENCE_RE.search(text) and _RESPONSE_RE.search(text):
        return _verdict(rng, request.judge_flip_rate, text)
    options = prompt_options(text)
    if options:
        return _options(rng, request, text, options)
    lower = text.lower()
    if "rate" in lower and "json" in lower:
        count = max(1, len(set(_NUMBERED_RE.findall(text))))
        return json.dumps([rng.randint(3, 10) for _ in range(count)])
    return rng.choice(GENERIC_WORDS)


def _options(rng: random.Random, request: SimRequest, text: str, options: list[str]) -> str:
    """One of the prompt's options, in the format the prompt asks for."""
    pick = rng.choice(options)
    hedge = rng.random() < request.noise_rate / 2
    if "JSON" in text:
        if hedge:
            return f"I would say {pick}, but I am not sure."
        body = json.dumps({"answer": pick, "confidence": round(0.5 + rng.random() / 2, 2)})
        return f"```json\n{body}\n```" if rng.random() < request.format_variant_rate else body
    if hedge:
        return f"It could be {pick}, or perhaps not."
    return f"Answer: {pick}" if rng.random() >= request.format_variant_rate else f"Let me think.\nAnswer: {pick}."


def _verdict(rng: random.Random, flip_rate: float, text: str) -> str:
    reference, response = _REFERENCE_RE.search(text), _RESPONSE_RE.search(text)
    assert reference is not None and response is not None
    ref = reference.group(1).strip().lower()
    right = bool(ref) and ref in response.group(1).lower()
    if rng.random() < flip_rate:
        right = not right
    return f"VERDICT: {'correct' if right else 'incorrect'}"
