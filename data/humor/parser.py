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
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable

import msgspec

from punchline.data.humor.schema import CLASSES, LETTERS, NOT_A_JOKE, class_key

_CYRILLIC_LETTERS = {"А": "А", "Б": "Б", "В": "В", "Г": "Г", "а": "А", "б": "Б", "в": "В", "г": "Г"}
_LATIN_BY_POSITION = {"A": "А", "B": "Б", "C": "В", "D": "Г", "a": "А", "b": "Б", "c": "В", "d": "Г"}
_LATIN_LOOKALIKE = {"A": "А", "a": "А", "B": "В"}  # Latin glyphs that look like an option letter
_LETTER_GLYPHS = frozenset(_CYRILLIC_LETTERS) | frozenset(_LATIN_BY_POSITION)
# Latin glyphs with a Cyrillic twin, for words typed in mixed scripts ("иpония", "РЕШЕНИE")
_TO_CYRILLIC = str.maketrans("AaBCcEeHKMOoPpTXxy", "АаВСсЕеНКМОоРрТХху")
_WORD = re.compile(r"\w+")
_HAS_CYRILLIC = re.compile(r"[а-яёА-ЯЁ]")
_HAS_LATIN = re.compile(r"[A-Za-z]")


class ParsedAnswer(msgspec.Struct, frozen=True):
    cls: str | None
    letter: str | None
    ambiguous: bool = False  # the answer named several classes or letters (so a part is None)

    def as_output(self) -> str | None:
        """``"class,letter"`` in the reference's format, or None unless both parts were read."""
        if self.cls is None or self.letter is None:
            return None
        return f"{self.cls},{self.letter}"


_ANSWER_UPPER = re.compile(r"(?<!\w)(?:ОТВЕТ|ANSWER)(?!\w)")
_ANSWER_ANY = re.compile(r"(?<!\w)(?:ответ|answer)(?!\w)", re.IGNORECASE)
_GLUED = r"(?:(?!\w)|(?=[АБВГ](?!\w)))"  # "РЕШЕНИЕА": the letter glued to the marker
_SOLUTION_UPPER = re.compile(r"(?<!\w)(?:РЕШЕНИЕ|SOLUTION)" + _GLUED)
_SOLUTION_ANY = re.compile(r"(?<!\w)(?:решение|solution)" + _GLUED, re.IGNORECASE)
_STARTS_WITH_MARKER = re.compile(r"(?:ответ|answer)(?!\w)|(?:решение|solution)" + _GLUED, re.IGNORECASE)

_LEAD_CHARS = " \t\r:：-—–=*_#>«»“”„\"'`"
_NON_WORD = re.compile(r"[^\w\s]|_")
_KEYS = {class_key(c).replace("-", " "): c for c in CLASSES}
_KEY_RES = {k: re.compile(r"(?<!\w)" + re.escape(k) + r"(?!\w)") for k in _KEYS}
_TOKEN = re.compile(r"\S+")
_SEPARATORS = re.compile(r"([,;/])")  # "А/Б", "А,Г": separators even without a space
_CONNECTORS = {"и", "или", "либо", "or", "and", "&", "/"}
_TOKEN_STRIP = ".,;:!?)(]['\"«»“”„*`_/—–-"


def _cyrillic_words(text: str) -> str:
    """Latin look-alikes inside words that are otherwise Cyrillic, replaced by their Cyrillic twins."""

    def fix(m: re.Match[str]) -> str:
        word = m.group(0)
        if _HAS_CYRILLIC.search(word) and _HAS_LATIN.search(word):
            return word.translate(_TO_CYRILLIC)
        return word

    return _WORD.sub(fix, text)


def normalize_class_text(text: str) -> str:
    """Lower case, ё -> е, punctuation (quotes, hyphens, markdown) -> spaces, spaces collapsed."""
    return " ".join(_NON_WORD.sub(" ", text.lower().replace("ё", "е")).split())


def _classes_named(segment: str) -> set[str]:
    """Every class ``segment`` names, exactly or among other words; one preceded by "не" is not named."""
    norm = normalize_class_text(_cyrillic_words(segment))
    if not norm:
        return set()
    if norm in _KEYS:
        return {_KEYS[norm]}
    found: set[str] = set()
    for key, rx in _KEY_RES.items():
        for m in rx.finditer(norm):
            negated = norm[: m.start()].endswith("не ") and key != "не анекдот"
            # "не анекдот" contains no other key, but "анекдот" alone is not a class: fine.
            if not negated:
                found.add(_KEYS[key])
    return found


