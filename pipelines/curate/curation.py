"""Puns stages 1-2: rate candidate jokes with several LLMs, repair the weak ones, keep the best.

Answers are parsed strictly: a rating reply that misses a joke, repeats one or scores outside 0-10
is a malformed provider response (retryable), never a silently partial rating, because a missing
score would change the ranking. :func:`build` is Stage 2 of the seed exactly, plus a last tie-break
on the id so that equal jokes always come out in the same order.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Protocol

import msgspec
from msgspec import UNSET, UnsetType

from punchline.data.errors import InputError, RetryableProviderError
from punchline.data.requests import Message, ProviderRequest, ProviderResponse
from punchline.data.storage.jsonio import decode_file
from punchline.pipelines.puns.data.puns_io import check_sentence
from punchline.pipelines.puns.data.schemas import BLANK, PunEntry

MAX_TOKENS = 1024
REPAIR_MARKER = "Improve this fill-in-the-blank pun"
"""Starts every repair prompt (the simulated provider recognises repair prompts by it)."""

Ratings = dict[str, dict[int, int]]  # rater -> candidate id -> score 0..10


class Candidate(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A candidate joke before rating: the PunEntry fields a writer provides."""

    id: int
    sentence: str
    straight: list[str]
    punny: list[str]
    explanation: str = ""


class MalformedRatings(RetryableProviderError):
    """A rating reply that is not one ``{"id", "rating"}`` object per joke asked about."""


class MalformedRepair(RetryableProviderError):
    """A repair reply that is not a usable joke with one blank."""


# --- loading ----------------------------------------------------------------------------------


def check_candidate(cand: Candidate, *, file: str | None, record: str) -> None:
    check_sentence(cand.sentence, file=file, record=record)
    for field in ("straight", "punny"):
        words: list[str] = getattr(cand, field)
        if not words:
            raise InputError("must list at least one completion", file=file, record=record, field=field)
        if any(not w.strip() for w in words):
            raise InputError("completions must not be blank", file=file, record=record, field=field)


def validate_candidates(cands: Sequence[Candidate], *, file: str | None = None) -> None:
    seen: dict[int, int] = {}
    for position, cand in enumerate(cands):
        record = f"candidate id {cand.id} (position {position})"
        if cand.id in seen:
            raise InputError(
                f"duplicate id {cand.id} (also at position {seen[cand.id]})", file=file, record=record, field="id"
            )
        seen[cand.id] = position
        check_candidate(cand, file=file, record=record)


def load_candidates(path: str | os.PathLike[str]) -> list[Candidate]:
    """A JSON list of candidates; the first bad record fails with file, record and field named."""
    try:
        cands: list[Candidate] = decode_file(path, list[Candidate])
    except InputError as exc:
        if exc.record is not None and str(exc.record).isdigit():
            raise InputError(exc.detail, file=exc.file, record=f"position {exc.record}", field=exc.field) from None
        raise
    validate_candidates(cands, file=str(path))
    return cands


# --- rating -----------------------------------------------------------------------------------


def batches(cands: Sequence[Candidate], size: int) -> list[list[Candidate]]:
    if size < 1:
        raise ValueError("batch size must be at least 1")
    return [list(cands[i : i + size]) for i in range(0, len(cands), size)]


def rating_prompt(batch: Sequence[Candidate]) -> str:
    parts = [
        f"Joke id {c.id}: {c.sentence}\n"
        f"  Punny answer: {c.sentence.replace(BLANK, c.punny[0])}\n"
        f"  Straight answers: {', '.join(c.straight)}\n"
        for c in batch
    ]
    return (
        "Rate each fill-in-the-blank pun below on quality, from 0 (not a pun, or not funny) to 10 "
        "(an excellent pun). A good pun's punny answer fits the sentence literally AND has a second "
        "meaning tied to the subject, while a straight answer fits just as naturally.\n\n"
        + "\n".join(parts)
        + "\nRespond with JSON only: an array with one object per joke, "
        '[{"id": <joke id>, "rating": <integer 0-10>}, ...]. '
        "No markdown fences, just the raw JSON."
    )


