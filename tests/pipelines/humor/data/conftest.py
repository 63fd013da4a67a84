"""Builders of small Humor items for the tests (texts are placeholders; the sample file has real ones)."""

from __future__ import annotations

from pathlib import Path

import pytest

from punchline.pipelines.humor.data.schema import HumorInputs, HumorItem, HumorMeta

TEMPLATE = (
    "Задача.\n\nКонтекст:\n{context}\n\nТекст:\n{main_text}\n\nДополнительные тексты:\n"
    "А. {option_a}\nБ. {option_b}\nВ. {option_c}\nГ. {option_d}"
)
REPO = Path(__file__).resolve().parents[4]
SAMPLE = REPO / "data" / "samples" / "humor_sample.json"


def make_item(id_: int, outputs: str, *, main: str | None = None, instruction: str = TEMPLATE) -> HumorItem:
    return HumorItem(
        instruction=instruction,
        inputs=HumorInputs(
            main_text=main if main is not None else f"основной текст {id_}",
            option_a=f"текст А {id_}",
            option_b=f"текст Б {id_}",
            option_c=f"текст В {id_}",
            option_d=f"текст Г {id_}",
            context="классы",
        ),
        outputs=outputs,
        meta=HumorMeta(id=id_),
    )


@pytest.fixture
def sample_path() -> Path:
    assert SAMPLE.is_file()
    return SAMPLE
