"""Puns stages 1-2 as pure functions: strict parsing of rating and repair replies, and Stage 2's order."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from punchline.data.errors import InputError, RetryableProviderError
from punchline.data.requests import ProviderResponse
from punchline.pipelines.curate.curation import (
    Candidate,
    MalformedRatings,
    MalformedRepair,
    batches,
    build,
    final_ratings,
    load_candidates,
    needs_repair,
    parse_ratings,
    parse_repair,
    rating_request,
    repair_request,
)
from punchline.pipelines.puns.data.puns_io import validate_puns
from punchline.workers.calls.validators import validator
from tests.fixtures.simulated import ask

SAMPLE = Path(__file__).resolve().parents[3] / "data" / "samples" / "candidate_jokes.json"


class Rules:
    def __init__(self, top: int = 10, consensus: tuple[str, ...] = ("gemini", "claudecode"), tie: str = "anthropic"):
        self.top = top
        self.consensus = list(consensus)
        self.tie_break = tie


def cand(cid: int, sentence: str = "A joke about a ___") -> Candidate:
    return Candidate(id=cid, sentence=sentence, straight=["thing"], punny=["pun"], explanation="e")


# --- Stage 2 ------------------------------------------------------------------------------------


def test_build_sorts_by_consensus_then_tie_break_then_length_then_id() -> None:
    jokes = [
        cand(1, "short ___"),  # consensus 8+7 = 15, anthropic 5
        cand(2, "a much longer joke ___"),  # consensus 15, anthropic 5, longer than 1 -> before 1
        cand(3, "x ___"),  # consensus 15, anthropic 9 -> first of the 15s
        cand(4, "top ___"),  # consensus 10+9 = 19 -> first overall
        cand(5, "y ___"),  # same as 6 in every key but id -> 5 before 6
        cand(6, "z ___"),
        cand(7, "low ___"),  # consensus 3 -> cut by top=5
    ]
    ratings = {
        "gemini": {1: 8, 2: 7, 3: 10, 4: 10, 5: 6, 6: 6, 7: 1},
        "anthropic": {1: 5, 2: 5, 3: 9, 4: 0, 5: 2, 6: 2, 7: 10},
        "claudecode": {1: 7, 2: 8, 3: 5, 4: 9, 5: 6, 6: 6, 7: 2},
    }
    out = build(jokes, ratings, Rules(top=5))
    assert [p.id for p in out] == [4, 3, 2, 1, 5]
    assert [p.index for p in out] == [0, 1, 2, 3, 4]
    assert [p.consensus_score for p in out] == [19, 15, 15, 15, 12]
    first = out[0]
    assert (first.gemini_rating, first.anthropic_rating, first.claudecode_rating) == (10, 0, 9)
    validate_puns(out)
    # the output has the Stage 2 fields in schema order, nothing more
    keys = list(msgspec.to_builtins(first))
    assert keys == [
        "index",
        "id",
        "sentence",
        "straight",
        "punny",
        "explanation",
        "gemini_rating",
        "anthropic_rating",
        "claudecode_rating",
        "consensus_score",
    ]


def test_build_other_consensus_and_unrated_jokes() -> None:
    jokes = [cand(1), cand(2), cand(3)]
    ratings = {"gemini": {1: 3, 2: 9, 3: 10}, "anthropic": {1: 8, 2: 1}}  # 3 lacks an anthropic score
    out = build(jokes, ratings, Rules(consensus=("anthropic",), tie="gemini"))
    assert [(p.id, p.consensus_score) for p in out] == [(1, 8), (2, 1)]
    assert out[0].claudecode_rating is msgspec.UNSET
    with pytest.raises(ValueError, match="claudecode"):
        build(jokes, ratings, Rules())


def test_final_ratings_use_new_scores_only_for_fully_rerated_repairs() -> None:
    jokes = [cand(1), cand(2), cand(3)]
    first = {"a": {1: 3, 2: 4, 3: 9}, "b": {1: 5, 2: 6, 3: 9}}
    fixed = [cand(1, "better joke ___"), cand(2, "also better ___")]
    rerated = {"a": {1: 8, 2: 9}, "b": {1: 7}}  # rater b failed on joke 2: the original stands
    final_jokes, final, records = final_ratings(jokes, first, fixed, rerated)
    assert [j.sentence for j in final_jokes] == ["better joke ___", "A joke about a ___", "A joke about a ___"]
    assert final == {"a": {1: 8, 2: 4, 3: 9}, "b": {1: 7, 2: 6, 3: 9}}
    assert [r.repaired for r in records] == [True, False, False]
    assert records[1].rerated == {"a": 9} and records[2].rerated is None
    assert records[0].original_sentence == "A joke about a ___"


def test_needs_repair_uses_the_mean_below_the_threshold() -> None:
    jokes = [cand(1), cand(2), cand(3)]
    ratings = {"a": {1: 7, 2: 6}, "b": {1: 7, 2: 7}}  # means 7.0 (kept), 6.5 (repaired); 3 unrated
    assert [c.id for c in needs_repair(jokes, ratings, 7.0)] == [2]


# --- rating replies -----------------------------------------------------------------------------


def test_parse_ratings_accepts_fences_and_keeps_the_asked_order() -> None:
    text = '```json\n[{"id": 9, "rating": 10}, {"id": 4, "rating": 0}]\n```'
    assert list(parse_ratings(text, [4, 9]).items()) == [(4, 0), (9, 10)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[{"id": 4, "rating": 5}]', "misses ids \\[9\\]"),
        ('[{"id": 4, "rating": 5}, {"id": 4, "rating": 6}, {"id": 9, "rating": 1}]', "twice"),
        ('[{"id": 4, "rating": 5}, {"id": 9, "rating": 11}]', "outside"),
        ('[{"id": 4, "rating": -1}, {"id": 9, "rating": 1}]', "outside"),
        ('[{"id": 4, "rating": 5}, {"id": 9, "rating": 7.5}]', "not a JSON array"),
        ('[{"id": 4, "rating": 5}, {"id": 9, "rating": "7"}]', "not a JSON array"),
        ('[{"id": 4, "rating": 5}, {"id": 7, "rating": 7}]', "not asked about"),
        ('{"4": 5, "9": 7}', "not a JSON array"),
        ("I would rate these highly!", "not a JSON array"),
        ('[{"id": 4, "rating": 5, "why": "x"}, {"id": 9, "rating": 1}]', "not a JSON array"),
    ],
)
def test_parse_ratings_rejects_anything_else(text: str, message: str) -> None:
    with pytest.raises(MalformedRatings, match=message) as info:
        parse_ratings(text, [4, 9])
    assert isinstance(info.value, RetryableProviderError)


def test_rating_request_is_deterministic_and_lists_every_joke() -> None:
    batch = [cand(11, "one ___"), cand(12, "two ___")]
    req = rating_request("p", "m", batch)
    assert req.temperature == 0 and req == rating_request("p", "m", batch)
    prompt = req.messages[-1].content
    assert "Joke id 11: one ___" in prompt and "Joke id 12: two ___" in prompt and "0-10" in prompt
    assert req.key() != rating_request("p", "m2", batch).key()


# --- repair replies -----------------------------------------------------------------------------


def test_parse_repair_keeps_the_id_and_one_blank() -> None:
    body = {"sentence": " Better: a joke about a ___ ", "straight": ["thing"], "punny": ["pun"], "explanation": "x"}
    out = parse_repair("```\n" + json.dumps(body) + "\n```", cand(7))
    assert out.id == 7 and out.sentence == "Better: a joke about a ___"


@pytest.mark.parametrize(
    "body",
    [
        {"sentence": "no blank here", "straight": ["a"], "punny": ["b"], "explanation": ""},
        {"sentence": "two ___ and ___", "straight": ["a"], "punny": ["b"], "explanation": ""},
        {"sentence": "one ___", "straight": [], "punny": ["b"], "explanation": ""},
        {"sentence": "one ___", "straight": ["a"], "punny": [" "], "explanation": ""},
        {"sentence": "one ___", "straight": ["a"], "punny": ["b"]},
        {"sentence": "one ___", "straight": ["a"], "punny": ["b"], "explanation": "", "id": 7},
        ["not", "an", "object"],
    ],
)
def test_parse_repair_rejects_unusable_jokes(body: object) -> None:
    with pytest.raises(MalformedRepair):
        parse_repair(json.dumps(body), cand(7))


# --- validators and the simulated provider --------------------------------------------------------


def _fake(request_text: str, key: str, noise: float) -> str:
    return ask(request_text, key=key, noise_rate=noise)


def test_simulated_provider_answers_pass_the_validators() -> None:
    cands = load_candidates(SAMPLE)
    fenced = 0
    scores: set[int] = set()
    for i, batch in enumerate(batches(cands, 7)):
        text = _fake(rating_request("p", "m", batch).messages[-1].content, f"k{i}", noise=0.5)
        fenced += text.startswith("```")
        check = validator("punchline.pipelines.curate.curation:check_ratings:" + ",".join(str(c.id) for c in batch))
        check(ProviderResponse(texts=[text]))
        scores |= set(parse_ratings(text, [c.id for c in batch]).values())
        with pytest.raises(RetryableProviderError):  # the validator names the ids: another batch fails
            validator("punchline.pipelines.curate.curation:check_ratings:1,2")(ProviderResponse(texts=[text]))
    assert fenced > 0 and min(scores) >= 3 and max(scores) <= 10 and len(scores) >= 5
    for c in cands[:5]:
        text = _fake(repair_request("p", "m", c).messages[-1].content, f"r{c.id}", noise=0.5)
        validator(f"punchline.pipelines.curate.curation:check_repair:{c.id}")(ProviderResponse(texts=[text]))
        fixed = parse_repair(text, c)
        assert fixed.id == c.id and fixed.sentence != c.sentence and fixed.sentence.endswith("___")
    with pytest.raises(RetryableProviderError):
        validator("punchline.pipelines.curate.curation:check_repair:1")(ProviderResponse(texts=["no json"]))


# --- loading ----------------------------------------------------------------------------------


def test_sample_candidates_load() -> None:
    cands = load_candidates(SAMPLE)
    assert len(cands) >= 30 and len({c.id for c in cands}) == len(cands)
    assert all(c.sentence.endswith("___") for c in cands)


@pytest.mark.parametrize(
    ("records", "record", "field"),
    [
        (
            [{"id": 1, "sentence": "no blank", "straight": ["a"], "punny": ["b"]}],
            "candidate id 1 (position 0)",
            "sentence",
        ),
        ([{"id": 1, "sentence": "x ___", "straight": [], "punny": ["b"]}], "candidate id 1 (position 0)", "straight"),
        (
            [{"id": 1, "sentence": "x ___", "straight": ["a"], "punny": ["b"]}] * 2,
            "candidate id 1 (position 1)",
            "id",
        ),
        ([{"id": "1", "sentence": "x ___", "straight": ["a"], "punny": ["b"]}], "position 0", "id"),
        ([{"id": 1, "sentence": "x ___", "straight": ["a"], "punny": ["b"], "rating": 3}], "position 0", None),
    ],
)
def test_bad_candidates_name_file_record_and_field(
    tmp_path: Path, records: list[dict[str, object]], record: str, field: str | None
) -> None:
    path = tmp_path / "cands.json"
    path.write_text(json.dumps(records))
    with pytest.raises(InputError) as info:
        load_candidates(path)
    assert info.value.file == str(path) and info.value.record == record
    if field is not None:
        assert info.value.field == field
