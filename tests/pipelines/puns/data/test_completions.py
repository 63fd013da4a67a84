"""Aggregation reproduces upstream's ``aggregated`` block exactly, including key order."""

from __future__ import annotations

from pathlib import Path

from punchline.data.storage.jsonio import dumps_upstream
from punchline.pipelines.puns.data.completions import aggregate, build_raw_entry, truncate_before_blank
from punchline.pipelines.puns.data.puns_io import load_puns, load_raw_completions
from punchline.pipelines.puns.data.schemas import ModelCompletions, PunEntry


def test_aggregate_reproduces_all_205(shared_puns: Path) -> None:
    raw = load_raw_completions(shared_puns / "raw_completions.json")
    assert len(raw) == 205
    for key, entry in raw.items():
        got = aggregate(entry.models)
        assert got == entry.aggregated, key
        assert list(got.word_counts) == list(entry.aggregated.word_counts), key
        assert list(got.greedy_counts) == list(entry.aggregated.greedy_counts), key


def test_ties_keep_first_seen_order_and_empty_greedy_skipped() -> None:
    models = {
        "a": ModelCompletions(greedy="", samples=["pun", "lit", "lit"]),
        "b": ModelCompletions(greedy="lit", samples=["zed", "pun"]),
        "c": ModelCompletions(greedy="pun", samples=[]),
    }
    agg = aggregate(models)
    assert list(agg.word_counts.items()) == [("pun", 2), ("lit", 2), ("zed", 1)]
    assert list(agg.greedy_counts.items()) == [("lit", 1), ("pun", 1)]
    assert agg.total_samples == 5


def test_build_raw_entry_matches_checkpoint(shared_puns: Path) -> None:
    raw = load_raw_completions(shared_puns / "raw_completions.json")
    entry = raw["0"]
    joke = PunEntry(
        index=0, id=1, sentence=entry.sentence, straight=entry.existing_straight, punny=entry.existing_punny
    )
    rebuilt = build_raw_entry(joke, entry.models)
    assert dumps_upstream(rebuilt) == dumps_upstream(entry)
    assert rebuilt.prompt == truncate_before_blank(entry.sentence)


def test_puns_file_loads(shared_puns: Path) -> None:
    assert [p.index for p in load_puns(shared_puns / "puns_205.json")] == list(range(205))
