import pytest

from punchline.pipelines.humor.data.parser import ParsedAnswer, parse_answer, parse_class, parse_letter
from punchline.pipelines.humor.data.schema import CLASSES

OK_CASES = [
    # canonical two-line format
    ("ОТВЕТ ирония\nРЕШЕНИЕ Б", "ирония", "Б"),
    ("ОТВЕТ эллипсис\nРЕШЕНИЕ Г", "эллипсис", "Г"),
    # colon / dash / em dash, any case of markers
    ("ОТВЕТ: ирония\nРЕШЕНИЕ: Б", "ирония", "Б"),
    ("Ответ - каламбур\nРешение - А", "каламбур", "А"),
    ("ответ — оксюморон\nрешение — в", "оксюморон", "В"),
    ("ОТВЕТ:игра слов\nРЕШЕНИЕ:Г", "игра слов", "Г"),
    # markdown bold and quotes
    ("**ОТВЕТ:** «логика абсурда»\n**РЕШЕНИЕ:** Б", "логика абсурда", "Б"),
    ('**ОТВЕТ**: "обман ожиданий"\n**РЕШЕНИЕ**: **В**', "обман ожиданий", "В"),
    ("ОТВЕТ “секрет Полишинеля”\nРЕШЕНИЕ 'А'", "секрет Полишинеля", "А"),
    # class in other case, trailing punctuation, ё, hyphen
    ("ОТВЕТ Капитан Очевидность.\nРЕШЕНИЕ Г.", "капитан Очевидность", "Г"),
    ("ОТВЕТ капитан очевидность\nРЕШЕНИЕ Б", "капитан Очевидность", "Б"),
    ("ОТВЕТ КАПИТАН-ОЧЕВИДНОСТЬ!\nРЕШЕНИЕ Б", "капитан Очевидность", "Б"),
    ("ОТВЕТ секрет полишинеля;\nРЕШЕНИЕ В)", "секрет Полишинеля", "В"),
    ("ОТВЕТ Не анекдот\nРЕШЕНИЕ (А)", "не анекдот", "А"),
    ("ОТВЕТ Остроумный ответ\nРЕШЕНИЕ Б", "остроумный ответ", "Б"),
    ("ОТВЕТ игра паттернов\nРЕШЕНИЕ б", "игра паттернов", "Б"),
    ("ОТВЕТ обман ожиданий\nРЕШЕНИЕ г", "обман ожиданий", "Г"),
    ("ОТВЕТ Логика Абсурда\nРЕШЕНИЕ а", "логика абсурда", "А"),
    # Latin letters, all of the answer's letters Latin: read by position (A/B/C/D = А/Б/В/Г)
    ("ОТВЕТ ирония\nРЕШЕНИЕ A", "ирония", "А"),
    ("ОТВЕТ ирония\nРЕШЕНИЕ B", "ирония", "Б"),
    ("ОТВЕТ ирония\nРЕШЕНИЕ C", "ирония", "В"),
    ("ОТВЕТ ирония\nРЕШЕНИЕ D.", "ирония", "Г"),
    ("ОТВЕТ ирония\nРЕШЕНИЕ a", "ирония", "А"),
    ("ОТВЕТ ирония\nРЕШЕНИЕ b", "ирония", "Б"),
    ("ирония, B", "ирония", "Б"),
    ("ОТВЕТ: ирония, B", "ирония", "Б"),
    # Latin look-alikes inside Cyrillic text
    ("ОТВЕТ иpoния\nРЕШЕНИЕ Б", "ирония", "Б"),  # Latin p and o inside a Cyrillic word
    ("ОТВЕТ ирония\nРЕШЕНИE Г", "ирония", "Г"),  # Latin E in the marker
    ("ОТВЕТ ирония\nРЕШЕНИЕ А\nИтак, РЕШЕНИЕ A", "ирония", "А"),  # Latin A beside Cyrillic А reads as А
    # the letter glued to the marker; a class name containing "ответ" on the next line; English markers
    ("ОТВЕТ ирония\nРЕШЕНИЕА", "ирония", "А"),
    ("ОТВЕТ эллипсис\nРЕШЕНИЕГ.", "эллипсис", "Г"),
    ("ОТВЕТ\nостроумный ответ\nРЕШЕНИЕ\nВ", "остроумный ответ", "В"),
    ("ОТВЕТ ОСТРОУМНЫЙ ОТВЕТ\nРЕШЕНИЕ Б", "остроумный ответ", "Б"),
    ("ANSWER: ирония\nSOLUTION: Б", "ирония", "Б"),
    ("Answer: каламбур\nSolution: C", "каламбур", "В"),
    ("The answer is «ирония», solution: D", "ирония", "Г"),
    # a letter followed by its reasons; a repeated answer that agrees; a letter ruled out
    ("ОТВЕТ ирония\nРЕШЕНИЕ: А, потому что в тексте А тоже ирония", "ирония", "А"),
    ("ОТВЕТ ирония\nРЕШЕНИЕ: В (там тоже ирония)", "ирония", "В"),
    ("ОТВЕТ ирония\nРЕШЕНИЕ Б\n\nИтого: ОТВЕТ ирония, РЕШЕНИЕ Б", "ирония", "Б"),
    ("ОТВЕТ ирония\nРЕШЕНИЕ: Б, а не В", "ирония", "Б"),
    # the two-line format with one marker missing, or both parts on one line without ОТВЕТ
    ("ирония\nРЕШЕНИЕ Б", "ирония", "Б"),
    ("ОТВЕТ ирония\nБ", "ирония", "Б"),
    ("ОТВЕТ:\nирония\nБ.", "ирония", "Б"),
    ("«ирония» РЕШЕНИЕ Б", "ирония", "Б"),
    ("Разберём текст.\nИРОНИЯ\nБ", "ирония", "Б"),
    # a lower-case marker in prose is not an answer; one that labels a short value is
    ("Решение: сначала рассмотрим вариант А, затем Б и В.\nОТВЕТ ирония\nРЕШЕНИЕ Г", "ирония", "Г"),
    ("Ответ: ирония\nРЕШЕНИЕ Г", "ирония", "Г"),
    # the format's letter list echoed back is not an answer
    ("РЕШЕНИЕ может быть только из списка (А, Б, В, Г).\nОТВЕТ ирония\nРЕШЕНИЕ Б", "ирония", "Б"),
    # one line
    ("ОТВЕТ ирония РЕШЕНИЕ Б", "ирония", "Б"),
    ("ОТВЕТ: остроумный ответ; РЕШЕНИЕ: Г", "остроумный ответ", "Г"),
    ("ОТВЕТ остроумный ответ РЕШЕНИЕ В", "остроумный ответ", "В"),
    ("ОТВЕТ: ирония, Б", "ирония", "Б"),
    # extra text before and after
    (
        "Давайте разберём текст. Здесь важна концовка.\n\nОТВЕТ ирония\nРЕШЕНИЕ Б\n\nПояснение: текст Б тоже ироничен.",
        "ирония",
        "Б",
    ),
    ("Формат: ОТВЕТ <класс>, РЕШЕНИЕ <буква>.\nОТВЕТ эллипсис\nРЕШЕНИЕ Г", "эллипсис", "Г"),
    ("ОТВЕТ: ирония\nРЕШЕНИЕ: Б\nМоё решение основано на том, что это не остроумный ответ.", "ирония", "Б"),
    # value on the next line
    ("ОТВЕТ:\nкаламбур\nРЕШЕНИЕ:\nВ", "каламбур", "В"),
    # class named inside more words
    ("ОТВЕТ: класс «ирония»\nРЕШЕНИЕ: вариант Б", "ирония", "Б"),
    ("ОТВЕТ: игра слов (обыгрывается омонимия)\nРЕШЕНИЕ: текст Г", "игра слов", "Г"),
    ("ОТВЕТ: это оксюморон, а не ирония\nРЕШЕНИЕ: в тексте Б", "оксюморон", "Б"),
    ("ОТВЕТ ирония\nРЕШЕНИЕ Б — потому что там тоже ирония", "ирония", "Б"),
    # no markers, reference-shaped
    ("ирония,Б", "ирония", "Б"),
    ("  Капитан Очевидность, в ", "капитан Очевидность", "В"),
    ("Ирония\nБ", "ирония", "Б"),
    ("«Не анекдот»\n\nГ.\n", "не анекдот", "Г"),
]


