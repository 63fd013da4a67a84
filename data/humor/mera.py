"""The official MERA reading of a Humor answer and its exact-match metric, reproduced for comparability.

The reference scorer does *not* parse robustly; it

1. takes the first line and keeps what follows the last ``"ОТВЕТ "`` in it (the whole line when the
   marker is absent: it splits on the marker and keeps the last piece);
2. takes the second line and keeps what follows the last ``"РЕШЕНИЕ "`` in it (same rule);
3. joins them as ``"answer,solution"``; an empty answer gives ``""``;
4. compares with SQuAD's ``compute_exact``.

Decision: an answer with a single line makes the official scorer fail (there is no second line).
We return ``""`` for it, i.e. it counts as wrong, and the robust :mod:`punchline.data.humor.parser` score is
reported beside it so that the difference is visible. Lines are split on ``"\\n"`` only and the text
is not stripped first, exactly as described; whitespace inside the pieces is left to the SQuAD
normalisation (which, note, joins the class and the letter: ``"ирония,Б"`` -> ``"иронияб"``).
"""

from __future__ import annotations

import re
import string

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def mera_extract(text: str) -> str:
    """The ``"answer,solution"`` string the official scorer builds from a raw model answer."""
    if not text:
        return ""
    lines = text.split("\n")
    if len(lines) < 2:
        return ""  # the official scorer raises here; we count the answer as wrong
    answer = lines[0].split("ОТВЕТ ")[-1]
    solution = lines[1].split("РЕШЕНИЕ ")[-1]
    return f"{answer},{solution}"


def squad_normalize(s: str) -> str:
    """SQuAD v2 ``normalize_answer``: lower, drop ASCII punctuation, drop a/an/the, collapse spaces."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCTUATION)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def compute_exact(gold: str, pred: str) -> int:
    """SQuAD's ``compute_exact``: 1 when the normalised strings are equal, else 0."""
    return int(squad_normalize(gold) == squad_normalize(pred))


def em_mera(reference: str, text: str) -> int:
    """Official exact match of a raw model answer against the reference ``"class,letter"``."""
    return compute_exact(reference, mera_extract(text))
