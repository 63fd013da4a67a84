"""Stage 3 (completion collection): the exact provider requests upstream made, and their aggregation.

The request builders are the single source of truth for cache keys: the pipeline, ``plan`` and
``import-legacy`` all call them, so a legacy checkpoint lands under the key a run will look up.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from punchline.data.requests import Message, ProviderRequest
from punchline.pipelines.puns.data.schemas import Aggregated, ModelCompletions, PunEntry, RawCompletionEntry

SYSTEM_PROMPT = (
    "You are completing a text. Output only the single next word "
    "that best continues the text. Output ONLY that one word, "
    "nothing else \u2014 no punctuation, no explanation."
)
SAMPLE_TEMPERATURE = 0.8
SAMPLES_PER_MODEL = 20
MAX_TOKENS = 5
STOP = ("\n",)


def truncate_before_blank(sentence: str) -> str:
    """The prompt of a joke: the sentence up to the blank, trailing whitespace removed."""
    return sentence[: sentence.index("___")].rstrip()


def _messages(prompt: str) -> tuple[Message, ...]:
    return (Message("system", SYSTEM_PROMPT), Message("user", prompt))


def sample_request(
    provider: str, model_id: str, prompt: str, *, n: int = SAMPLES_PER_MODEL, sample_slot: int = 0
) -> ProviderRequest:
    """The sampled call: ``n`` completions at temperature 0.8 in one request."""
    return ProviderRequest(
        provider=provider,
        model=model_id,
        messages=_messages(prompt),
        temperature=SAMPLE_TEMPERATURE,
        max_tokens=MAX_TOKENS,
        n=n,
        stop=STOP,
        sample_slot=sample_slot,
    )


def greedy_request(provider: str, model_id: str, prompt: str) -> ProviderRequest:
    """The greedy call: one completion at temperature 0."""
    return ProviderRequest(
        provider=provider,
        model=model_id,
        messages=_messages(prompt),
        temperature=0.0,
        max_tokens=MAX_TOKENS,
        n=1,
        stop=STOP,
    )


# --- aggregation (stage 3 checkpoint) ------------------------------------------------------------


def aggregate(models: Mapping[str, ModelCompletions]) -> Aggregated:
    """Counts over every model's samples, most common first, as upstream's ``Counter.most_common()``.

    Ties keep first-seen order (models in mapping order, samples in order); empty greedy words are
    not counted; ``total_samples`` is the sum of the word counts.
    """
    words: Counter[str] = Counter()
    greedy: Counter[str] = Counter()
    for completions in models.values():
        if completions.greedy:
            greedy[completions.greedy] += 1
        words.update(completions.samples)
    return Aggregated(
        word_counts=dict(words.most_common()),
        greedy_counts=dict(greedy.most_common()),
        total_samples=sum(words.values()),
    )


def build_raw_entry(joke: PunEntry, models: Mapping[str, ModelCompletions]) -> RawCompletionEntry:
    """One joke's stage 3 record from its per-model completions (models in the order they were run)."""
    return RawCompletionEntry(
        index=joke.index,
        sentence=joke.sentence,
        prompt=truncate_before_blank(joke.sentence),
        existing_straight=list(joke.straight),
        existing_punny=list(joke.punny),
        models=dict(models),
        aggregated=aggregate(models),
    )
