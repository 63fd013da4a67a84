"""What the viewer shows of a Puns run on its page: how many ranked jokes fell in each cloze tier, and the
cloze report (its markdown: the per-model table of how context moves a model's reading).

Sections, not HTML (:mod:`punchline.cluster.result_sections`): the viewer renders the report's markdown as its
own tables and escapes every cell. The artifacts' names are the pipeline's (:mod:`.pipeline` passes them), so
this module reads nothing else of it.
"""

from __future__ import annotations

from punchline.cluster.result_sections import Cell, ResultSection, ResultsView


def results(view: ResultsView, ranked: str, cloze_md: str) -> list[ResultSection]:
    """Tiers from ``ranked`` (the ranked jokes, JSON), then the report ``cloze_md``; each when the run has it."""
    out = []
    jokes = view.read_json(ranked) if ranked in view.artifacts else None
    if isinstance(jokes, list):
        tiers: dict[str, int] = {}
        for joke in jokes:
            tier = joke.get("cloze_tier") if isinstance(joke, dict) else None
            if isinstance(tier, str):
                tiers[tier] = tiers.get(tier, 0) + 1
        rows: list[dict[str, Cell]] = [{"tier": t, "jokes": n} for t, n in tiers.items()]
        out.append(ResultSection(title="Tiers", anchor="puns-tiers", rows=rows, empty="no joke has a tier"))
    report = view.read_text(cloze_md) if cloze_md in view.artifacts else None
    if report is not None:
        out.append(ResultSection(title="Cloze", anchor="puns-cloze", markdown=report))
    return out
