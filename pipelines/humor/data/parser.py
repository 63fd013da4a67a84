"""Robust reading of a model's free-text answer into ``(class, letter)``.

Models rarely follow the two-line format to the letter: they add colons, dashes, markdown bold,
quotes, reasoning before or after, put both parts on one line, write the class in another case or
the letter in Latin. This parser accepts all of that but never guesses and never gives credit to a
hedge: when a part is not recoverable, or the answer names several values for it, that part is
``None`` (and the answer counts as unparsed; a hedge is also flagged ``ambiguous``).

Rules (documented here and in the README because the metrics depend on them):

* Markers: ``ОТВЕТ`` / ``РЕШЕНИЕ`` (and English ``ANSWER`` / ``SOLUTION``) as whole words; ``РЕШЕНИЕА``
  (the letter glued to the marker) reads as ``РЕШЕНИЕ А``. Trusted first: upper-case markers, and
  markers in any case that open their line with a short value ("Ответ: ирония"); only if none of them
  yields a value, any marker at all (prose: "решение основано на том, что ..." after a proper answer is
  ignored). If a marker's line holds nothing after it, the next non-empty line is used unless that line
  starts with a marker itself (so ``ОТВЕТ\nостроумный ответ`` is read).
* The two-line format with a marker missing counts as an answer too: ``ирония`` / ``РЕШЕНИЕ Б``,
  ``ирония РЕШЕНИЕ Б``, ``ОТВЕТ ирония`` / ``Б``, and a line that is just a class followed by a line
  that is just a letter.
* Every answer in the text counts, not just the last: the class is the one class all of them name, the
  letter the one letter all of them name. Several classes or letters in one answer (``РЕШЕНИЕ А, Г``,
  ``А и Г``, ``А Г``, ``Б или В``, ``ирония или каламбур``), or two answers that disagree (``ОТВЕТ игра
  слов / РЕШЕНИЕ А / ОТВЕТ оксюморон``), give None and ``ambiguous``. A value preceded by "не" is not
  named ("оксюморон, а не ирония"); a segment listing all four letters is the format's list echoed back,
  not an answer.
* The class part must name one of the 12 classes: exactly (modulo case, ё/е, quotes, punctuation,
  hyphens), or among other words ("класс «ирония»", "игра слов (омонимия)").
* The letter is А, Б, В or Г in either case. A lower-case а/б/в/г, and a capital А/В, followed by a
  word is a conjunction or preposition ("в тексте Б", "А именно"), not a letter.
* Latin letters: when every letter an answer gives is Latin, they are read by position, as a model
  answering with A/B/C/D means them (A→А, B→Б, C→В, D→Г). Latin look-alikes are read as the Cyrillic
  letter they look like only inside Cyrillic text: a word mixing scripts (``иpония`` with a Latin ``p``)
  is read in Cyrillic, and a Latin ``A``/``B`` beside Cyrillic letters reads as ``А``/``В``.
* Without any marker, an answer shaped like the reference (``ирония, Б``) or the two lines without their
  markers (``ирония`` / ``Б``, also "Это ирония" / "Г.") is accepted.
* Hedges are never credited: a part whose answer holds a disjunction or an alternative (или, иль, либо, или
  же, vs, or, может/может быть, возможно, вероятно, наверное, хотя, впрочем, "также/тоже подходит", ``+`` or
  ``/`` between two words, a ``?``, another letter or class in brackets, another class named in any inflected
  form such as "иронию") is None and ``ambiguous``, even when the alternative is no class at all ("ирония или
  сарказм"); so is a part hedged on a line of its own after the answer ("Хотя, возможно, и В.").
* Nothing after the answer takes it back (issue 33): once the answer has begun (its first trusted marker), a later
  line — or the rest of a marker's line after its first sentence — that names another class (in any form) or
  another letter (a capital А/В before "тоже", "подходит"... counts) leaves that part None and ``ambiguous``,
  with or without a hedge word ("Нет, скорее ирония.", "P.S. В тоже подходит.", "Поправка: эллипсис, Г.",
  "50/50 с В."); a line that doubts or corrects the answer without naming anything ("Хотя не уверен.",
  "Ответ под вопросом.", "Нет — ...", "UPD", "Верно?") leaves both parts None. A value named only to be ruled
  out ("Вариант В не подходит", "эллипсис тут ни при чём", "текст А — это не ирония") is no alternative, and
  reasoning *before* the answer may weigh classes freely.
* Read through: zero-width characters (dropped), no-break and thin spaces (spaces), ``…`` (``...``), a JSON
  object (``{"ОТВЕТ": ..., "РЕШЕНИЕ": ...}``, also ``answer``/``solution``, ``класс``/``буква``; a list value
  is a hedge) and markdown tables (a header row naming the markers, or marker | value rows).

The reading is split by concept: :mod:`punchline.pipelines.humor.data.answer_forms` cleans the input up,
:mod:`punchline.pipelines.humor.data.answer_values` reads a class or a letter from a piece of text,
:mod:`punchline.pipelines.humor.data.hedges` finds hedges and what takes an answer back; this module finds the pieces
and decides.
"""

