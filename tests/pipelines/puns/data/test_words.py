"""``extract_word`` behaves like upstream's first-word extraction."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from punchline.pipelines.puns.data.words import extract_word


@pytest.mark.parametrize(
    ("text", "word"),
    [
        ("", ""),
        (None, ""),
        ("   ", ""),
        ("Battery.", "battery"),
        ('  "Suit" is the answer', "suit"),
        ("carry-on!", "carry-on"),
        ("...", ""),
        ("123abc456 def", "abc"),
        ("\n\tToast\n", "toast"),
        ("fun-gi", "fun-gi"),
        ("O'Brien's,", "o'brien's"),
    ],
)
def test_examples(text: str | None, word: str) -> None:
    assert extract_word(text) == word


@given(st.text())
def test_result_is_trimmed_lowercase_single_token(text: str) -> None:
    word = extract_word(text)
    assert word == word.lower()
    assert not any(ch.isspace() for ch in word)
    if word:
        assert re.match(r"[a-z]", word) and re.search(r"[a-z]$", word)
        first = text.split()[0].lower()
        assert word in first


@given(st.text())
def test_idempotent(text: str) -> None:
    once = extract_word(text)
    assert extract_word(once) == once


@given(
    st.from_regex(r"[A-Za-z]{1,12}", fullmatch=True), st.from_regex(r"[ \t\n]*[.,!?\"']*", fullmatch=True), st.text()
)
def test_first_word_wins(word: str, punct: str, rest: str) -> None:
    assert extract_word(f"{punct}{word}{punct} {rest}") == word.lower()
