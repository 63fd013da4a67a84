"""Robust reading of a model's free-text answer into ``(class, letter)``.

Models rarely follow the two-line format to the letter: they add colons, dashes, markdown bold,
quotes, reasoning before or after, put both parts on one line, write the class in another case or
the letter as a Latin look-alike. This parser accepts all of that but never guesses: when the class
or the letter is not recoverable, that part is ``None`` (and the answer counts as unparsed).

Rules (documented here because the metrics depend on them):

* Markers ``ОТВЕТ`` / ``РЕШЕНИЕ`` are found as whole words. Upper-case markers are tried first, then
  markers in any case; within a tier the *last* marker that yields a value wins (models reason first
  and answer last; a prose "ответ" inside the class name "остроумный ответ" yields nothing and is
  skipped). If a marker's line holds nothing after it, the next non-empty line is used.
* The class part must name one of the 12 classes: exactly (modulo case, ё/е, quotes, punctuation,
  hyphens), or as the only class mentioned ("класс «ирония»", "игра слов (омонимия)"); a class
  preceded by "не " does not count as mentioned ("оксюморон, а не ирония").
* The letter is А, Б, В or Г in either case; Latin ``A``/``a`` reads as А and Latin ``B`` as В
  (look-alikes). Latin ``C``/``D`` are *not* read as В/Г: that would be positional guessing. A lower
  case first word is a letter only if no word follows it ("в тексте Б" is a preposition, then Б);
  alternatives ("Б или В") read as None.
* Without markers, an answer shaped like the reference (``ирония, Б``) or the two lines without their
  markers (``ирония`` / ``Б``) is accepted.
"""

from __future__ import annotations

import re

import msgspec

from punchline.data.humor.schema import CLASSES, class_key

_LETTER_MAP = {
    "А": "А",
    "Б": "Б",
    "В": "В",
    "Г": "Г",
    "а": "А",
    "б": "Б",
    "в": "В",
    "г": "Г",
    "A": "А",  # Latin look-alikes
    "a": "А",
    "B": "В",
}


class ParsedAnswer(msgspec.Struct, frozen=True):
    cls: str | None
    letter: str | None

    def as_output(self) -> str | None:
        """``"class,letter"`` in the reference's format, or None unless both parts were read."""
        if self.cls is None or self.letter is None:
            return None
        return f"{self.cls},{self.letter}"


_ANSWER_UPPER = re.compile(r"(?<!\w)ОТВЕТ(?!\w)")
_ANSWER_ANY = re.compile(r"(?<!\w)ответ(?!\w)", re.IGNORECASE)
_SOLUTION_UPPER = re.compile(r"(?<!\w)РЕШЕНИЕ(?!\w)")
_SOLUTION_ANY = re.compile(r"(?<!\w)решение(?!\w)", re.IGNORECASE)

_LEAD_CHARS = " \t\r:：-—–=*_#>«»“”„\"'`"
_NON_WORD = re.compile(r"[^\w\s]|_")
_KEYS = {class_key(c).replace("-", " "): c for c in CLASSES}
_KEY_RES = {k: re.compile(r"(?<!\w)" + re.escape(k) + r"(?!\w)") for k in _KEYS}
_NAMED_LETTER = re.compile(
    r"(?:вариант|текст|буква|ответ|опци|пункт|номер)\w*\s*[«\"'(]?\s*([АБВГабвгAaB])(?!\w)", re.IGNORECASE
)
_UPPER_LETTER = re.compile(r"(?<!\w)([АБВГAB])(?!\w)")
_TOKEN = re.compile(r"\S+")
_ALTERNATIVES = {"или", "либо", "/", "or"}
_TOKEN_STRIP = ".,;:!?)(]['\"«»“”„*`_"


def normalize_class_text(text: str) -> str:
    """Lower case, ё -> е, punctuation (quotes, hyphens, markdown) -> spaces, spaces collapsed."""
    return " ".join(_NON_WORD.sub(" ", text.lower().replace("ё", "е")).split())


def parse_class(segment: str) -> str | None:
    """The canonical class named by ``segment`` (see the module rules), else None."""
    norm = normalize_class_text(segment)
    if not norm:
        return None
    if norm in _KEYS:
        return _KEYS[norm]
    found: set[str] = set()
    for key, rx in _KEY_RES.items():
        for m in rx.finditer(norm):
            negated = norm[: m.start()].endswith("не ") and key != "не анекдот"
            # "не анекдот" contains no other key, but "анекдот" alone is not a class: fine.
            if not negated:
                found.add(_KEYS[key])
    return found.pop() if len(found) == 1 else None