from __future__ import annotations

import itertools
import re

import msgspec

from punchline.pipelines.humor.data.answer_forms import prepare
from punchline.pipelines.humor.data.answer_values import (
    ANSWER_ANY,
    ANSWER_UPPER,
    CONNECTORS,
    LEAD_CHARS,
    LETTER_GLYPHS,
    SOLUTION_ANY,
    SOLUTION_UPPER,
    STARTS_WITH_MARKER,
    TOKEN,
    classes_named,
    cyrillic_words,
    letter_glyphs,
    normalize_class_text,
    parse_class,
    parse_letter,
    read_letters,
    split_tokens,
)
from punchline.pipelines.humor.data.hedges import class_hedged, hedge_lines, letters_hedged
from punchline.pipelines.humor.data.schema import LETTERS, class_key


class ParsedAnswer(msgspec.Struct, frozen=True):
    cls: str | None
    letter: str | None
    ambiguous: bool = False  # the answer named several classes or letters (so a part is None)

    def as_output(self) -> str | None:
        """``"class,letter"`` in the reference's format, or None unless both parts were read."""
        if self.cls is None or self.letter is None:
            return None
        return f"{self.cls},{self.letter}"


class _Segment(msgspec.Struct, frozen=True):
    text: str  # what follows the marker, up to the end of its line (or the value on the next line)
    start: int  # where the marker is
    line_start: bool  # the marker opens its line (after markdown, quotes, dashes): a label, not prose
    line_end: int  # where the line holding the value ends


def _segments(text: str, marker: re.Pattern[str], stop: re.Pattern[str] | None) -> list[_Segment]:
    """What follows each occurrence of ``marker`` up to the end of its line (or ``stop``)."""
    out: list[_Segment] = []
    for m in marker.finditer(text):
        end = text.find("\n", m.end())
        end = len(text) if end < 0 else end
        line_rest = text[m.end() : end]
        if stop is not None:
            s = stop.search(line_rest)
            if s:
                line_rest = line_rest[: s.start()]
        value_end = end
        if not line_rest.strip(LEAD_CHARS) and end < len(text):
            # The value may sit on the next non-empty line ("ОТВЕТ:\nирония"), unless that is a marker's line.
            offset = end + 1
            for nxt in text[end + 1 :].split("\n"):
                if nxt.strip(LEAD_CHARS):
                    if not STARTS_WITH_MARKER.match(nxt.strip(LEAD_CHARS)):
                        line_rest, value_end = nxt, offset + len(nxt)
                    break
                offset += len(nxt) + 1
        line_begin = text.rfind("\n", 0, m.start()) + 1
        out.append(_Segment(line_rest, m.start(), not text[line_begin : m.start()].strip(LEAD_CHARS), value_end))
    return out


_LABEL_MAX_TOKENS = 6  # "Ответ: игра слов" is a label; "решение основано на том, что ..." is prose