def rating_request(provider: str, model_id: str, batch: Sequence[Candidate]) -> ProviderRequest:
    """One deterministic (temperature 0) rating call for a batch of jokes."""
    return ProviderRequest(
        provider=provider,
        model=model_id,
        messages=(Message("user", rating_prompt(batch)),),
        temperature=0.0,
        max_tokens=MAX_TOKENS,
    )


class _Rating(msgspec.Struct, forbid_unknown_fields=True):
    id: int
    rating: int


def _unfence(text: str) -> str:
    body = text.strip()
    if body.startswith("```"):
        body = body.split("\n", 1)[1] if "\n" in body else ""
        body = body.rsplit("```", 1)[0].strip()
    return body


_RATINGS_DECODER = msgspec.json.Decoder(list[_Rating])


def parse_ratings(text: str, expected_ids: Sequence[int]) -> dict[int, int]:
    """``{id: rating}`` from a rating reply: every expected id exactly once, integers 0..10."""
    try:
        items = _RATINGS_DECODER.decode(_unfence(text).encode("utf-8"))
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise MalformedRatings(
            f"rating reply is not a JSON array of {{id, rating}}: {exc}; starts {text[:80]!r}"
        ) from None
    out: dict[int, int] = {}
    expected = set(expected_ids)
    for item in items:
        if item.id not in expected:
            raise MalformedRatings(f"rating reply rates id {item.id}, which was not asked about")
        if item.id in out:
            raise MalformedRatings(f"rating reply rates id {item.id} twice")
        if not 0 <= item.rating <= 10:
            raise MalformedRatings(f"rating {item.rating} of id {item.id} is outside 0..10")
        out[item.id] = item.rating
    missing = sorted(expected - out.keys())
    if missing:
        raise MalformedRatings(f"rating reply misses ids {missing}")
    return {i: out[i] for i in expected_ids}


def mean_rating(cand_id: int, ratings: Ratings) -> float | None:
    scores = [r[cand_id] for r in ratings.values() if cand_id in r]
    return sum(scores) / len(scores) if scores else None


def needs_repair(cands: Sequence[Candidate], ratings: Ratings, below: float) -> list[Candidate]:
    """Jokes whose mean first rating is below ``below`` (unrated jokes are not repaired)."""
    return [c for c in cands if (m := mean_rating(c.id, ratings)) is not None and m < below]


# --- repair -----------------------------------------------------------------------------------


def repair_prompt(cand: Candidate) -> str:
    joke = json.dumps(
        {"sentence": cand.sentence, "straight": cand.straight, "punny": cand.punny, "explanation": cand.explanation}
    )
    return (
        f"{REPAIR_MARKER}. Reviewers found it weak. Make the pun sharper: the punny answer must fit the "
        "sentence literally and carry a second meaning tied to the subject, and a straight answer must "
        f"fit just as naturally. Keep exactly one blank ({BLANK}) at the end of the sentence.\n\n"
        f"Joke: {joke}\n\n"
        'Respond with JSON only: {"sentence": "...", "straight": [...], "punny": [...], "explanation": "..."}. '
        "No markdown fences, just the raw JSON."
    )


def repair_request(provider: str, model_id: str, cand: Candidate) -> ProviderRequest:
    return ProviderRequest(
        provider=provider,
        model=model_id,
        messages=(Message("user", repair_prompt(cand)),),
        temperature=0.0,
        max_tokens=MAX_TOKENS,
    )


class _Repair(msgspec.Struct, forbid_unknown_fields=True):
    sentence: str
    straight: list[str]
    punny: list[str]
    explanation: str


_REPAIR_DECODER = msgspec.json.Decoder(_Repair)


def parse_repair(text: str, cand: Candidate) -> Candidate:
    """The repaired joke (same id); a reply without exactly one blank or with empty answers is malformed."""
    try:
        rep = _REPAIR_DECODER.decode(_unfence(text).encode("utf-8"))
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise MalformedRepair(f"repair reply is not the joke JSON asked for: {exc}; starts {text[:80]!r}") from None
    out = Candidate(
        id=cand.id,
        sentence=rep.sentence.strip(),
        straight=[w.strip() for w in rep.straight],
        punny=[w.strip() for w in rep.punny],
        explanation=rep.explanation,
    )
    try:
        check_candidate(out, file=None, record=f"repair of candidate id {cand.id}")
    except InputError as exc:
        raise MalformedRepair(str(exc)) from None
    return out