@pytest.mark.parametrize(("text", "cls", "letter"), OK_CASES)
def test_parses(text: str, cls: str, letter: str) -> None:
    parsed = parse_answer(text)
    assert parsed == ParsedAnswer(cls, letter)
    assert parsed.as_output() == f"{cls},{letter}"


FAIL_CASES = [  # (text, class, letter); none of them is ambiguous
    ("", None, None),
    ("   \n  ", None, None),
    ("Не знаю.", None, None),
    ("ОТВЕТ: не знаю\nРЕШЕНИЕ: не уверен", None, None),
    ("ОТВЕТ сарказм\nРЕШЕНИЕ Б", None, "Б"),  # not one of the 12 classes
    ("ОТВЕТ ирония\nРЕШЕНИЕ Д", "ирония", None),  # not a valid letter
    ("ОТВЕТ ирония\nРЕШЕНИЕ E", "ирония", None),  # not a position either
    ("ОТВЕТ ирония", "ирония", None),  # no solution
    ("РЕШЕНИЕ Б", None, "Б"),  # no class
    ("ОТВЕТ: не ирония\nРЕШЕНИЕ: А", None, "А"),  # negated class
    ("ОТВЕТ ирония\nРЕШЕНИЕ в тексте", "ирония", None),  # preposition, not a letter
    ("ирония", None, None),
    ("ирония, Д", None, None),
    ("ирония\nтекст\nБ", None, None),
]


