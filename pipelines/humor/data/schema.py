"""msgspec Structs of the MERA Humor files, and the task's fixed vocabulary.

Field order follows the published files (``instruction, inputs, outputs, meta``) so that a decoded
file re-encodes in the same layout. Unknown fields are tolerated (and dropped) rather than rejected:
MERA has added meta fields to other tasks over time and a new one must not break loading.
"""

from __future__ import annotations

import msgspec

#: The 12 classes, in the order the official ``context`` field lists them (11 effects + control).
CLASSES: tuple[str, ...] = (
    "игра слов",
    "игра паттернов",
    "секрет Полишинеля",
    "каламбур",
    "оксюморон",
    "логика абсурда",
    "обман ожиданий",
    "капитан Очевидность",
    "эллипсис",
    "ирония",
    "остроумный ответ",
    "не анекдот",
)
NOT_A_JOKE = "не анекдот"

#: Answer letters (Cyrillic), in option order: А = option_a ... Г = option_d.
LETTERS: tuple[str, ...] = ("А", "Б", "В", "Г")
OPTION_FIELDS: tuple[str, ...] = ("option_a", "option_b", "option_c", "option_d")
#: Every placeholder an instruction must contain.
PLACEHOLDERS: tuple[str, ...] = ("context", "main_text", *OPTION_FIELDS)


def class_key(name: str) -> str:
    """Comparison key of a class name: case-insensitive, ё == е, whitespace collapsed."""
    return " ".join(name.lower().replace("ё", "е").split())


_CANONICAL_BY_KEY = {class_key(c): c for c in CLASSES}


def canonical_class(name: str) -> str | None:
    """The canonical spelling of an exactly-named class (modulo case/ё/spaces), else None."""
    return _CANONICAL_BY_KEY.get(class_key(name))


class HumorInputs(msgspec.Struct):
    main_text: str
    option_a: str
    option_b: str
    option_c: str
    option_d: str
    context: str

    def option(self, letter: str) -> str:
        """The text of option ``letter`` (one of :data:`LETTERS`)."""
        return str(getattr(self, OPTION_FIELDS[LETTERS.index(letter)]))


class HumorMeta(msgspec.Struct):
    """``id`` is what submissions are keyed by; other meta fields are accepted and ignored."""

    id: int


class HumorItem(msgspec.Struct):
    """One task. ``outputs`` is ``"class,letter"``; it is ``""`` in the private test file."""

    instruction: str
    inputs: HumorInputs
    outputs: str
    meta: HumorMeta

    @property
    def id(self) -> int:
        return self.meta.id


class HumorTestFile(msgspec.Struct):
    """``test.json``: ``{"access": "private", "data": [...]}``."""

    access: str
    data: list[HumorItem]


class HumorShotsFile(msgspec.Struct):
    """``shots.json``: ``{"data": [...]}``."""

    data: list[HumorItem]


HumorFile = HumorTestFile | HumorShotsFile


def split_output(output: str) -> tuple[str, str] | None:
    """``"класс,Б"`` -> ``("класс", "Б")`` when it has that shape (class known, letter А-Г), else None.

    The class is returned in its canonical spelling, so references compare by :func:`class_key`.
    """
    head, sep, letter = output.rpartition(",")
    if not sep:
        return None
    cls = canonical_class(head)
    letter = letter.strip()
    if cls is None or letter not in LETTERS:
        return None
    return cls, letter
