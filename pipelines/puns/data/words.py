"""First-word extraction, identical to upstream's so that words from our runs and the published
checkpoints count as the same word."""

from __future__ import annotations

import re

_EDGE_NON_LETTERS = re.compile(r"^[^a-zA-Z]+|[^a-zA-Z]+$")


def extract_word(text: str | None) -> str:
    """The first whitespace-separated token, trimmed of non-ASCII-letter edges, lowercased ("" if none)."""
    if not text:
        return ""
    tokens = text.strip().split()
    if not tokens:
        return ""
    return _EDGE_NON_LETTERS.sub("", tokens[0]).lower()
