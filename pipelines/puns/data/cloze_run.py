"""Asking a model a cloze test, and recording its answer in the upstream benchmark shape.

The settings are upstream's benchmark settings (greedy, at most 10 tokens, stop at the first
newline or sentence punctuation) so that our answers are comparable with the published ones.
"""

from __future__ import annotations

from punchline.data.requests import Message, ProviderRequest
from punchline.pipelines.puns.data.schemas import ClozeResponse, ClozeTest
from punchline.pipelines.puns.data.words import extract_word

SYSTEM_PROMPT = (
    "You are completing a text. Given the text below, output only the "
    "single next word that best continues it. Output ONLY that one word, "
    "nothing else \u2014 no punctuation, no explanation."
)
MAX_TOKENS = 10
STOP = ("\n", ".", ",", "!")


def cloze_request(provider: str, model_id: str, test: ClozeTest) -> ProviderRequest:
    """The greedy one-word completion of the test's prompt."""
    return ProviderRequest(
        provider=provider,
        model=model_id,
        messages=(Message("system", SYSTEM_PROMPT), Message("user", test.prompt)),
        temperature=0.0,
        max_tokens=MAX_TOKENS,
        n=1,
        stop=STOP,
    )


def to_response(test: ClozeTest, text: str | None) -> ClozeResponse:
    """The answer record: the raw text (stripped, as upstream stored it) and its first word."""
    raw = (text or "").strip()
    return ClozeResponse(pair_id=test.pair_id, type=test.type, raw_response=raw, extracted_word=extract_word(raw))
