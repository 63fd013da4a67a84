"""MERA's own scoring of a Humor answer (``em_mera``), reproduced exactly, and the readings it scores.

Pinned to MERA-Evaluation/MERA ``benchmark_tasks/humor/utils.py`` at commit
b2dc51c1c129b770e427d1489c9cd6da1c77dee7 with ``lm_eval/api/answer_extraction.py`` of
artemorloff/lm-evaluation-harness at dd423f199a55eaeb7035fc475a9fd7e5cc335471 and SQuAD's
``compute_exact`` (transformers ``squad_metrics``). This is the *merged* reading; an earlier draft
(line 1 after ``ОТВЕТ ``, line 2 after ``РЕШЕНИЕ ``) was never official.

Why reproduce it rather than use our parser: a leaderboard number is only comparable when it is
computed the official way, faults included. What the official reading does, in our words:

* the filter chain only normalises (``None`` -> ``""``, ``lstrip()``); the model's text is kept;
* the text is read several ways (:func:`mera_readings`): the whole stripped response; the part after
  the *last* ``Ответ:`` (case-sensitive, colon included) when present, non-empty and different; and the
  ``<class>,<letter>`` pair rebuilt by :func:`mera_pair` when it is new;
* exact match is the best SQuAD ``compute_exact`` over those readings (lower case, ASCII punctuation
  and a/an/the dropped, whitespace collapsed; so ``"ирония,Б"`` compares as ``"иронияб"``).

:func:`mera_pair` (MERA's ``parse_humor_response``): per ``\\n``-separated line, ``ОТВЕТ`` matched in any
case anywhere (also inside a word), an optional ``:``/``-``/``—``, the rest of the line, stripped of
`` \\t:—-``, cut before any ``РЕШЕНИЕ``, stripped of `` \\t:—-,.`` (a ``\\r`` survives); over the whole
text, ``РЕШЕНИЕ`` in any case followed (across whitespace, newlines included) by one of А/Б/В/Г in any
case, upper-cased. The last of each wins; either alone is enough (the other side is then empty).
Without either, a response shaped ``<anything>,<А-Г>`` (capital letter, an optional final dot) is
taken as it is; otherwise the stripped response.
"""

from __future__ import annotations

import re
import string

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)

#: The marker the generic reading splits on (``answer_extraction.ANSWER_MARKER``).
ANSWER_MARKER = "Ответ:"

_ANSWER_LINE = re.compile(r"ОТВЕТ\s*[:\-—]?\s*(.+)", re.IGNORECASE)
_SOLUTION = re.compile(r"РЕШЕНИЕ\s*[:\-—]?\s*([АБВГ])", re.IGNORECASE)
_SOLUTION_CUT = re.compile(r"РЕШЕНИЕ", re.IGNORECASE)
_PAIR_SHAPE = re.compile(r"^\s*(.+?)\s*,\s*([АБВГ])\s*\.?\s*$", re.DOTALL)


def mera_filtered(text: str | None) -> str:
    """What MERA's filter chain passes on (and writes to the submission): ``""`` or ``text.lstrip()``."""
    return text.lstrip() if text else ""


def generic_readings(text: str, marker: str = ANSWER_MARKER) -> list[str]:
    """The whole stripped response, and the stripped part after the last ``marker`` when it adds one."""
    whole = text.strip()
    if not whole or marker not in whole:
        return [whole]
    after = whole.rsplit(marker, 1)[-1].strip()
    return [whole] if not after or after == whole else [whole, after]


def _answer_value(line: str) -> str:
    """The class side a line gives after ``ОТВЕТ`` (``""`` when it gives none)."""
    m = _ANSWER_LINE.search(line)
    if m is None:
        return ""
    value = _SOLUTION_CUT.split(m.group(1).strip(" \t:—-"))[0]
    return value.strip(" \t:—-,.")


def mera_pair(text: str | None) -> str:
    """The ``<class>,<letter>`` MERA rebuilds from the markers (see the module doc)."""
    if not text or not text.strip():
        return ""
    classes = [v for v in map(_answer_value, text.split("\n")) if v]
    letters = [m.group(1).upper() for m in _SOLUTION.finditer(text)]
    if classes or letters:
        return (classes[-1] if classes else "") + "," + (letters[-1] if letters else "")
    shaped = _PAIR_SHAPE.match(text.strip())
    if shaped:
        return shaped.group(1).strip() + "," + shaped.group(2).upper()
    return text.strip()


def mera_readings(text: str | None) -> list[str]:
    """Every reading of a raw answer MERA scores (metrics take the best), in MERA's order."""
    filtered = mera_filtered(text)
    readings = generic_readings(filtered)
    pair = mera_pair(filtered)
    if pair and pair not in readings:
        readings.append(pair)
    return readings


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
    """MERA's ``exact_match`` of a raw model answer against the reference ``"class,letter"``:
    the best :func:`compute_exact` over :func:`mera_readings` (0 without a reference)."""
    if not reference:
        return 0
    return max(compute_exact(reference, r) for r in mera_readings(text))