# --- Stage 2 ------------------------------------------------------------------------------------


class CurateRules(Protocol):
    """What :func:`build` needs of the settings (``cluster.config.CurateSettings`` fits)."""

    @property
    def top(self) -> int: ...
    @property
    def consensus(self) -> list[str]: ...
    @property
    def tie_break(self) -> str: ...


def _rating(ratings: Mapping[str, Mapping[int, int]], name: str, cid: int) -> int | UnsetType:
    """A PunEntry rating field is filled only if a rater of that name exists."""
    return ratings[name][cid] if name in ratings else UNSET


def build(
    candidates: Sequence[Candidate], ratings: Mapping[str, Mapping[int, int]], settings: CurateRules
) -> list[PunEntry]:
    """Stage 2: consensus = sum of the ``consensus`` raters; sort by consensus DESC, ``tie_break``
    rater DESC, sentence length DESC, id ASC; keep ``top``; index 0..N-1, the original id kept.

    Jokes that some rater did not score are left out: their consensus is unknown.
    """
    top, consensus, tie_break = settings.top, settings.consensus, settings.tie_break
    for name in [*consensus, tie_break]:
        if name not in ratings:
            raise ValueError(f"rater {name!r} is not among the raters {sorted(ratings)}")
    rated = [c for c in candidates if all(c.id in r for r in ratings.values())]

    def score(c: Candidate) -> int:
        return sum(ratings[name][c.id] for name in consensus)

    ranked = sorted(rated, key=lambda c: (-score(c), -ratings[tie_break][c.id], -len(c.sentence), c.id))
    out = []
    for index, c in enumerate(ranked[:top]):
        out.append(
            PunEntry(
                index=index,
                id=c.id,
                sentence=c.sentence,
                straight=list(c.straight),
                punny=list(c.punny),
                explanation=c.explanation,
                gemini_rating=_rating(ratings, "gemini", c.id),
                anthropic_rating=_rating(ratings, "anthropic", c.id),
                claudecode_rating=_rating(ratings, "claudecode", c.id),
                consensus_score=score(c),
            )
        )
    return out


class RatingRecord(msgspec.Struct, kw_only=True):
    """One candidate's line of ``ratings.json``: every score it got and which joke was kept."""

    id: int
    repaired: bool
    sentence: str
    original_sentence: str
    first: dict[str, int]
    rerated: dict[str, int] | None
    final: dict[str, int]


def final_ratings(
    candidates: Sequence[Candidate], first: Ratings, repaired: Sequence[Candidate], rerated: Ratings
) -> tuple[list[Candidate], Ratings, list[RatingRecord]]:
    """The jokes and scores Stage 2 sees: a repaired joke replaces the original (with its new
    scores) only if every rater scored it again; otherwise the original and its first scores stand."""
    fixed = {c.id: c for c in repaired}
    jokes: list[Candidate] = []
    final: Ratings = {name: {} for name in first}
    records = []
    for c in candidates:
        again = {name: rerated[name][c.id] for name in first if c.id in rerated.get(name, {})}
        use_repair = c.id in fixed and len(again) == len(first)
        joke = fixed[c.id] if use_repair else c
        scores = again if use_repair else {name: first[name][c.id] for name in first if c.id in first[name]}
        for name, s in scores.items():
            final[name][c.id] = s
        jokes.append(joke)
        records.append(
            RatingRecord(
                id=c.id,
                repaired=use_repair,
                sentence=joke.sentence,
                original_sentence=c.sentence,
                first={name: first[name][c.id] for name in first if c.id in first[name]},
                rerated=again if c.id in fixed else None,
                final=scores,
            )
        )
    return jokes, final, records


def check_ratings(ids: str, response: ProviderResponse) -> None:
    """The rate stage's response validator, ``...:check_ratings:3,5,8``: a JSON array rating exactly jokes 3, 5, 8."""
    parse_ratings(response.texts[0], [int(i) for i in ids.split(",")])


def check_repair(cand_id: str, response: ProviderResponse) -> None:
    """The repair stage's response validator, ``...:check_repair:7``: a repaired joke with exactly one blank."""
    parse_repair(response.texts[0], Candidate(id=int(cand_id), sentence="", straight=[], punny=[]))