def _tiers(
    text: str, upper: re.Pattern[str], anycase: re.Pattern[str], stop: re.Pattern[str] | None
) -> list[list[_Segment]]:
    """Markers in the order they are trusted: upper-case markers and any-case labels (a marker opening its
    line with a short value after it), then any marker at all (prose included)."""
    first = _segments(text, upper, stop)
    taken = {seg.start for seg in first}
    every = _segments(text, anycase, stop)
    first += [
        seg
        for seg in every
        if seg.start not in taken and seg.line_start and len(TOKEN.findall(seg.text)) <= _LABEL_MAX_TOKENS
    ]
    return [first, every]


def _nonempty_lines(text: str) -> list[tuple[int, str]]:
    """``(offset, line)`` of every line with more than markdown or punctuation on it."""
    out, offset = [], 0
    for line in text.split("\n"):
        if line.strip(LEAD_CHARS):
            out.append((offset, line))
        offset += len(line) + 1
    return out


def _lone_class(line: str) -> set[str]:
    """The class a line consists of ("ирония", "«Не анекдот»", "Это ирония"), not a marker's line."""
    if STARTS_WITH_MARKER.match(line.strip(LEAD_CHARS)):
        return set()
    found = classes_named(line)
    if len(found) != 1:
        return set()
    words = len(normalize_class_text(cyrillic_words(line)).split())
    return found if words <= len(next(iter(found)).split()) + 1 else set()


def _lone_letter(line: str) -> list[str]:
    """The letter a line consists of ("Б", "Г.", "**В**")."""
    tokens = [t.text for t in split_tokens(line)]
    return tokens if len(tokens) == 1 and tokens[0] in LETTER_GLYPHS else []


class _Answers(msgspec.Struct):
    """Classes and letter glyphs named outside the markers' own segments: the two-line format with a
    marker missing (``ирония`` / ``РЕШЕНИЕ Б``, ``ОТВЕТ ирония`` / ``Б``) or with both missing."""

    classes: set[str]
    glyphs: list[str]


def _unmarked_answers(text: str, cls_segments: list[_Segment], letter_segments: list[_Segment]) -> _Answers:
    lines = _nonempty_lines(text)
    found = _Answers(set(), [])
    for (_, line), (_, nxt) in itertools.pairwise(lines):  # a bare pair: "ирония" / "Б"
        classes, glyphs = _lone_class(line), _lone_letter(nxt)
        if classes and glyphs:
            found.classes |= classes
            found.glyphs += glyphs
    for seg in letter_segments:  # "ирония" / "РЕШЕНИЕ Б", or "ирония РЕШЕНИЕ Б" on one line
        line_begin = text.rfind("\n", 0, seg.start) + 1
        before = [line for offset, line in lines if offset < line_begin]
        if not seg.line_start:
            found.classes |= _lone_class(text[line_begin : seg.start])
        elif before:
            found.classes |= _lone_class(before[-1])
    for seg in cls_segments:  # "ОТВЕТ ирония" / "Б"
        after = [line for offset, line in lines if offset > seg.line_end]
        if after and classes_named(seg.text):
            found.glyphs += _lone_letter(after[0])
    return found


class _Part(msgspec.Struct, frozen=True):
    value: str | None
    ambiguous: bool


def _decide(named: set[str]) -> _Part:
    if len(named) == 1:
        return _Part(next(iter(named)), False)
    return _Part(None, len(named) > 1)


def _class_part(tiers: list[list[_Segment]], extra: set[str]) -> tuple[_Part, list[_Segment]]:
    for n, segments in enumerate(tiers):
        named: set[str] = set(extra) if n == 0 else set()
        yielding = []
        hedge = False
        for seg in segments:
            found = classes_named(seg.text)
            if found:
                named |= found
                yielding.append(seg)
                hedge |= class_hedged(seg.text, found)
        if named:
            return (_Part(None, True) if hedge else _decide(named)), yielding
    return _Part(None, False), []


def _letter_part(tiers: list[list[_Segment]], extra: list[str]) -> _Part:
    for n, segments in enumerate(tiers):
        glyphs: list[str] = list(extra) if n == 0 else []
        hedge = False
        for seg in segments:
            seg_glyphs = letter_glyphs(seg.text)
            if len(read_letters(seg_glyphs)) == len(LETTERS):
                continue  # "(А, Б, В, Г)": the format's list echoed back, not an answer
            glyphs += seg_glyphs
            hedge |= bool(seg_glyphs) and letters_hedged(seg.text)
        named = read_letters(glyphs)
        if named:
            return _Part(None, True) if hedge else _decide(named)
    return _Part(None, False)