def parse_class(segment: str) -> str | None:
    """The one class named by ``segment`` (see the module rules), else None."""
    found = _classes_named(segment)
    return next(iter(found)) if len(found) == 1 else None


class _Token(msgspec.Struct, frozen=True):
    text: str  # without surrounding punctuation
    closed: bool  # punctuation follows it ("А," "Б)" "В —"): the next word is not its continuation
    opened: bool = False  # punctuation precedes it ("(там"): it does not continue the word before


def _tokens(segment: str) -> list[_Token]:
    out: list[_Token] = []
    after_mark = False  # the previous raw token was punctuation only ("—", "(")
    for raw in _TOKEN.findall(_SEPARATORS.sub(r" \1 ", segment.strip(_LEAD_CHARS))):
        text = raw.strip(_TOKEN_STRIP)
        if not text:  # a dash or a bracket on its own separates the tokens around it
            if out:
                out[-1] = msgspec.structs.replace(out[-1], closed=True)
            after_mark = True
            continue
        out.append(_Token(text, raw.rstrip(_TOKEN_STRIP) != raw, after_mark or raw.lstrip(_TOKEN_STRIP) != raw))
        after_mark = False
    return out


def _is_letter(tokens: list[_Token], i: int) -> bool:
    """Whether ``tokens[i]`` is an option letter rather than a one-letter word."""
    tok = tokens[i]
    if tok.text not in _LETTER_GLYPHS:
        return False
    if i > 0 and tokens[i - 1].text.lower() == "не":
        return False  # "а не Б": named only to be ruled out
    nxt = tokens[i + 1] if i + 1 < len(tokens) else _Token("", True, True)
    followed_by_word = (
        not tok.closed
        and not nxt.opened
        and nxt.text[:1].isalpha()
        and nxt.text not in _LETTER_GLYPHS
        and nxt.text.lower() not in _CONNECTORS
    )
    # Б and Г are never words; а/в (and a capital А/В starting a sentence) are: "в тексте Б", "А именно"
    return not followed_by_word or tok.text in ("Б", "Г", "C", "D")


def letter_glyphs(segment: str) -> list[str]:
    """The option letters ``segment`` names, as written (Cyrillic or Latin glyphs), in order.

    A segment that starts with letters is read up to the first word that is not a letter or a
    connector (``"А и Г"``, ``"Б — потому что в тексте Г..."`` -> ``["Б"]``); otherwise every letter in
    it counts (``"вариант Б"``, ``"в тексте Б"``).
    """
    tokens = _tokens(segment)
    if tokens and _is_letter(tokens, 0):
        run = []
        for i, tok in enumerate(tokens):
            if _is_letter(tokens, i):
                run.append(tok.text)
            elif tok.text.lower() not in _CONNECTORS:
                break
        return run
    return [tok.text for i, tok in enumerate(tokens) if _is_letter(tokens, i)]


def _read_letters(glyphs: Iterable[str]) -> set[str]:
    """Cyrillic option letters from glyphs: Latin by position if every glyph is Latin, else by look."""
    glyphs = list(glyphs)
    if glyphs and all(g in _LATIN_BY_POSITION for g in glyphs):
        return {_LATIN_BY_POSITION[g] for g in glyphs}
    out = set()
    for g in glyphs:
        letter = _CYRILLIC_LETTERS.get(g) or _LATIN_LOOKALIKE.get(g)
        if letter is not None:
            out.add(letter)
    return out


def parse_letter(segment: str) -> str | None:
    """The one option letter named by ``segment`` (see the module rules), else None."""
    found = _read_letters(letter_glyphs(segment))
    return next(iter(found)) if len(found) == 1 else None


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
        if not line_rest.strip(_LEAD_CHARS) and end < len(text):
            # The value may sit on the next non-empty line ("ОТВЕТ:\nирония"), unless that is a marker's line.
            offset = end + 1
            for nxt in text[end + 1 :].split("\n"):
                if nxt.strip(_LEAD_CHARS):
                    if not _STARTS_WITH_MARKER.match(nxt.strip(_LEAD_CHARS)):
                        line_rest, value_end = nxt, offset + len(nxt)
                    break
                offset += len(nxt) + 1
        line_begin = text.rfind("\n", 0, m.start()) + 1
        out.append(_Segment(line_rest, m.start(), not text[line_begin : m.start()].strip(_LEAD_CHARS), value_end))
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
        if seg.start not in taken and seg.line_start and len(_TOKEN.findall(seg.text)) <= _LABEL_MAX_TOKENS
    ]
    return [first, every]


