"""Input clean-up before a Humor answer is read: invisible characters, odd spaces, JSON objects, markdown tables.

Why a module of its own: these turn an answer written in another form into the plain marker lines the parser
(:mod:`punchline.pipelines.humor.data.parser`) reads, so the reading rules need not know about any of them.
"""

from __future__ import annotations

import json
import re

# --- input clean-up: invisible characters, JSON objects, markdown tables ---------------------------------------

_INVISIBLE = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff\u00ad"))
_SPACES = str.maketrans({c: " " for c in "\u00a0\u202f\u2007\u2009\u200a\u2002\u2003"})
_CLASS_KEYS = frozenset({"ответ", "answer", "класс", "class"})
_LETTER_KEYS = frozenset({"решение", "solution", "буква", "letter", "вариант", "option", "choice"})


def _marker_of(key: str) -> str | None:
    """``ОТВЕТ`` or ``РЕШЕНИЕ`` for a JSON key or table cell that names one of the two parts."""
    k = key.strip(" *_`:\"'«»").lower()
    if k in _CLASS_KEYS:
        return "ОТВЕТ"
    if k in _LETTER_KEYS:
        return "РЕШЕНИЕ"
    return None


def _from_json(text: str) -> str:
    """A JSON object naming the parts, rewritten as marker lines (a list value becomes a hedge)."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        return text
    try:
        obj = json.loads(text[start : end + 1])
    except ValueError:
        return text
    if not isinstance(obj, dict):
        return text
    lines = []
    for key, value in obj.items():
        marker = _marker_of(str(key))
        if marker is not None:
            shown = " или ".join(map(str, value)) if isinstance(value, list) else str(value)
            lines.append(f"{marker} {shown}")
    if not lines:
        return text
    return text[:start] + "\n" + "\n".join(lines) + "\n" + text[end + 1 :]


_TABLE_ROW = re.compile(r"^\s*\|.*\|\s*$")
_TABLE_RULE = re.compile(r"^[\s|:\-]+$")


def _table_lines(rows: list[list[str]]) -> list[str]:
    """Marker lines from a table: a header naming the parts (values in the rows below), or marker | value rows."""
    header = [_marker_of(c) for c in rows[0]]
    key_value = len(rows) > 1 and all(_marker_of(row[0]) for row in rows[1:])
    if any(header) and len(rows) > 1 and not key_value:
        return [f"{m} {c}" for row in rows[1:] for m, c in zip(header, row, strict=False) if m]
    return [f"{m} {' '.join(row[1:])}" for row in rows if len(row) > 1 and (m := _marker_of(row[0]))]


def _from_tables(text: str) -> str:
    out: list[str] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        if not _TABLE_ROW.match(lines[i]):
            out.append(lines[i])
            i += 1
            continue
        j = i
        while j < len(lines) and _TABLE_ROW.match(lines[j]):
            j += 1
        block = lines[i:j]
        rows = [[c.strip() for c in r.strip().strip("|").split("|")] for r in block if not _TABLE_RULE.match(r)]
        out += (_table_lines(rows) if rows else []) or block
        i = j
    return "\n".join(out)


def prepare(text: str) -> str:
    text = text.translate(_INVISIBLE).translate(_SPACES).replace("…", "...")
    return _from_tables(_from_json(text))
