"""Scoring cloze answers: does funny context make a model say the pun more often?

Each answer is classified against the *target* joke's word lists in the puns file (not against the
test's expected list), so straight-primed and funny-primed answers are judged by the same rule; the
headline number is the funny-rate shift in percentage points between the two contexts. A rate over no answers
(a model that answered no test of a context) is undefined: ``report.json`` keeps upstream's ``0.0`` (its schema),
but the tables and figures show ``n/a``, never a measured 0.
"""

from __future__ import annotations

import os
from pathlib import Path

from punchline.data.errors import InputError
from punchline.data.metrics.intervals import wilson
from punchline.data.metrics.tables import NA
from punchline.data.storage.jsonio import atomic_write_bytes, write_upstream_json
from punchline.pipelines.puns.data.intervals import shift_shown
from punchline.pipelines.puns.data.schemas import (
    ClozeReport,
    ClozeResponses,
    ClozeTest,
    ContextSummary,
    ModelSummary,
    PrimingType,
    PunEntry,
    ScoredResponse,
    WordClass,
)

CONTEXTS: tuple[PrimingType, PrimingType] = ("straight", "funny")
ROUND_DIGITS = 4


def _matches(word: str, entry: str) -> bool:
    entry = entry.lower()
    parts = entry.split()
    return word == entry or (bool(parts) and word == parts[0])


def classify_word(word: str, straight: list[str], punny: list[str]) -> WordClass:
    """A word matches a list entry if it equals it or its first word (lowercased); straight wins ties."""
    if not word:
        return "other"
    w = word.lower()
    if any(_matches(w, s) for s in straight):
        return "straight"
    if any(_matches(w, p) for p in punny):
        return "funny"
    return "other"


def score(
    responses: ClozeResponses, tests: list[ClozeTest], puns: list[PunEntry], *, file: str | None = None
) -> dict[str, list[ScoredResponse]]:
    """Classify every answer; keys of ``responses[nick].responses`` are the test's position."""
    by_index = {p.index: p for p in puns}
    scored: dict[str, list[ScoredResponse]] = {}
    for nick, model in responses.items():
        rows = []
        for key, resp in model.responses.items():
            record = f"model {nick!r} response {key!r}"
            if not key.isdigit() or int(key) >= len(tests):
                raise InputError(
                    f"no test at position {key!r} (the tests file has {len(tests)})", file=file, record=record
                )
            test = tests[int(key)]
            if (resp.pair_id, resp.type) != (test.pair_id, test.type):
                raise InputError(
                    f"answers pair {resp.pair_id} {resp.type} but test {key} is pair {test.pair_id} {test.type}",
                    file=file, record=record, field="pair_id")  # fmt: skip
            joke = by_index.get(test.joke_c_index)
            if joke is None:
                raise InputError(f"test {key} targets joke index {test.joke_c_index}, which the puns file lacks",
                                 file=file, record=record)  # fmt: skip
            rows.append(
                ScoredResponse(
                    position=int(key),
                    pair_id=resp.pair_id,
                    context=resp.type,
                    joke_index=joke.index,
                    word=resp.extracted_word,
                    classification=classify_word(resp.extracted_word, joke.straight, joke.punny),
                )
            )
        scored[nick] = rows
    return scored


def _rate(count: int, n: int) -> float:
    return round(count / n, ROUND_DIGITS) if n else 0.0


def _context_summary(rows: list[ScoredResponse]) -> ContextSummary:
    n = len(rows)
    straight = sum(1 for r in rows if r.classification == "straight")
    funny = sum(1 for r in rows if r.classification == "funny")
    other = n - straight - funny
    return ContextSummary(n, straight, funny, other, _rate(straight, n), _rate(funny, n), _rate(other, n))


def summarize(scored: dict[str, list[ScoredResponse]]) -> ClozeReport:
    """Per model and priming context: counts, rates, and the funny-rate shift in percentage points."""
    models = {}
    for nick, rows in scored.items():
        s = _context_summary([r for r in rows if r.context == "straight"])
        f = _context_summary([r for r in rows if r.context == "funny"])
        funny_s = s.funny / s.n if s.n else 0.0
        funny_f = f.funny / f.n if f.n else 0.0
        models[nick] = ModelSummary(straight=s, funny=f, delta_funny_pp=round((funny_f - funny_s) * 100, 2))
    return ClozeReport(models=models)


def _pct(x: float, n: int) -> str:
    """A rate over ``n`` answers, ``n/a`` over none."""
    return f"{x * 100:.1f}%" if n else NA


def _ci(k: int, n: int) -> str:
    iv = wilson(k, n)
    return f"[{iv.low * 100:.1f}, {iv.high * 100:.1f}]" if iv is not None else NA


INTERVALS_NOTE = (
    "Intervals: 95 % Wilson score intervals of each rate; the shift's is Newcombe's hybrid score interval "
    f"(a difference of two independent rates). {NA}: undefined (no answer in that context)."
)


def to_markdown(report: ClozeReport) -> str:
    lines = [
        "| Model | Context | n | Straight | Funny | Other | P(straight) | P(funny) | P(other) |",
        "|-------|---------|--:|---------:|------:|------:|------------:|---------:|---------:|",
    ]
    for nick, m in report.models.items():
        for ctx in CONTEXTS:
            c: ContextSummary = getattr(m, ctx)
            lines.append(
                f"| {nick} | {ctx} | {c.n} | {c.straight} | {c.funny} | {c.other} | "
                f"{_pct(c.p_straight, c.n)} | {_pct(c.p_funny, c.n)} | {_pct(c.p_other, c.n)} |"
            )
    lines += [
        "",
        "| Model | P(funny \\| straight ctx) | 95% CI | P(funny \\| funny ctx) | 95% CI | Delta (pp) | 95% CI |",
        "|-------|------------------------:|-------:|---------------------:|-------:|-----------:|-------:|",
    ]
    for nick, m in report.models.items():
        s, f = m.straight, m.funny
        delta, interval = shift_shown(m)
        lines.append(
            f"| {nick} | {_pct(s.p_funny, s.n)} | {_ci(s.funny, s.n)} | {_pct(f.p_funny, f.n)} | {_ci(f.funny, f.n)} | "
            f"{delta} | {interval} |"
        )
    return "\n".join(lines) + "\n\n" + INTERVALS_NOTE + "\n"


FIGURES = ("context_effect", "funny_shift")
FIGURE_FORMATS = ("png", "pdf", "svg")  # a PNG at 200 dpi to look at, PDF and SVG (vector) to print
REPORT_FILES = ("report.json", "report.md", *(f"{name}.{fmt}" for name in FIGURES for fmt in FIGURE_FORMATS))


def build_report(
    responses: ClozeResponses, tests: list[ClozeTest], puns: list[PunEntry], *, file: str | None = None
) -> ClozeReport:
    """Score every answer against its target joke and summarize per model and context."""
    return summarize(score(responses, tests, puns, file=file))


def write_report(report: ClozeReport, out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write every report file atomically into ``out_dir`` (created if needed)."""
    from punchline.pipelines.puns.data.plots import (  # lazy: matplotlib
        figure_context_effect,
        figure_funny_shift,
        render_all,
    )

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError("is not a directory", file=str(out))
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / name for name in REPORT_FILES]
    write_upstream_json(paths[0], report)
    atomic_write_bytes(paths[1], to_markdown(report).encode("utf-8"))
    for name, fig in zip(FIGURES, (figure_context_effect(report), figure_funny_shift(report)), strict=True):
        for fmt, data in render_all(fig).items():
            atomic_write_bytes(out / f"{name}.{fmt}", data)
    return paths
