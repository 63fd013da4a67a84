"""The bundled sample of original puns loads through the validator and has the promised shape."""

from __future__ import annotations

from pathlib import Path

import msgspec

from punchline.pipelines.puns.data.completions import truncate_before_blank
from punchline.pipelines.puns.data.puns_io import load_puns

SAMPLE = Path(__file__).resolve().parents[4] / "data" / "samples" / "puns_sample.json"


def test_sample_shape(shared_puns: Path) -> None:
    puns = load_puns(SAMPLE)
    assert len(puns) >= 60
    assert [p.index for p in puns] == list(range(len(puns)))
    assert len({p.id for p in puns}) == len(puns)
    assert len({p.sentence.lower() for p in puns}) == len(puns)
    upstream = {truncate_before_blank(p.sentence).lower() for p in load_puns(shared_puns / "puns_205.json")}
    for p in puns:
        assert p.sentence.endswith(" ___"), p.index
        assert 2 <= len(p.straight) <= 5 and 1 <= len(p.punny) <= 3, p.index
        assert not {w.lower() for w in p.straight} & {w.lower() for w in p.punny}, p.index
        assert p.explanation
        for rating in (p.gemini_rating, p.anthropic_rating, p.claudecode_rating):
            assert isinstance(rating, int) and 0 <= rating <= 10
        assert p.consensus_score == p.gemini_rating + p.claudecode_rating  # type: ignore[operator]
        assert p.cloze_tier is msgspec.UNSET and p.cloze_balance is msgspec.UNSET
        assert truncate_before_blank(p.sentence).lower() not in upstream
