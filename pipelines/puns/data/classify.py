"""Stage 4: which sampled first words are straight answers, which are puns, and which are noise.

Words already listed for a joke are classified without asking anyone; only the rest go to a judge
model, ten jokes per call, with upstream's instructions. The judge's answer is parsed strictly: a
reply that is not the JSON we asked for is a malformed provider response (retryable), never a
silent "other" for the whole batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import msgspec

from punchline.data.errors import RetryableProviderError
from punchline.data.requests import Message, ProviderRequest, ProviderResponse
from punchline.pipelines.puns.data.schemas import ClassifiedEntry, RawCompletionEntry, WordClass

BATCH_SIZE = 10
MAX_TOKENS = 4096

Verdicts = dict[str, dict[str, WordClass]]


class MalformedVerdicts(RetryableProviderError):
    """The judge's reply is not ``{"<index>": {"<word>": "straight|funny|other"}}``."""


class ClassifyItem(msgspec.Struct, frozen=True):
    """One joke's share of a classification prompt."""

    index: int
    sentence: str
    existing_straight: list[str]
    existing_punny: list[str]
    candidates: list[str]


def _known(entry: RawCompletionEntry | ClassifiedEntry) -> tuple[set[str], set[str]]:
    return {w.lower() for w in entry.existing_straight}, {w.lower() for w in entry.existing_punny}


def candidates(entry: RawCompletionEntry | ClassifiedEntry) -> list[str]:
    """Sampled words (most common first) that neither known list contains, compared lowercased."""
    straight, punny = _known(entry)
    return [w for w in entry.aggregated.word_counts if w not in straight and w not in punny]


def batches(
    entries: Iterable[RawCompletionEntry | ClassifiedEntry], size: int = BATCH_SIZE
) -> list[list[ClassifyItem]]:
    """Jokes with at least one unknown word, in checkpoint order, ``size`` per judge call."""
    if size < 1:
        raise ValueError("batch size must be at least 1")
    items = [
        ClassifyItem(e.index, e.sentence, list(e.existing_straight), list(e.existing_punny), cands)
        for e in entries
        if (cands := candidates(e))
    ]
    return [items[i : i + size] for i in range(0, len(items), size)]


def _py_list(words: Sequence[str]) -> str:
    """Lists are shown to the judge the way upstream showed them (Python's list repr)."""
    return repr(list(words))


def classify_prompt(batch: Sequence[ClassifyItem]) -> str:
    parts = [
        f"Joke index {item.index}:\n"
        f"  Sentence: {item.sentence}\n"
        f"  Known straight: {_py_list(item.existing_straight)}\n"
        f"  Known punny: {_py_list(item.existing_punny)}\n"
        f"  Candidates: {_py_list(item.candidates)}\n"
        for item in batch
    ]
    instructions = (
        "For each joke below, classify each candidate word as:\n"
        "- 'straight': a sensible literal/non-punny completion for the blank (___)\n"
        "- 'funny': exploits a double meaning, wordplay, or pun in the context\n"
        "- 'other': doesn't fit the blank well, is a filler/function word, or is nonsensical\n\n"
        "A word is 'funny' if it works BOTH literally in the sentence AND has a second "
        "meaning that connects to the subject. A word is 'straight' if it's a reasonable "
        "literal completion without wordplay.\n\n"
    )
    answer_format = (
        '\nRespond with JSON only. Format: {"<index>": {"<word>": "straight|funny|other", ...}, ...}\n'
        "No markdown fences, just the raw JSON."
    )
    return instructions + "\n".join(parts) + answer_format


def classify_request(provider: str, model_id: str, batch: Sequence[ClassifyItem]) -> ProviderRequest:
    """One deterministic judge call (temperature 0) for up to ten jokes."""
    return ProviderRequest(
        provider=provider,
        model=model_id,
        messages=(Message("user", classify_prompt(batch)),),
        temperature=0.0,
        max_tokens=MAX_TOKENS,
        n=1,
    )


_VERDICTS_DECODER = msgspec.json.Decoder(Verdicts)


def parse_verdicts(text: str) -> Verdicts:
    """``{index: {word: class}}`` from the judge's reply; a surrounding ``` fence is tolerated."""
    body = text.strip()
    if body.startswith("```"):
        body = body.split("\n", 1)[1] if "\n" in body else ""
        body = body.rsplit("```", 1)[0].strip()
    try:
        return _VERDICTS_DECODER.decode(body.encode("utf-8"))
    except msgspec.ValidationError as exc:
        raise MalformedVerdicts(f"judge reply has an invalid verdict: {exc}") from None
    except msgspec.DecodeError as exc:
        raise MalformedVerdicts(f"judge reply is not JSON: {exc}; reply starts {text[:80]!r}") from None


def merge(
    entry: RawCompletionEntry | ClassifiedEntry, verdicts: Mapping[str, Mapping[str, WordClass]]
) -> ClassifiedEntry:
    """Class of every sampled word: known lists first, then the judge's verdict, else "other".

    ``verdicts`` is what :func:`parse_verdicts` returns (merged over all batches):
    joke index (as a string) -> word -> class.
    """
    straight, punny = _known(entry)
    mine = verdicts.get(str(entry.index), {})
    classes: dict[str, WordClass] = {}
    for word in entry.aggregated.word_counts:
        if word in straight:
            classes[word] = "straight"
        elif word in punny:
            classes[word] = "funny"
        else:
            classes[word] = mine.get(word, "other")
    return ClassifiedEntry(
        index=entry.index,
        sentence=entry.sentence,
        prompt=entry.prompt,
        existing_straight=entry.existing_straight,
        existing_punny=entry.existing_punny,
        models=entry.models,
        aggregated=entry.aggregated,
        classifications=classes,
    )


def merge_all(
    raw: Mapping[str, RawCompletionEntry], verdicts: Mapping[str, Mapping[str, WordClass]]
) -> dict[str, ClassifiedEntry]:
    """The stage 4 checkpoint: every joke of the stage 3 checkpoint, same keys and order."""
    return {key: merge(entry, verdicts) for key, entry in raw.items()}


def check_verdicts(response: ProviderResponse) -> None:
    """The classify stage's response validator (``UnitSpec.check``): the answer must be verdict JSON."""
    try:
        parse_verdicts(response.texts[0])
    except Exception as exc:
        raise RetryableProviderError(f"classification answer is not valid verdict JSON: {exc}") from None