def parse_letter(segment: str) -> str | None:
    """The option letter named by ``segment`` (see the module rules), else None."""
    seg = segment.strip(_LEAD_CHARS)
    tokens = [t.strip(_TOKEN_STRIP) for t in _TOKEN.findall(seg)]
    tokens = [t for t in tokens if t]
    if tokens and len(tokens[0]) == 1 and tokens[0] in _LETTER_MAP:
        first = tokens[0]
        if len(tokens) > 1 and tokens[1].lower() in _ALTERNATIVES:
            return None
        follows_word = len(tokens) > 1 and tokens[1][0].isalpha()
        if first.isupper() or not follows_word:
            return _LETTER_MAP[first]
    m = _NAMED_LETTER.search(seg)
    if m and m.group(1) in _LETTER_MAP:
        return _LETTER_MAP[m.group(1)]
    found = {_LETTER_MAP[x] for x in _UPPER_LETTER.findall(seg)}
    return found.pop() if len(found) == 1 else None


def _segments(text: str, marker: re.Pattern[str], stop: re.Pattern[str] | None) -> list[str]:
    """What follows each occurrence of ``marker`` up to the end of its line (or ``stop``), last first."""
    out: list[str] = []
    for m in reversed(list(marker.finditer(text))):
        end = text.find("\n", m.end())
        end = len(text) if end < 0 else end
        line_rest = text[m.end() : end]
        if stop is not None:
            s = stop.search(line_rest)
            if s:
                line_rest = line_rest[: s.start()]
        if not line_rest.strip(_LEAD_CHARS) and end < len(text):
            # The value may sit on the next non-empty line ("ОТВЕТ:\nирония").
            for nxt in text[end + 1 :].split("\n"):
                if nxt.strip(_LEAD_CHARS):
                    if not (_ANSWER_ANY.search(nxt) or _SOLUTION_ANY.search(nxt)):
                        line_rest = nxt
                    break
        out.append(line_rest)
    return out


def _first_class(text: str) -> tuple[str | None, str]:
    for marker in (_ANSWER_UPPER, _ANSWER_ANY):
        for seg in _segments(text, marker, _SOLUTION_ANY):
            cls = parse_class(seg)
            if cls is not None:
                return cls, seg
    return None, ""


def _first_letter(text: str) -> str | None:
    for marker in (_SOLUTION_UPPER, _SOLUTION_ANY):
        for seg in _segments(text, marker, None):
            letter = parse_letter(seg)
            if letter is not None:
                return letter
    return None


_BARE = re.compile(r"^\s*(?P<cls>[^,;\n]+?)\s*[,;]\s*(?P<letter>\S+)\s*$")


def _trailing_letter(segment: str, cls: str) -> str | None:
    """``ОТВЕТ ирония, Б`` (both parts on the answer line): the single letter after the class."""
    norm = normalize_class_text(segment)
    key = class_key(cls)
    if not norm.startswith(key):
        return None
    rest = norm[len(key) :].split()
    if len(rest) == 1 and rest[0] in _LETTER_MAP:
        return _LETTER_MAP[rest[0]]
    return None


def parse_answer(text: str) -> ParsedAnswer:
    """Read ``(class, letter)`` from a raw model answer; unreadable parts are None."""
    cls, seg = _first_class(text)
    letter = _first_letter(text)
    if cls is not None and letter is None:
        letter = _trailing_letter(seg, cls)
    if cls is None and letter is None:
        bare = _BARE.match(text.strip())
        if bare:
            c = parse_class(bare.group("cls"))
            token = bare.group("letter").strip(_TOKEN_STRIP)
            if c is not None and token in _LETTER_MAP:
                return ParsedAnswer(c, _LETTER_MAP[token])
        lines = [line for line in text.splitlines() if line.strip()]
        if len(lines) == 2:  # "ирония\nБ": the two-line format without its markers
            c = parse_class(lines[0])
            token = lines[1].strip().strip(_TOKEN_STRIP)
            if c is not None and token in _LETTER_MAP:
                return ParsedAnswer(c, _LETTER_MAP[token])
    return ParsedAnswer(cls, letter)


def parsed_output(text: str) -> str | None:
    """Shorthand: ``parse_answer(text).as_output()``."""
    return parse_answer(text).as_output()


__all__ = ["ParsedAnswer", "normalize_class_text", "parse_answer", "parse_class", "parse_letter", "parsed_output"]
