"""Texts a regex parses into chosen named-group values: how the simulator writes an answer a stage's regex reads.

The regex is walked as Python's own parser reads it (``re._parser``: literals, classes, alternatives, groups,
repeats), writing the least text that matches, with the chosen groups' values in their places; the text is then
parsed by the compiled regex (``search``, as the stage parses) and kept only when every chosen group reads back
its value, so a value the regex cannot give (``"Mercury"`` for ``(?P<answer>[ABCD])``) is refused, never written
wrong. :meth:`RegexText.values` lists a group's values when they are few (``[ABCD]``, ``yes|no``, ``\\d``): the
other answers a wrong draw picks from.
"""

from __future__ import annotations

import importlib
import itertools
import re
from typing import Any

_parser: Any = importlib.import_module("re._parser")  # the stdlib's own regex parser (no public name, no stubs)
_FLAGS = {"i": re.IGNORECASE, "m": re.MULTILINE, "s": re.DOTALL, "x": re.VERBOSE}
MAX_VALUES = 64  # a group with more values than this is taken as free text
_CATEGORY_CHARS = {
    "CATEGORY_DIGIT": "0",
    "CATEGORY_NOT_DIGIT": "a",
    "CATEGORY_WORD": "a",
    "CATEGORY_NOT_WORD": " ",
    "CATEGORY_SPACE": " ",
    "CATEGORY_NOT_SPACE": "a",
}
_NEGATED_TRIES = "axZ0 .-_!"


def flag_bits(flags: str) -> int:
    bits = 0
    for f in flags:
        bits |= _FLAGS[f]
    return bits


def _name(op: Any) -> str:
    return str(getattr(op, "name", op))


class RegexText:
    """One regex (with its ``imsx`` flags), able to write texts it parses and to list a group's few values."""

    def __init__(self, regex: str, flags: str = "") -> None:
        bits = flag_bits(flags)
        self.pattern = re.compile(regex, bits)
        self.tree = _parser.parse(regex, bits)
        self.names = tuple(self.pattern.groupindex)

    def values(self, name: str) -> list[str] | None:
        """Every value group ``name`` can take, when there are at most :data:`MAX_VALUES` (None: free text)."""
        node = self._group(self.tree, self.pattern.groupindex[name])
        found = _finite(node) if node is not None else None
        return sorted(found) if found is not None else None

    def text(self, values: dict[str, str]) -> str | None:
        """A text whose parse gives each of ``values`` (group name -> value), or None when the regex cannot."""
        fixed = {self.pattern.groupindex[n]: v for n, v in values.items()}
        out: list[str] = []
        _write(self.tree, out, fixed, {})
        text = "".join(out)
        return text if self.reads(text, values) else None

    def reads(self, text: str, values: dict[str, str]) -> bool:
        """Whether ``text`` parses (``search``) into each of ``values``."""
        match = self.pattern.search(text)
        return match is not None and all(match.group(n) == v for n, v in values.items())

    def _group(self, items: Any, index: int) -> Any:
        for op, av in items:
            name = _name(op)
            if name == "SUBPATTERN":
                if av[0] == index:
                    return av[3]
                found = self._group(av[3], index)
            elif name == "BRANCH":
                found = next((f for alt in av[1] if (f := self._group(alt, index)) is not None), None)
            elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
                found = self._group(av[2], index)
            elif name == "ATOMIC_GROUP":
                found = self._group(av, index)
            else:
                found = None
            if found is not None:
                return found
        return None


def _class_char(members: Any) -> str:
    """A character of an ``[...]`` class (its first member's; of a negated class, one it leaves out)."""
    if members and _name(members[0][0]) == "NEGATE":
        excluded = re.compile("[^" + "".join(_member_source(m) for m in members[1:]) + "]")
        return next((c for c in _NEGATED_TRIES if excluded.fullmatch(c)), "a")
    op, av = members[0]
    name = _name(op)
    if name == "LITERAL":
        return chr(av)
    if name == "RANGE":
        return chr(av[0])
    return _CATEGORY_CHARS.get(_name(av), "a")


def _member_source(member: Any) -> str:
    op, av = member
    name = _name(op)
    if name == "LITERAL":
        return re.escape(chr(av))
    if name == "RANGE":
        return f"{re.escape(chr(av[0]))}-{re.escape(chr(av[1]))}"
    return {"CATEGORY_DIGIT": r"\d", "CATEGORY_WORD": r"\w", "CATEGORY_SPACE": r"\s"}.get(_name(av), "")