def _nonempty_lines(text: str) -> list[tuple[int, str]]:
    """``(offset, line)`` of every line with more than markdown or punctuation on it."""
    out, offset = [], 0
    for line in text.split("\n"):
        if line.strip(_LEAD_CHARS):
            out.append((offset, line))
        offset += len(line) + 1
    return out


def _lone_class(line: str) -> set[str]:
    """The class a line consists of ("ирония", "«Не анекдот»", "Это ирония"), not a marker's line."""
    if _STARTS_WITH_MARKER.match(line.strip(_LEAD_CHARS)):
        return set()
    found = _classes_named(line)
    if len(found) != 1:
        return set()
    words = len(normalize_class_text(_cyrillic_words(line)).split())
    return found if words <= len(next(iter(found)).split()) + 1 else set()


def _lone_letter(line: str) -> list[str]:
    """The letter a line consists of ("Б", "Г.", "**В**")."""
    tokens = [t.text for t in _tokens(line)]
    return tokens if len(tokens) == 1 and tokens[0] in _LETTER_GLYPHS else []


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
        if after and _classes_named(seg.text):
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
            found = _classes_named(seg.text)
            if found:
                named |= found
                yielding.append(seg)
                hedge |= _class_hedged(seg.text, found)
        if named:
            return (_Part(None, True) if hedge else _decide(named)), yielding
    return _Part(None, False), []


def _letter_part(tiers: list[list[_Segment]], extra: list[str]) -> _Part:
    for n, segments in enumerate(tiers):
        glyphs: list[str] = list(extra) if n == 0 else []
        hedge = False
        for seg in segments:
            seg_glyphs = letter_glyphs(seg.text)
            if len(_read_letters(seg_glyphs)) == len(LETTERS):
                continue  # "(А, Б, В, Г)": the format's list echoed back, not an answer
            glyphs += seg_glyphs
            hedge |= bool(seg_glyphs) and _letters_hedged(seg.text)
        named = _read_letters(glyphs)
        if named:
            return _Part(None, True) if hedge else _decide(named)
    return _Part(None, False)


_BARE = re.compile(r"^\s*(?P<cls>[^,;\n]+?)\s*[,;]\s*(?P<letter>[^\n]+?)\s*$")


def _trailing_letter(segments: list[_Segment], cls: str) -> _Part:
    """``ОТВЕТ ирония, Б`` (both parts on the answer line): the letters after the class."""
    glyphs: list[str] = []
    key = class_key(cls)
    for seg in segments:
        norm = normalize_class_text(_cyrillic_words(seg.text))
        if norm.startswith(key):
            rest = norm[len(key) :].split()
            if rest and all(t in _LETTER_GLYPHS or t in _CONNECTORS for t in rest):
                glyphs += [t for t in rest if t in _LETTER_GLYPHS]
    return _decide(_read_letters(glyphs))


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
        classes = _classes_named(cls_text)
        tokens = [t.text for t in _tokens(letter_text)]
        if not classes or not tokens or not all(t in _LETTER_GLYPHS or t.lower() in _CONNECTORS for t in tokens):
            continue
        cls, letter = _decide(classes), _decide(_read_letters(t for t in tokens if t in _LETTER_GLYPHS))
        if _class_hedged(cls_text, classes):
            cls = _Part(None, True)
        if _letters_hedged(letter_text):
            letter = _Part(None, True)
        return ParsedAnswer(cls.value, letter.value, cls.ambiguous or letter.ambiguous)
    return None


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


def _prepare(text: str) -> str:
    text = text.translate(_INVISIBLE).translate(_SPACES).replace("…", "...")
    return _from_tables(_from_json(text))


# --- hedges ------------------------------------------------------------------------------------------------------

