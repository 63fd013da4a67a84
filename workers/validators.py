"""Response validators named by :attr:`cluster.pipeline.UnitSpec.check`.

A validator rejects an answer that parses badly *before* it is cached, by raising a retryable
error: the unit is retried a bounded number of times instead of poisoning the cache forever.
"""

from __future__ import annotations

from collections.abc import Callable

from punchline.data.errors import RetryableProviderError
from punchline.data.humor.judge import parse_score
from punchline.data.puns.classify import parse_verdicts
from punchline.data.puns.curation import Candidate, parse_ratings, parse_repair
from punchline.data.requests import ProviderResponse

Validator = Callable[[ProviderResponse], None]


def _non_empty(response: ProviderResponse) -> None:
    if not response.texts:
        raise RetryableProviderError("provider returned no choices")


def _classify_json(response: ProviderResponse) -> None:
    _non_empty(response)
    try:
        parse_verdicts(response.texts[0])
    except Exception as exc:
        raise RetryableProviderError(f"classification answer is not valid verdict JSON: {exc}") from None


def _judge_score(response: ProviderResponse) -> None:
    _non_empty(response)
    try:
        parse_score(response.texts[0])
    except Exception as exc:
        raise RetryableProviderError(f"judge answer has no valid score: {exc}") from None


def _curate_ratings(ids: str, response: ProviderResponse) -> None:
    """``curate_ratings:3,5,8``: a JSON array rating exactly the jokes 3, 5 and 8."""
    _non_empty(response)
    parse_ratings(response.texts[0], [int(i) for i in ids.split(",")])


def _curate_repair(cand_id: str, response: ProviderResponse) -> None:
    """``curate_repair:7``: a repaired joke with exactly one blank (for candidate 7)."""
    _non_empty(response)
    parse_repair(response.texts[0], Candidate(id=int(cand_id), sentence="", straight=[], punny=[]))


VALIDATORS: dict[str, Validator] = {
    "": _non_empty,
    "classify_json": _classify_json,
    "judge_score": _judge_score,
}


# validators that take an argument after a colon (``name:arg``), e.g. the ids a reply must rate
PARAMETRISED: dict[str, Callable[[str, ProviderResponse], None]] = {
    "curate_ratings": _curate_ratings,
    "curate_repair": _curate_repair,
}


def validator(name: str) -> Validator:
    base, sep, arg = name.partition(":")
    if sep and base in PARAMETRISED:
        check = PARAMETRISED[base]
        return lambda response: check(arg, response)
    try:
        return VALIDATORS[name]
    except KeyError:
        known = sorted(VALIDATORS) + [f"{n}:<arg>" for n in sorted(PARAMETRISED)]
        raise KeyError(f"unknown response validator {name!r}; known: {known}") from None
