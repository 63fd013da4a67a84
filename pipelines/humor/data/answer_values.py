"""The values of a Humor answer: the markers, and the one class or option letter a piece of text names.

Why a module of its own: :mod:`punchline.pipelines.humor.data.parser` decides which pieces of a model's answer to read
and how the answer's parts combine; this module reads one piece (the rules for classes, letters and Latin glyphs are in
the parser's module doc), and :mod:`punchline.pipelines.humor.data.hedges` reads the same values to find alternatives.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import msgspec

from punchline.pipelines.humor.data.schema import CLASSES, class_key

_CYRILLIC_LETTERS = {"А": "А", "Б": "Б", "В": "В", "Г": "Г", "а": "А", "б": "Б", "в": "В", "г": "Г"}
_LATIN_BY_POSITION = {"A": "А", "B": "Б", "C": "В", "D": "Г", "a": "А", "b": "Б", "c": "В", "d": "Г"}
_LATIN_LOOKALIKE = {"A": "А", "a": "А", "B": "В"}  # Latin glyphs that look like an option letter
LETTER_GLYPHS = frozenset(_CYRILLIC_LETTERS) | frozenset(_LATIN_BY_POSITION)
# Latin glyphs with a Cyrillic twin, for words typed in mixed scripts ("иpония", "РЕШЕНИE")
_TO_CYRILLIC = str.maketrans("AaBCcEeHKMOoPpTXxy", "АаВСсЕеНКМОоРрТХху")
_WORD = re.compile(r"\w+")
_HAS_CYRILLIC = re.compile(r"[а-яёА-ЯЁ]")
_HAS_LATIN = re.compile(r"[A-Za-z]")

ANSWER_UPPER = re.compile(r"(?<!\w)(?:ОТВЕТ|ANSWER)(?!\w)")
ANSWER_ANY = re.compile(r"(?<!\w)(?:ответ|answer)(?!\w)", re.IGNORECASE)
_GLUED = r"(?:(?!\w)|(?=[АБВГ](?!\w)))"  # "РЕШЕНИЕА": the letter glued to the marker
SOLUTION_UPPER = re.compile(r"(?<!\w)(?:РЕШЕНИЕ|SOLUTION)" + _GLUED)
SOLUTION_ANY = re.compile(r"(?<!\w)(?:решение|solution)" + _GLUED, re.IGNORECASE)
STARTS_WITH_MARKER = re.compile(r"(?:ответ|answer)(?!\w)|(?:решение|solution)" + _GLUED, re.IGNORECASE)

LEAD_CHARS = " \t\r:：-—–=*_#>«»“”„\"'`"
_NON_WORD = re.compile(r"[^\w\s]|_")
_KEYS = {class_key(c).replace("-", " "): c for c in CLASSES}
_KEY_RES = {k: re.compile(r"(?<!\w)" + re.escape(k) + r"(?!\w)") for k in _KEYS}
TOKEN = re.compile(r"\S+")
_SEPARATORS = re.compile(r"([,;/])")  # "А/Б", "А,Г": separators even without a space
CONNECTORS = {"и", "или", "либо", "or", "and", "&", "/"}
_TOKEN_STRIP = ".,;:!?)(]['\"«»“”„*`_/—–-"


def cyrillic_words(text: str) -> str:
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


def classes_named(segment: str) -> set[str]:
    """Every class ``segment`` names, exactly or among other words; one preceded by "не" is not named."""
    norm = normalize_class_text(cyrillic_words(segment))
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
    found = classes_named(segment)
    return next(iter(found)) if len(found) == 1 else None


class _Token(msgspec.Struct, frozen=True):
    text: str  # without surrounding punctuation
    closed: bool  # punctuation follows it ("А," "Б)" "В —"): the next word is not its continuation
    opened: bool = False  # punctuation precedes it ("(там"): it does not continue the word before


def split_tokens(segment: str) -> list[_Token]:
    out: list[_Token] = []
    after_mark = False  # the previous raw token was punctuation only ("—", "(")
    for raw in TOKEN.findall(_SEPARATORS.sub(r" \1 ", segment.strip(LEAD_CHARS))):
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
    if tok.text not in LETTER_GLYPHS:
        return False
    if i > 0 and tokens[i - 1].text.lower() == "не":
        return False  # "а не Б": named only to be ruled out
    nxt = tokens[i + 1] if i + 1 < len(tokens) else _Token("", True, True)
    followed_by_word = (
        not tok.closed
        and not nxt.opened
        and nxt.text[:1].isalpha()
        and nxt.text not in LETTER_GLYPHS
        and nxt.text.lower() not in CONNECTORS
    )
    # Б and Г are never words; а/в (and a capital А/В starting a sentence) are: "в тексте Б", "А именно"
    return not followed_by_word or tok.text in ("Б", "Г", "C", "D")


def letter_glyphs(segment: str) -> list[str]:
    """The option letters ``segment`` names, as written (Cyrillic or Latin glyphs), in order.

    A segment that starts with letters is read up to the first word that is not a letter or a
    connector (``"А и Г"``, ``"Б — потому что в тексте Г..."`` -> ``["Б"]``); otherwise every letter in
    it counts (``"вариант Б"``, ``"в тексте Б"``).
    """
    tokens = split_tokens(segment)
    if tokens and _is_letter(tokens, 0):
        run = []
        for i, tok in enumerate(tokens):
            if _is_letter(tokens, i):
                run.append(tok.text)
            elif tok.text.lower() not in CONNECTORS:
                break
        return run
    return [tok.text for i, tok in enumerate(tokens) if _is_letter(tokens, i)]


def read_letters(glyphs: Iterable[str]) -> set[str]:
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
    found = read_letters(letter_glyphs(segment))
    return next(iter(found)) if len(found) == 1 else None