_HEDGE_WORD = re.compile(
    r"(?<!\w)(?:или|иль|либо|vs|versus|or|может|возможно|вероятно|наверное|наверно|хотя|впрочем|пожалуй)(?!\w)",
    re.IGNORECASE,
)
_ALSO_FITS = re.compile(
    r"(?<!\w)(?:также|тоже|ещё|еще)\s+(?:\w+\s+)?(?:подход|подойд|годит|возмож|верн|правильн|вариант)", re.IGNORECASE
)
_JOIN_SIGN = re.compile(r"\w[\s*»\"']*[+/][\s*«\"']*\w")  # "Б + Г", "А/Б", "ирония/каламбур"
_BRACKETED = re.compile(r"[(\[]([^()\[\]]*)[)\]]")


def _stem(word: str) -> str:
    return word if len(word) <= 3 else word[: len(word) - (1 if len(word) <= 5 else 2)]


# every class in any inflected form ("иронию", "игрой слов", "капитаном Очевидность")
_CLASS_STEMS = {
    c: re.compile(r"(?<!\w)" + r"\s+".join(re.escape(_stem(w)) + r"\w*" for w in class_key(c).split()) + r"(?!\w)")
    for c in CLASSES
}


def classes_mentioned(segment: str) -> set[str]:
    """Every class ``segment`` mentions in any inflected form (one preceded by "не" excluded)."""
    norm = normalize_class_text(_cyrillic_words(segment))
    found = set()
    for cls, rx in _CLASS_STEMS.items():
        for m in rx.finditer(norm):
            if cls == NOT_A_JOKE or not norm[: m.start()].endswith("не "):
                found.add(cls)
    return found


def hedged(segment: str) -> bool:
    """Whether an answer's text hedges: a disjunction, "также подходит", ``+``/``/`` between words, a ``?``."""
    return bool(_HEDGE_WORD.search(segment) or _ALSO_FITS.search(segment) or _JOIN_SIGN.search(segment)) or (
        "?" in segment
    )


def _letters_hedged(segment: str) -> bool:
    """A letter part that hedges, or names another letter in brackets beside its own."""
    if hedged(segment):
        return True
    inner = " ".join(_BRACKETED.findall(segment))
    outside = _BRACKETED.sub(" ", segment)
    return bool(inner and _read_letters(letter_glyphs(inner)) and _read_letters(letter_glyphs(outside)))


def _class_hedged(segment: str, named: set[str]) -> bool:
    """A class part that hedges, or mentions (in any form) a class besides the one it names."""
    return hedged(segment) or bool(classes_mentioned(segment) - named)


# --- what follows the answer: retractions, alternatives, doubts --------------------------------------------------

# A line after the answer that takes it back or doubts it, with or without an alternative named on it
_RETRACT = re.compile(
    r"(?<!\w)(?:скорее|точнее|вернее|поправ\w*|исправ\w*|ошиб\w*|передума\w*|переформулир\w*|отставить|upd|"
    r"no wait|wait|actually|correction|instead|второй вариант|запасн\w*|в крайнем случае|не исключ\w*|шанс\w*|"
    r"не уверен\w*|сомневаюсь|сомнева\w*|затрудня\w*|могу ошибаться|не точно|под вопросом|трудно сказать|"
    r"сложно сказать|50\s*/\s*50|\d+\s*%|если не)(?!\w)",
    re.IGNORECASE,
)
_NO = re.compile(r"^[\W_]*(?:нет|no|неа)\s*(?:[,.!:;—–-]|$)", re.IGNORECASE)  # "Нет, скорее В." (not "Нет сомнений")
# a capital А/В before these words is the option named, not a conjunction or preposition ("P.S. В тоже подходит")
_LETTER_BEFORE = re.compile(
    r"(?<![\w.])([АВ])\s+(?=(?:тоже|также|тож|подход\w*|подойд\w*|годит\w*|верн\w*|правильн\w*|возмож\w*|"
    r"вероятн\w*|лучше|ближе|точнее|скорее|может|был\w*|ведь|же)(?!\w))"
)
# named only to be ruled out: "Вариант В не подходит", "эллипсис тут ни при чём", "Г отпадает"
_RULED_OUT_AFTER = re.compile(
    r"^[\s—–:-]*(?:это\s+)?(?:(?:тут|здесь|вообще|явно|точно|уж|совсем)\s+)*(?:не\s|ни\s+при\s+ч|отпада|исключа|"
    r"неверн|неправильн|мимо|лишн)",
    re.IGNORECASE,
)
_SENTENCE_END = re.compile(r"(?<=[.;!?])\s+")


