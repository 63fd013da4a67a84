"""Response validators named by :attr:`cluster.pipeline.UnitSpec.check`.

A validator rejects an answer that parses badly *before* it is cached, by raising a retryable
error: the unit is retried a bounded number of times instead of poisoning the cache forever.
"""

from __future__ import annotations

from collections.abc import Callable

from data.errors import RetryableProviderError
from workers.provider import ProviderResponse

Validator = Callable[[ProviderResponse], None]


def _non_empty(response: ProviderResponse) -> None:
    if not response.texts:
        raise RetryableProviderError("provider returned no choices")


def _classify_json(response: ProviderResponse) -> None:
    from data.classify import parse_verdicts

    _non_empty(response)
    try:
        parse_verdicts(response.texts[0])
    except Exception as exc:
        raise RetryableProviderError(f"classification answer is not valid verdict JSON: {exc}") from None


def _judge_score(response: ProviderResponse) -> None:
    from data.humor.judge import parse_score

    _non_empty(response)
    try:
        parse_score(response.texts[0])
    except Exception as exc:
        raise RetryableProviderError(f"judge answer has no valid score: {exc}") from None


VALIDATORS: dict[str, Validator] = {
    "": _non_empty,
    "classify_json": _classify_json,
    "judge_score": _judge_score,
}


def validator(name: str) -> Validator:
    try:
        return VALIDATORS[name]
    except KeyError:
        raise KeyError(f"unknown response validator {name!r}; known: {sorted(VALIDATORS)}") from None
