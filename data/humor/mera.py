"""The official MERA reading of a Humor answer and its exact-match metric, reproduced exactly.

The reference scorer (``benchmark_tasks/humor/utils.py`` in MERA-Evaluation/MERA, the
``remove_whitespace_and_nones`` filter, then ``squad_metrics.compute_exact`` against the gold) does
*not* parse robustly. Its filter, line for line::

    if not resp:
        resp = ""
    else:
        resp = resp.split('\\n')
        answer = resp[0].lstrip().split('ОТВЕТ ')[-1].strip()
        solution = resp[1].lstrip().split('РЕШЕНИЕ ')[-1].strip()
        resp = answer + "," + solution

so it splits on ``"\\n"`` only, keeps what follows the *last* marker-with-a-space of the first and
the second line (the whole line when the marker is absent), and strips Python whitespace around both
pieces (a trailing space, a tab, the ``"\\r"`` of a CRLF line end, two spaces after ``РЕШЕНИЕ``).

Decision: an answer with a single line makes the official filter raise ``IndexError`` (there is no
``resp[1]``). :func:`mera_extract` returns None for it and :func:`em_mera` scores it 0, i.e. wrong; the
robust :mod:`punchline.data.humor.parser` score is reported beside it so that the difference is
visible. SQuAD's normalisation (lower case, ASCII punctuation dropped, a/an/the dropped, whitespace
collapsed) then joins the class and the letter: ``"ирония,Б"`` -> ``"иронияб"``.
"""

from __future__ import annotations

import re
import string

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def mera_extract(text: str | None) -> str | None:
    """The ``"answer,solution"`` string the official filter builds; None where the filter would raise."""
    if not text:
        return ""  # official: `if not resp: resp = ""`
    lines = text.split("\n")  # official: `resp = resp.split('\n')`
    if len(lines) < 2:
        return None  # official: `resp[1]` raises IndexError on a one-line answer
    answer = lines[0].lstrip().split("ОТВЕТ ")[-1].strip()  # official: resp[0].lstrip().split('ОТВЕТ ')[-1].strip()
    solution = lines[1].lstrip().split("РЕШЕНИЕ ")[-1].strip()  # official: same with 'РЕШЕНИЕ '
    return answer + "," + solution  # official: `resp = answer + "," + solution`


def squad_normalize(s: str) -> str:
    """SQuAD v2 ``normalize_answer``: lower, drop ASCII punctuation, drop a/an/the, collapse spaces."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCTUATION)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def compute_exact(gold: str, pred: str) -> int:
    """SQuAD's ``compute_exact``: 1 when the normalised strings are equal, else 0."""
    return int(squad_normalize(gold) == squad_normalize(pred))


def em_mera(reference: str, text: str | None) -> int:
    """Official exact match of a raw model answer against the reference ``"class,letter"``
    (0 where the official filter would crash)."""
    extracted = mera_extract(text)
    if extracted is None:
        return 0
    return compute_exact(reference, extracted)