def _afterword_letters(line: str) -> set[str]:
    """Every option letter a line after the answer names, loosely: a capital А/В before "тоже", "подходит"...
    counts too; one named only to be ruled out does not; a list of all four is the format echoed back."""
    glyphs = letter_glyphs(line) + _LETTER_BEFORE.findall(line)
    letters = _read_letters(glyphs)
    for m in re.finditer(r"(?<!\w)([АБВГ])(?!\w)", line):
        if _RULED_OUT_AFTER.match(line[m.end() :]):
            letters.discard(m.group(1))
    return set() if len(letters) == len(LETTERS) else letters


def _afterword_classes(line: str) -> set[str]:
    """Every class a line after the answer mentions, in any form, except those it rules out."""
    found = classes_mentioned(line)
    norm = normalize_class_text(_cyrillic_words(line))
    for cls in list(found):
        m = _CLASS_STEMS[cls].search(norm)
        if m is not None and _RULED_OUT_AFTER.match(norm[m.end() :]):
            found.discard(cls)
    return found


# doubt words that say so wherever they stand; a bare "может" or "или" in an explanation ("слово может означать
# и то, и другое") is no doubt about the answer (an alternative beside it is caught as an alternative)
_DOUBT_WORD = re.compile(
    r"(?<!\w)(?:возможно|вероятно|наверное|наверно|пожалуй|впрочем|либо)(?!\w)|(?:^|[.!?;,]\s*)[\W_]*(?:(?:хотя|а|но|и)[\W_]+)?может(?:\s+быть)?\s*[,.!—–]",
    re.IGNORECASE,
)


def _doubts(line: str) -> bool:
    """A line that takes the answer back or doubts it, whether or not it names another value."""
    return bool(
        _DOUBT_WORD.search(line) or _ALSO_FITS.search(line) or _RETRACT.search(line) or _NO.match(line)
    ) or line.rstrip(" .)*_").endswith("?")


def _afterwords(text: str, first_marker: int | None) -> list[tuple[str, bool]]:
    """The text after the answer began, as ``(text, alternatives count)``: every later line that is not a
    marker's own line (alternatives and doubts count), on a marker's line whatever follows its first sentence
    ("РЕШЕНИЕ А. Нет, В.") likewise, and a marker's line that gives no value for its doubts only ("Ответ под
    вопросом."; a value is checked by its part's own hedge rules)."""
    if first_marker is None:
        return []
    out = []
    begin = text.rfind("\n", 0, first_marker) + 1
    for n, line in enumerate(text[begin:].split("\n")):
        if not line.strip(_LEAD_CHARS):
            continue
        if n == 0 or _STARTS_WITH_MARKER.match(line.strip(_LEAD_CHARS)):
            own = line[first_marker - begin :] if n == 0 else line
            if not classes_mentioned(own) and not _read_letters(letter_glyphs(own)):  # a value is hedge-checked
                out.append((own, False))
            rest = _SENTENCE_END.split(own.strip(), maxsplit=1)
            if len(rest) == 2 and rest[1].strip(_LEAD_CHARS):
                out.append((rest[1], True))
            continue
        out.append((line, True))
    return out


def _hedge_lines(text: str, first_marker: int | None, cls: str | None, letter: str | None) -> tuple[bool, bool]:
    """(class hedged, letter hedged) by what follows the answer: a line naming another class (any form) or
    another letter, with or without a hedge word ("Нет, скорее ирония.", "P.S. В тоже подходит.", "50/50 с
    В."), takes that part back; a line that doubts or corrects ("Хотя не уверен.", "Поправка: ...") both."""
    cls_hedge = letter_hedge = False
    for line, alternatives in _afterwords(text, first_marker):
        doubt = _doubts(line)
        cls_hedge |= doubt or (alternatives and bool(_afterword_classes(line) - {cls}))
        letter_hedge |= doubt or (alternatives and bool(_afterword_letters(line) - {letter}))
    return cls_hedge, letter_hedge


def parse_answer(text: str) -> ParsedAnswer:
    """Read ``(class, letter)`` from a raw model answer; unreadable or ambiguous parts are None."""
    text = _cyrillic_words(_prepare(text))
    cls_tiers = _tiers(text, _ANSWER_UPPER, _ANSWER_ANY, _SOLUTION_ANY)
    letter_tiers = _tiers(text, _SOLUTION_UPPER, _SOLUTION_ANY, None)
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
    cls_hedge, letter_hedge = _hedge_lines(text, min(starts) if starts else None, cls.value, letter.value)
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