_BARE = re.compile(r"^\s*(?P<cls>[^,;\n]+?)\s*[,;]\s*(?P<letter>[^\n]+?)\s*$")


def _trailing_letter(segments: list[_Segment], cls: str) -> _Part:
    """``ОТВЕТ ирония, Б`` (both parts on the answer line): the letters after the class."""
    glyphs: list[str] = []
    key = class_key(cls)
    for seg in segments:
        norm = normalize_class_text(cyrillic_words(seg.text))
        if norm.startswith(key):
            rest = norm[len(key) :].split()
            if rest and all(t in LETTER_GLYPHS or t in CONNECTORS for t in rest):
                glyphs += [t for t in rest if t in LETTER_GLYPHS]
    return _decide(read_letters(glyphs))


def _bare(text: str) -> ParsedAnswer | None:
    """``ирония, Б`` or ``ирония\\nБ``: the reference's shape without markers; None if not that shape."""
    shapes = []
    bare = _BARE.match(text.strip())
    if bare:
        shapes.append((bare.group("cls"), bare.group("letter")))
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) == 2:
        shapes.append((lines[0], lines[1]))
    for cls_text, letter_text in shapes:
        classes = classes_named(cls_text)
        tokens = [t.text for t in split_tokens(letter_text)]
        if not classes or not tokens or not all(t in LETTER_GLYPHS or t.lower() in CONNECTORS for t in tokens):
            continue
        cls, letter = _decide(classes), _decide(read_letters(t for t in tokens if t in LETTER_GLYPHS))
        if class_hedged(cls_text, classes):
            cls = _Part(None, True)
        if letters_hedged(letter_text):
            letter = _Part(None, True)
        return ParsedAnswer(cls.value, letter.value, cls.ambiguous or letter.ambiguous)
    return None


def parse_answer(text: str) -> ParsedAnswer:
    """Read ``(class, letter)`` from a raw model answer; unreadable or ambiguous parts are None."""
    text = cyrillic_words(prepare(text))
    cls_tiers = _tiers(text, ANSWER_UPPER, ANSWER_ANY, SOLUTION_ANY)
    letter_tiers = _tiers(text, SOLUTION_UPPER, SOLUTION_ANY, None)
    unmarked = _unmarked_answers(text, cls_tiers[0], letter_tiers[0])
    cls, cls_segments = _class_part(cls_tiers, unmarked.classes)
    letter = _letter_part(letter_tiers, unmarked.glyphs)
    if cls.value is not None and letter.value is None and not letter.ambiguous:
        letter = _trailing_letter(cls_segments, cls.value)
    if (cls.value, letter.value) == (None, None) and not (cls.ambiguous or letter.ambiguous):
        bare = _bare(text)
        if bare is not None:
            return bare
    # the answer begins at its first trusted marker (reasoning before it may weigh classes freely)
    starts = [seg.start for tier in (cls_tiers[0], letter_tiers[0]) for seg in tier] or [
        seg.start for tier in (cls_tiers[-1], letter_tiers[-1]) for seg in tier
    ]
    cls_hedge, letter_hedge = hedge_lines(text, min(starts) if starts else None, cls.value, letter.value)
    if cls_hedge and cls.value is not None:
        cls = _Part(None, True)
    if letter_hedge and letter.value is not None:
        letter = _Part(None, True)
    return ParsedAnswer(cls.value, letter.value, cls.ambiguous or letter.ambiguous)


def parsed_output(text: str) -> str | None:
    """Shorthand: ``parse_answer(text).as_output()``."""
    return parse_answer(text).as_output()


__all__ = [
    "ParsedAnswer",
    "letter_glyphs",
    "normalize_class_text",
    "parse_answer",
    "parse_class",
    "parse_letter",
    "parsed_output",
]
