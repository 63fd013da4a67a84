import pytest

from punchline.data.humor.mera import compute_exact, em_mera, mera_extract, squad_normalize


@pytest.mark.parametrize(
    ("text", "extracted"),
    [
        ("ОТВЕТ эллипсис\nРЕШЕНИЕ Г", "эллипсис,Г"),
        ("ОТВЕТ: эллипсис\nРЕШЕНИЕ: Г", "ОТВЕТ: эллипсис,РЕШЕНИЕ: Г"),  # no "ОТВЕТ " with a space after
        ("Итак, ОТВЕТ ирония ОТВЕТ каламбур\nРЕШЕНИЕ А РЕШЕНИЕ Б", "каламбур,Б"),  # the last marker
        ("ирония\nБ", "ирония,Б"),  # no markers: whole lines
        ("ОТВЕТ ирония\nРЕШЕНИЕ Б\nпояснение", "ирония,Б"),  # third line ignored
        ("\nОТВЕТ ирония\nРЕШЕНИЕ Б", ",ОТВЕТ ирония"),  # a leading newline shifts the lines
        ("", ""),
        ("ОТВЕТ ирония РЕШЕНИЕ Б", None),  # single line: the official filter raises IndexError
        ("ОТВЕТ ирония\r\nРЕШЕНИЕ Б", "ирония,Б"),  # strip() removes the \r of a CRLF line end
        ("ОТВЕТ ирония \t\nРЕШЕНИЕ  Б ", "ирония,Б"),  # trailing space and tab; two spaces after РЕШЕНИЕ
        ("  ОТВЕТ ирония\n\tРЕШЕНИЕ Б", "ирония,Б"),  # lstrip() before the split
        ("ОТВЕТ  ирония\nРЕШЕНИЕ\tБ", "ирония,РЕШЕНИЕ\tБ"),  # a tab is not the marker's space
    ],
)
def test_mera_extract(text: str, extracted: str | None) -> None:
    assert mera_extract(text) == extracted


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
        ("ОТВЕТ Эллипсис.\nРЕШЕНИЕ Г.", 1),
        ("ОТВЕТ: эллипсис\nРЕШЕНИЕ: Г", 0),  # colon: the marker with a space is not found
        ("ОТВЕТ эллипсис \nРЕШЕНИЕ Г", 1),  # the official filter strips the trailing space
        ("ОТВЕТ эллипсис\r\nРЕШЕНИЕ Г\r\n", 1),  # CRLF
        ("ОТВЕТ эллипсис\nРЕШЕНИЕ  Г", 1),  # two spaces after РЕШЕНИЕ
        ("ОТВЕТ «эллипсис»\nРЕШЕНИЕ Г", 0),
        ("ОТВЕТ эллипсис РЕШЕНИЕ Г", 0),  # one line
        ("ОТВЕТ эллипсис\nРЕШЕНИЕ В", 0),
        ("", 0),
    ],
)
def test_em_mera(text: str, score: int) -> None:
    assert em_mera("эллипсис,Г", text) == score