@pytest.mark.parametrize(("text", "cls", "letter"), FAIL_CASES)
def test_partial_or_unparsed(text: str, cls: str | None, letter: str | None) -> None:
    parsed = parse_answer(text)
    assert parsed == ParsedAnswer(cls, letter, ambiguous=False)
    assert parsed.as_output() is None


@pytest.mark.parametrize("cls", CLASSES)
def test_every_class_round_trips_in_many_spellings(cls: str) -> None:
    for spelling in (cls, cls.upper(), cls.lower(), f"«{cls}»", f'"{cls}".', f"**{cls.title()}**"):
        assert parse_class(spelling) == cls, spelling
        assert parse_answer(f"ОТВЕТ: {spelling}\nРЕШЕНИЕ: Г").as_output() == f"{cls},Г"


def test_yo_variant() -> None:
    # no canonical class has ё, but models write ё in words that have е and vice versa
    assert parse_class("оксюморон") == "оксюморон"
    assert parse_class("ОБМАН ОЖИДАНИЙ") == "обман ожиданий"
    assert parse_class("обман ожиданий") == parse_class("обман ожиданий".replace("е", "ё"))


@pytest.mark.parametrize(
    ("segment", "letter"),
    [("Б", "Б"), (" : г.", "Г"), ("**B**", "Б"), ("буква «Г»", "Г"), ("Б или В", None), ("", None), ("Е", None)],
)
def test_parse_letter(segment: str, letter: str | None) -> None:
    assert parse_letter(segment) == letter


# --- hedges and disagreeing answers: never credited, always flagged ambiguous ---------------------


def _ambiguous(text: str) -> ParsedAnswer:
    parsed = parse_answer(text)
    assert parsed.ambiguous, parsed
    assert parsed.as_output() is None
    return parsed


def test_two_letters_with_a_comma_are_a_hedge() -> None:
    assert _ambiguous("ОТВЕТ ирония\nРЕШЕНИЕ А, Г") == ParsedAnswer("ирония", None, ambiguous=True)


def test_two_letters_joined_by_and_are_a_hedge() -> None:
    assert _ambiguous("ОТВЕТ ирония\nРЕШЕНИЕ А и Г") == ParsedAnswer("ирония", None, ambiguous=True)


def test_two_letters_side_by_side_are_a_hedge() -> None:
    assert _ambiguous("ОТВЕТ ирония\nРЕШЕНИЕ А Г") == ParsedAnswer("ирония", None, ambiguous=True)


def test_two_letters_joined_by_or_are_a_hedge() -> None:
    assert _ambiguous("ОТВЕТ ирония\nРЕШЕНИЕ Б или В") == ParsedAnswer("ирония", None, ambiguous=True)
    assert _ambiguous("ирония\nБ или В").letter is None  # also without markers


def test_two_classes_are_a_hedge() -> None:
    assert _ambiguous("ОТВЕТ: ирония или каламбур\nРЕШЕНИЕ: А") == ParsedAnswer(None, "А", ambiguous=True)
    assert _ambiguous("ОТВЕТ: ирония или каламбур\nРЕШЕНИЕ: А или Б") == ParsedAnswer(None, None, ambiguous=True)


def test_class_of_one_answer_is_not_joined_to_the_letter_of_another() -> None:
    assert _ambiguous("ОТВЕТ игра слов\nРЕШЕНИЕ А\nОТВЕТ оксюморон") == ParsedAnswer(None, "А", ambiguous=True)


def test_two_complete_answers_that_disagree_give_none() -> None:
    text = "ОТВЕТ каламбур\nРЕШЕНИЕ А\nНет, подумав ещё раз:\nОТВЕТ ирония\nРЕШЕНИЕ Б"
    assert _ambiguous(text) == ParsedAnswer(None, None, ambiguous=True)


def test_two_answers_that_disagree_only_in_the_letter_give_none() -> None:
    assert _ambiguous("ОТВЕТ ирония\nРЕШЕНИЕ А\nОТВЕТ ирония\nРЕШЕНИЕ Б") == ParsedAnswer(
        "ирония", None, ambiguous=True
    )


def test_a_lower_case_answer_that_disagrees_with_an_upper_case_one_gives_none() -> None:
    text = "ответ: игра паттернов\nрешение: А\n\nОТВЕТ ирония\nРЕШЕНИЕ А"
    assert _ambiguous(text) == ParsedAnswer(None, "А", ambiguous=True)


def test_an_answer_without_markers_that_disagrees_with_a_marked_one_gives_none() -> None:
    assert _ambiguous("логика абсурда\nРЕШЕНИЕ А\n\nОТВЕТ ирония\nРЕШЕНИЕ А").cls is None
    assert _ambiguous("ИРОНИЯ\nГ.\n\nОТВЕТ ирония\nРЕШЕНИЕ А").letter is None


def test_latin_and_cyrillic_letters_that_disagree_give_none() -> None:
    # "B" beside a Cyrillic Б is the look-alike В, not Б by position: two different letters
    assert _ambiguous("ОТВЕТ ирония\nРЕШЕНИЕ Б\nРЕШЕНИЕ B").letter is None
