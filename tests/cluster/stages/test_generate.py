"""A generic stage none of whose answers parse says so: one ``answers_never_parsed`` warning from its reduce, once
it has :data:`NEVER_PARSED_AFTER` answers (fewer is a smoke test its author reads), none if one answer parsed."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from punchline.cluster.config import load_config
from punchline.cluster.pipeline import StageContext
from punchline.cluster.stages.generate import NEVER_PARSED_AFTER, never_parsed
from punchline.cluster.stages.outputs import OutputRow
from punchline.cluster.stages.settings import ParseSettings
from punchline.data.stores.local import LocalStore
from punchline.workers.logs import add_listener, configure_logging, reset_logging

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def events(tmp_path: Path) -> Iterator[list[Mapping[str, object]]]:
    configure_logging(tmp_path, console=False)
    seen: list[Mapping[str, object]] = []
    unlisten = add_listener(seen.append)
    try:
        yield seen
    finally:
        unlisten()
        reset_logging()


def rows(count: int, *, parsed_at: int | None = None) -> list[OutputRow]:
    return [
        OutputRow(row_id=str(i), model="m", sample=0, text="I think B", parsed={"a": "B"} if i == parsed_at else None)
        for i in range(count)
    ]


def test_a_stage_whose_answers_never_parse_says_so(tmp_path: Path, events: list[Mapping[str, object]]) -> None:
    ctx = StageContext(load_config(ROOT / "configs" / "prompts_demo.toml"), "r", LocalStore(str(tmp_path / "s")))
    parse = ParseSettings(regex=r"Answer:\s*(?P<a>[ABCD])")
    never_parsed(ctx, "generate", parse, rows(NEVER_PARSED_AFTER - 1), judge=False)  # too few to tell
    never_parsed(ctx, "generate", parse, rows(100, parsed_at=99), judge=False)  # one parsed: the parse can read them
    never_parsed(ctx, "generate", None, rows(100), judge=False)  # no parse step: nothing to say
    assert not [e for e in events if e.get("event") == "answers_never_parsed"]
    never_parsed(ctx, "generate", parse, rows(240), judge=False)
    (warning,) = [e for e in events if e.get("event") == "answers_never_parsed"]
    assert warning["stage"] == "generate" and warning["answers"] == 240
    assert warning["how"] == r"regex Answer:\s*(?P<a>[ABCD])"
