"""The offline Puns stages on files (``punchline puns rank | cloze | cloze-report``): every input read and
checked, and every output path found writable, before anything is written; each writes atomically in
upstream's JSON shapes and returns what it wrote, so that the command only prints it.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from punchline.data.storage.jsonio import atomic_write_bytes, check_out_dir
from punchline.pipelines.puns.data import puns_io
from punchline.pipelines.puns.data.cloze import build_tests
from punchline.pipelines.puns.data.cloze_report import build_report, write_report
from punchline.pipelines.puns.data.schemas import ClozeReport
from punchline.pipelines.puns.data.tiers import apply_rankings, rank, tier_counts

PathLike = str | os.PathLike[str]


class Ranked(msgspec.Struct, kw_only=True):
    """What ``rank_file`` wrote: the ranked puns file (its jokes per tier) and the plot, if asked for."""

    out: str
    jokes: int
    tiers: dict[str, int]
    plot: str | None = None


def rank_file(puns_path: PathLike, classified_path: PathLike, out: PathLike, *, plot: PathLike | None = None) -> Ranked:
    """Stage 5: the puns file with its ``cloze_*`` fields (tiers) from the classified completions."""
    out_file = puns_io.out_path(out)
    plot_file = puns_io.out_path(plot, flag="--plot") if plot else None
    puns = puns_io.load_puns(puns_path)
    ranked = apply_rankings(puns, rank(puns_io.load_classified(classified_path)), file=str(classified_path))
    puns_io.dump_puns(out_file, ranked)
    if plot_file is not None:
        from punchline.pipelines.puns.data.plots import plot_tiers  # lazy: matplotlib, only when a plot is asked for

        atomic_write_bytes(plot_file, plot_tiers(ranked))
    return Ranked(
        out=str(out_file),
        jokes=len(ranked),
        tiers=tier_counts(ranked),
        plot=None if plot_file is None else str(plot_file),
    )


class ClozeTests(msgspec.Struct, kw_only=True):
    """What ``cloze_file`` wrote."""

    out: str
    tests: int


def cloze_file(puns_path: PathLike, out: PathLike, *, seed: int, pairs: int) -> ClozeTests:
    """Stage 6: the contrastive cloze tests (two per pair) built from a ranked puns file."""
    out_file = puns_io.out_path(out)
    tests = build_tests(puns_io.load_puns(puns_path), seed=seed, pairs=pairs, file=str(puns_path))
    puns_io.dump_cloze_tests(out_file, tests)
    return ClozeTests(out=str(out_file), tests=len(tests))


def cloze_report_files(
    responses_path: PathLike, tests_path: PathLike, puns_path: PathLike, out_dir: PathLike
) -> tuple[ClozeReport, list[Path]]:
    """The cloze answers scored against the target jokes' lists; the report and the files written."""
    check_out_dir(out_dir)
    puns = puns_io.load_puns(puns_path)
    tests = puns_io.load_cloze_tests(tests_path, puns, puns_file=puns_path)
    responses = puns_io.load_cloze_responses(responses_path, tests)
    report = build_report(responses, tests, puns, file=str(responses_path))
    return report, write_report(report, out_dir)
