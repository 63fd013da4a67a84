"""Loaders round-trip the upstream files byte for byte and reject bad input with a precise message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from punchline.data.errors import InputError
from punchline.data.storage.jsonio import dumps_upstream
from punchline.pipelines.puns.data import puns_io


@pytest.mark.parametrize(
    ("name", "loader"),
    [
        ("puns_205.json", puns_io.load_puns),
        ("raw_completions.json", puns_io.load_raw_completions),
        ("classified_completions.json", puns_io.load_classified),
    ],
)
def test_round_trip_is_byte_identical(shared_puns: Path, tmp_path: Path, name: str, loader) -> None:
    src = shared_puns / name
    obj = loader(src)
    assert len(obj) == 205
    assert dumps_upstream(obj).encode() == src.read_bytes()
    dumper = {
        "puns_205.json": puns_io.dump_puns,
        "raw_completions.json": puns_io.dump_raw_completions,
        "classified_completions.json": puns_io.dump_classified,
    }[name]
    out = tmp_path / name
    dumper(out, obj)
    assert out.read_bytes() == src.read_bytes()


def _joke(index: int, **over) -> dict:
    joke = {
        "index": index,
        "id": 100 + index,
        "sentence": "The baker kneaded a ___",
        "straight": ["rest"],
        "punny": ["loaf"],
    }
    joke.update(over)
    return joke


def _write(tmp_path: Path, obj, name: str = "puns.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(obj))
    return p


def _error(path: Path, loader=puns_io.load_puns) -> InputError:
    with pytest.raises(InputError) as info:
        loader(path)
    return info.value


def test_sentence_without_blank(tmp_path: Path) -> None:
    p = _write(tmp_path, [_joke(0), _joke(7, sentence="No blank here")])
    err = _error(p)
    assert err.file == str(p) and err.field == "sentence"
    assert "joke index 7 (position 1)" in str(err) and "no blank" in str(err)


def test_sentence_with_two_blanks(tmp_path: Path) -> None:
    err = _error(_write(tmp_path, [_joke(3, sentence="A ___ and a ___")]))
    assert err.field == "sentence" and "2 blanks" in str(err) and "joke index 3" in str(err)


@pytest.mark.parametrize("field", ["straight", "punny"])
def test_empty_word_list(tmp_path: Path, field: str) -> None:
    err = _error(_write(tmp_path, [_joke(0), _joke(1, **{field: []})]))
    assert err.field == field and "joke index 1 (position 1)" in str(err)


def test_duplicate_index(tmp_path: Path) -> None:
    err = _error(_write(tmp_path, [_joke(0), _joke(1), _joke(0)]))
    assert err.field == "index" and "position 2" in str(err) and "also at position 0" in str(err)


def test_unknown_tier_names_field(tmp_path: Path) -> None:
    err = _error(_write(tmp_path, [_joke(0), _joke(1, cloze_tier="hilarious")]))
    assert err.field == "cloze_tier" and err.record == "position 1"
    assert "cloze_tier" in str(err) and str(tmp_path) in str(err)


def test_malformed_json(tmp_path: Path) -> None:
    p = tmp_path / "bad.json"
    p.write_text('[{"index": 0,')
    err = _error(p)
    assert "malformed JSON" in str(err) and err.file == str(p)


def test_missing_file(tmp_path: Path) -> None:
    err = _error(tmp_path / "nope.json")
    assert "not found" in str(err)


def test_cloze_test_naming_unknown_joke(shared_puns: Path, tmp_path: Path) -> None:
    puns = puns_io.load_puns(shared_puns / "puns_205.json")
    test = {
        "pair_id": 0,
        "type": "straight",
        "prompt": "x",
        "expected_completion": ["a"],
        "contrast_completion": ["b"],
        "joke_a_index": 1,
        "joke_b_index": 2,
        "joke_c_index": 999,
        "joke_c_sentence": "A ___",
        "joke_a_tier": "balanced",
        "joke_b_tier": "balanced",
        "joke_c_tier": "straight_dominated",
        "joke_c_balance": 0.0,
    }
    p = _write(tmp_path, [test], "tests.json")
    assert puns_io.load_cloze_tests(p)[0].joke_c_index == 999  # fine without a puns file to check against
    with pytest.raises(InputError) as info:
        puns_io.load_cloze_tests(p, puns, puns_file="puns_205.json")
    assert info.value.field == "joke_c_index" and "999" in str(info.value) and "test 0" in str(info.value)


def test_completions_key_must_match_index(shared_puns: Path, tmp_path: Path) -> None:
    data = json.loads((shared_puns / "raw_completions.json").read_text())
    data["0"]["index"] = 5
    p = _write(tmp_path, data, "raw.json")
    err = _error(p, puns_io.load_raw_completions)
    assert err.field == "index" and "joke index 0" in str(err)


def test_dump_validates_before_writing(tmp_path: Path) -> None:
    from punchline.pipelines.puns.data.schemas import PunEntry

    out = tmp_path / "out.json"
    out.write_text("previous")
    bad = [PunEntry(index=0, id=0, sentence="no blank", straight=["a"], punny=["b"])]
    with pytest.raises(InputError):
        puns_io.dump_puns(out, bad)
    assert out.read_text() == "previous"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]
