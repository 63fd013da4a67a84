from hypothesis import given, settings
from hypothesis import strategies as st

from punchline.pipelines.humor.data.mera import em_mera, mera_readings
from punchline.pipelines.humor.data.parser import parse_answer
from punchline.pipelines.humor.data.schema import CLASSES, LETTERS

FORMATS = [
    "ОТВЕТ {c}\nРЕШЕНИЕ {l}",
    "**ОТВЕТ:** {c}\n**РЕШЕНИЕ:** {l}",
    "ответ: {lc}\nрешение: {l}",
    "Подумаем.\nОТВЕТ: «{c}»\nРЕШЕНИЕ: {l}.",
    "{prefix}\n\nОтвет — {uc}\nРешение — {ll}\n",
    "ОТВЕТ {c} РЕШЕНИЕ {l}",
]


@settings(max_examples=300, deadline=None)
@given(
    cls=st.sampled_from(CLASSES),
    letter=st.sampled_from(LETTERS),
    fmt=st.sampled_from(FORMATS),
    prefix=st.text(alphabet="абвгд ежз.,\n", max_size=40),
)
def test_formats_round_trip(cls: str, letter: str, fmt: str, prefix: str) -> None:
    text = fmt.format(c=cls, lc=cls.lower(), uc=cls.upper(), l=letter, ll=letter.lower(), prefix=prefix)
    assert parse_answer(text).as_output() == f"{cls},{letter}"


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_never_raises_and_parts_are_canonical(text: str) -> None:
    parsed = parse_answer(text)
    assert parsed.cls is None or parsed.cls in CLASSES
    assert parsed.letter is None or parsed.letter in LETTERS
    assert em_mera("ирония,Б", text) in (0, 1)
    assert all(isinstance(r, str) for r in mera_readings(text))