def _spaces(body: Any) -> bool:
    """A repeat of whitespace only (``\\s*``): written once, so ``Answer:\\s*`` reads as ``Answer: ``."""
    items = list(body)
    return len(items) == 1 and _name(items[0][0]) == "IN" and _class_char(items[0][1]) == " "


def _write(items: Any, out: list[str], fixed: dict[int, str], written: dict[int, str]) -> None:
    for op, av in items:
        name = _name(op)
        if name == "LITERAL":
            out.append(chr(av))
        elif name == "NOT_LITERAL":
            out.append("x" if av != ord("x") else "y")
        elif name == "ANY":
            out.append("x")
        elif name == "IN":
            out.append(_class_char(av))
        elif name == "BRANCH":
            # the alternative holding a chosen group, else the first
            alts = av[1]
            chosen = next((a for a in alts if any(_holds(a, g) for g in fixed)), alts[0])
            _write(chosen, out, fixed, written)
        elif name == "SUBPATTERN":
            group, body = av[0], av[3]
            start = len(out)
            if group in fixed:
                out.append(fixed[group])
            else:
                _write(body, out, fixed, written)
            if group is not None:
                written[group] = "".join(out[start:])
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            low, high, body = av
            holds = any(_holds(body, g) for g in fixed)
            count = low if low > 0 else (1 if high >= 1 and (holds or _spaces(body)) else 0)
            for _ in range(count):
                _write(body, out, fixed, written)
        elif name == "GROUPREF":
            out.append(written.get(av, ""))
        elif name == "GROUPREF_EXISTS":
            group, yes, no = av
            _write(yes if group in written else (no or []), out, fixed, written)
        elif name == "ATOMIC_GROUP":
            _write(av, out, fixed, written)
        # AT (anchors), ASSERT and ASSERT_NOT write nothing


def _holds(items: Any, group: int) -> bool:
    for op, av in items:
        name = _name(op)
        if name == "SUBPATTERN" and (av[0] == group or _holds(av[3], group)):
            return True
        if name == "BRANCH" and any(_holds(a, group) for a in av[1]):
            return True
        if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT") and _holds(av[2], group):
            return True
        if name == "ATOMIC_GROUP" and _holds(av, group):
            return True
    return False


def _finite(items: Any) -> set[str] | None:
    """Every text ``items`` matches, when they are at most :data:`MAX_VALUES` (else None)."""
    texts: set[str] = {""}
    for op, av in items:
        options = _finite_one(_name(op), av)
        if options is None:
            return None
        texts = {a + b for a, b in itertools.product(texts, options)}
        if len(texts) > MAX_VALUES:
            return None
    return texts


def _finite_one(name: str, av: Any) -> set[str] | None:
    if name == "LITERAL":
        return {chr(av)}
    if name in ("AT", "ASSERT", "ASSERT_NOT"):
        return {""}
    if name == "IN":
        return _class_values(av)
    if name == "BRANCH":
        out: set[str] = set()
        for alt in av[1]:
            found = _finite(alt)
            if found is None:
                return None
            out |= found
        return out if len(out) <= MAX_VALUES else None
    if name == "SUBPATTERN":
        return _finite(av[3])
    if name == "ATOMIC_GROUP":
        return _finite(av)
    if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
        low, high, body = av
        one = _finite(body)
        if one is None or high - low > 4:
            return None
        out = set()
        for count in range(low, high + 1):
            out |= {"".join(p) for p in itertools.product(sorted(one), repeat=count)}
            if len(out) > MAX_VALUES:
                return None
        return out
    return None


def _class_values(members: Any) -> set[str] | None:
    out: set[str] = set()
    for op, av in members:
        name = _name(op)
        if name == "LITERAL":
            out.add(chr(av))
        elif name == "RANGE" and av[1] - av[0] < MAX_VALUES:
            out |= {chr(c) for c in range(av[0], av[1] + 1)}
        elif name == "CATEGORY" and _name(av) == "CATEGORY_DIGIT":
            out |= set("0123456789")
        else:
            return None
    return out if len(out) <= MAX_VALUES else None
