import pytest

from punchline.pipelines.humor.data.mera import (
    compute_exact,
    em_mera,
    generic_readings,
    mera_filtered,
    mera_pair,
    mera_readings,
    squad_normalize,
)


@pytest.mark.parametrize(
    ("text", "pair"),
    [
        ("ОТВЕТ эллипсис\nРЕШЕНИЕ Г", "эллипсис,Г"),
        ("ОТВЕТ: эллипсис\nРЕШЕНИЕ: Г", "эллипсис,Г"),
        ("**ОТВЕТ:** эллипсис\n**РЕШЕНИЕ:** Г", "** эллипсис,"),  # the "**" after the colon stays; no letter
        ("ответ — ирония, решение б", "ирония,Б"),  # any case; the class is cut before РЕШЕНИЕ
        ("ОТВЕТ ирония\nОТВЕТ каламбур\nРЕШЕНИЕ А\nРЕШЕНИЕ Б", "каламбур,Б"),  # the last of each wins
        ("ирония\nРЕШЕНИЕ Б", ",Б"),  # a marker alone is enough
        ("ОТВЕТ ирония\r\nРЕШЕНИЕ Б", "ирония\r,Б"),  # the \r survives the strip
        ("безответный вопрос", "ный вопрос,"),  # ОТВЕТ inside a word counts
        ("ирония , Б.", "ирония,Б"),  # the final shape without markers
        ("ирония, б", "ирония, б"),  # ... with a capital letter only
        ("", ""),
        ("  \n", ""),
    ],
)
def test_mera_pair(text: str, pair: str) -> None:
    assert mera_pair(text) == pair


def test_readings() -> None:
    assert generic_readings("Думаю так. Ответ: ирония,Б") == ["Думаю так. Ответ: ирония,Б", "ирония,Б"]
    assert generic_readings("Ответ:") == ["Ответ:"]  # an empty tail adds nothing
    assert generic_readings("ответ: ирония") == ["ответ: ирония"]  # the generic marker is case-sensitive
    assert mera_readings("  ОТВЕТ ирония\nРЕШЕНИЕ Б ") == ["ОТВЕТ ирония\nРЕШЕНИЕ Б", "ирония,Б"]
    assert mera_readings("ирония,Б") == ["ирония,Б"]  # the pair is the whole answer: one reading
    assert mera_readings(None) == [""]
    assert mera_filtered(None) == "" and mera_filtered("  a ") == "a "


@pytest.mark.parametrize(
    ("s", "normalized"),
    [
        ("эллипсис,Г", "эллипсисг"),
        ("Капитан Очевидность,В", "капитан очевидностьв"),
        ("  The  игра   слов, a Б ", "игра слов б"),
        ("«ирония»,Б", "«ирония»б"),  # guillemets are not ASCII punctuation
        ("theory", "theory"),  # articles only as whole words
        ("ОБМАН ОЖИДАНИЙ!", "обман ожиданий"),
    ],
)
def test_squad_normalize(s: str, normalized: str) -> None:
    assert squad_normalize(s) == normalized


def test_compute_exact() -> None:
    assert compute_exact("эллипсис,Г", "Эллипсис,г") == 1
    assert compute_exact("эллипсис,Г", "эллипсис, Г") == 0  # the space survives: "эллипсис г"
    assert compute_exact("эллипсис,Г", "эллипсис.,Г.") == 1
    assert compute_exact("", "") == 1


@pytest.mark.parametrize(
    ("text", "score"),
    [
        ("ОТВЕТ эллипсис\nРЕШЕНИЕ Г", 1),
        ("ОТВЕТ: Эллипсис.\nРЕШЕНИЕ: Г.", 1),
        ("ОТВЕТ эллипсис РЕШЕНИЕ Г", 1),  # one line
        ("Рассуждаю.\nОтвет: эллипсис,Г", 1),  # the tail after the last "Ответ:"
        ("эллипсис,Г", 1),
        ("ОТВЕТ эллипсис\r\nРЕШЕНИЕ Г", 0),  # CRLF: the \r stays in the class
        ("ОТВЕТ «эллипсис»\nРЕШЕНИЕ Г", 0),
        ("ОТВЕТ эллипсис\nРЕШЕНИЕ В", 0),
        ("эллипсис\nГ", 0),
        ("", 0),
    ],
)
def test_em_mera(text: str, score: int) -> None:
    assert em_mera("эллипсис,Г", text) == score
