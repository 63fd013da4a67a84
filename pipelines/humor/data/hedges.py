"""Hedges in a Humor answer, and what follows the answer: retractions, alternatives, doubts.

Why a module of its own: never crediting a hedge (see the rules in :mod:`punchline.pipelines.humor.data.parser`) takes
its own vocabulary of doubt and correction words; the parser asks this module whether a part it read is hedged
or taken back, and keeps the part only if not.
"""

from __future__ import annotations

import re

from punchline.pipelines.humor.data.answer_values import (
    LEAD_CHARS,
    STARTS_WITH_MARKER,
    cyrillic_words,
    letter_glyphs,
    normalize_class_text,
    read_letters,
)
from punchline.pipelines.humor.data.schema import CLASSES, LETTERS, NOT_A_JOKE, class_key

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
    norm = normalize_class_text(cyrillic_words(segment))
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


def letters_hedged(segment: str) -> bool:
    """A letter part that hedges, or names another letter in brackets beside its own."""
    if hedged(segment):
        return True
    inner = " ".join(_BRACKETED.findall(segment))
    outside = _BRACKETED.sub(" ", segment)
    return bool(inner and read_letters(letter_glyphs(inner)) and read_letters(letter_glyphs(outside)))


def class_hedged(segment: str, named: set[str]) -> bool:
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
    letters = read_letters(glyphs)
    for m in re.finditer(r"(?<!\w)([АБВГ])(?!\w)", line):
        if _RULED_OUT_AFTER.match(line[m.end() :]):
            letters.discard(m.group(1))
    return set() if len(letters) == len(LETTERS) else letters


def _afterword_classes(line: str) -> set[str]:
    """Every class a line after the answer mentions, in any form, except those it rules out."""
    found = classes_mentioned(line)
    norm = normalize_class_text(cyrillic_words(line))
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
        if not line.strip(LEAD_CHARS):
            continue
        if n == 0 or STARTS_WITH_MARKER.match(line.strip(LEAD_CHARS)):
            own = line[first_marker - begin :] if n == 0 else line
            if not classes_mentioned(own) and not read_letters(letter_glyphs(own)):  # a value is hedge-checked
                out.append((own, False))
            rest = _SENTENCE_END.split(own.strip(), maxsplit=1)
            if len(rest) == 2 and rest[1].strip(LEAD_CHARS):
                out.append((rest[1], True))
            continue
        out.append((line, True))
    return out


def hedge_lines(text: str, first_marker: int | None, cls: str | None, letter: str | None) -> tuple[bool, bool]:
    """(class hedged, letter hedged) by what follows the answer: a line naming another class (any form) or
    another letter, with or without a hedge word ("Нет, скорее ирония.", "P.S. В тоже подходит.", "50/50 с
    В."), takes that part back; a line that doubts or corrects ("Хотя не уверен.", "Поправка: ...") both."""
    cls_hedge = letter_hedge = False
    for line, alternatives in _afterwords(text, first_marker):
        doubt = _doubts(line)
        cls_hedge |= doubt or (alternatives and bool(_afterword_classes(line) - {cls}))
        letter_hedge |= doubt or (alternatives and bool(_afterword_letters(line) - {letter}))
    return cls_hedge, letter_hedge
