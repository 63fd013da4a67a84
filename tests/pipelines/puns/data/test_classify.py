"""Stage 4: candidates, batching, the judge request, strict parsing, and the merge golden test."""

from __future__ import annotations

from pathlib import Path

import pytest

from punchline.data.errors import RetryableProviderError
from punchline.data.storage.jsonio import dumps_upstream
from punchline.pipelines.puns.data.classify import (
    MalformedVerdicts,
    batches,
    candidates,
    classify_prompt,
    classify_request,
    merge,
    merge_all,
    parse_verdicts,
)
from punchline.pipelines.puns.data.puns_io import load_classified, load_raw_completions
from punchline.pipelines.puns.data.schemas import RawCompletionEntry


def _as_raw(entry) -> RawCompletionEntry:
    return RawCompletionEntry(
        index=entry.index,
        sentence=entry.sentence,
        prompt=entry.prompt,
        existing_straight=entry.existing_straight,
        existing_punny=entry.existing_punny,
        models=entry.models,
        aggregated=entry.aggregated,
    )


def test_merge_reproduces_classified_completions(shared_puns: Path) -> None:
    src = shared_puns / "classified_completions.json"
    classified = load_classified(src)
    verdicts = {}
    for key, entry in classified.items():
        cands = set(candidates(entry))
        verdicts[key] = {w: c for w, c in entry.classifications.items() if w in cands}
        assert merge(_as_raw(entry), verdicts) == entry, key
    rebuilt = merge_all({k: _as_raw(e) for k, e in classified.items()}, verdicts)
    assert dumps_upstream(rebuilt).encode() == src.read_bytes()


def test_known_words_win_over_verdicts(shared_puns: Path) -> None:
    entry = load_raw_completions(shared_puns / "raw_completions.json")["0"]
    known = "attorney"
    assert known in entry.aggregated.word_counts and known not in candidates(entry)
    merged = merge(entry, {"0": {known: "funny", "nonexistent": "funny"}, "1": {candidates(entry)[0]: "funny"}})
    assert merged.classifications[known] == "straight"
    assert "nonexistent" not in merged.classifications
    assert all(merged.classifications[w] == "other" for w in candidates(entry))


def test_batches_and_request(shared_puns: Path) -> None:
    raw = load_raw_completions(shared_puns / "raw_completions.json")
    groups = batches(raw.values())
    with_unknown = [e for e in raw.values() if candidates(e)]
    assert [len(g) for g in groups[:-1]] == [10] * (len(groups) - 1) and 1 <= len(groups[-1]) <= 10
    assert [i.index for g in groups for i in g] == [e.index for e in with_unknown]
    first = groups[0][0]
    req = classify_request("anthropic", "claude-sonnet-4-20250514", groups[0])
    assert (req.temperature, req.max_tokens, req.n) == (0.0, 4096, 1)
    assert len(req.messages) == 1 and req.messages[0].role == "user"
    text = req.messages[0].content
    assert f"Joke index {first.index}:\n  Sentence: {first.sentence}\n" in text
    assert f"  Candidates: {first.candidates!r}\n" in text
    assert text.endswith("No markdown fences, just the raw JSON.")
    assert req.key() == classify_request("anthropic", "claude-sonnet-4-20250514", groups[0]).key()
    assert req.key() != classify_request("anthropic", "claude-sonnet-4-20250514", groups[1]).key()
    assert classify_prompt(groups[0]).count("Joke index ") == 10


def test_parse_verdicts_plain_and_fenced() -> None:
    want = {"3": {"pun": "funny", "dull": "straight", "the": "other"}}
    body = '{"3": {"pun": "funny", "dull": "straight", "the": "other"}}'
    assert parse_verdicts(body) == want
    assert parse_verdicts(f"```json\n{body}\n```") == want
    assert parse_verdicts(f"  ```\n{body}\n```  \n") == want


@pytest.mark.parametrize(
    "text",
    ["", "not json", '{"3": {"pun": "hilarious"}}', '{"3": ["pun"]}', '```json\n{"3": \n```', "[1, 2]"],
)
def test_parse_verdicts_rejects(text: str) -> None:
    with pytest.raises(MalformedVerdicts) as info:
        parse_verdicts(text)
    assert isinstance(info.value, RetryableProviderError) and info.value.retryable
