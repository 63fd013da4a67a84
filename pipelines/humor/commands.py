"""``punchline humor validate | score | run | submission``: the Humor benchmark (MERA format)."""

from __future__ import annotations

import argparse
import math
import sys

import msgspec
from rich.console import Console
from rich.table import Table

from punchline.cluster.cli.commands import summary
from punchline.cluster.cli.shared import Subcommands, add_run_command, run_config
from punchline.data.errors import ConfigError
from punchline.data.settings import RUNS_DIR_HELP
from punchline.pipelines.humor.data.judge import DEFAULT_THRESHOLD
from punchline.pipelines.humor.data.loaders import load_items
from punchline.pipelines.humor.data.report import HumorReport, headlines, score_files
from punchline.pipelines.humor.data.validate import validate_items
from punchline.pipelines.humor.pipeline import PIPELINE, submission_of_run


def register(sub: Subcommands) -> None:
    humor = sub.add_parser(
        "humor",
        help=summary("humor"),
        description="The MERA Humor task: classify a joke into one of 12 comic-effect classes and pick the "
        "additional text (А-Г) of the same class.",
    )
    hs = humor.add_subparsers(dest="humor_command", metavar="SUBCOMMAND")
    hs.required = True

    v = hs.add_parser(
        "validate",
        help="check a Humor data file (test.json, shots.json or a parquet split)",
        description="Counts, items per class, correct-letter distribution (chi-square vs uniform), and errors: "
        "duplicate ids, missing placeholders, malformed outputs, an option identical to the main text. "
        "Exit status 1 when there are errors.",
    )
    v.add_argument("file", help="MERA JSON (test.json / shots.json) or Hugging Face parquet")
    v.add_argument("--json", action="store_true", help="machine-readable output")
    v.set_defaults(func=cmd_validate)

    _add_score(hs)

    add_run_command(
        hs,
        "run",
        cmd_run,
        help="run a model (and optionally a judge) on Humor from a TOML config",
        description="Collect answers on the engine (resumable), then score them like `humor score`.",
        config_help='run config (TOML) with pipeline = "humor"',
    )

    _add_submission(hs)


def _add_score(hs: Subcommands) -> None:
    """The subcommand ``humor score``."""
    s = hs.add_parser(
        "score",
        help="score model answers: EM (MERA's reading and ours), per-class metrics, both judges",
        description="Writes report.json, report.md, confusion.png and .svg into --out, and MERA's submission files "
        "Humor.json + logs_public.zip when every item has an answer.",
    )
    s.add_argument("--data", required=True, help="the data file with reference outputs")
    s.add_argument("--predictions", required=True, help='JSONL: {"id": int, "text": "<raw model answer>"} per line')
    s.add_argument("--out", required=True, help="output folder")
    s.add_argument(
        "--judge-scores",
        help='JSONL: {"id": int, "score": 0|1|null} or {"id": int, "text": "<judge reply>"} per line',
    )
    s.add_argument(
        "--judge-mera-scores",
        help='JSONL for MERA\'s judge (judge_mera): {"id": int, "score": 0..1} or {"id": int, "text": "<judge reply>"}'
        ', optionally "failed_calls": n (counted in the report)',
    )
    s.add_argument("--judge-threshold", type=float, default=None, help="judge pass threshold (default 1)")
    s.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for the 95%% intervals")
    s.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    s.add_argument("--json", action="store_true", help="print report.json instead of a table")
    s.set_defaults(func=cmd_score)


def _add_submission(hs: Subcommands) -> None:
    """The subcommand ``humor submission``."""
    sb = hs.add_parser(
        "submission",
        help="pack a Humor run's answers as MERA's log_to_submission_v2.py would (Humor.json + logs)",
        description='Writes OUT/<model>/Humor.json ({"data": {"test": [{"outputs": <the model\'s text>, '
        '"meta": {"id": ...}}]}}) and OUT/<model>/logs_public.zip (lm-eval-shaped sample logs), and zips '
        "each folder as OUT/<model>.zip. Every item needs exactly one answer.",
    )
    sb.add_argument("run", metavar="RUN", help="the run id")
    sb.add_argument("--out", default=None, help="output folder (default: submission-<RUN>)")
    sb.add_argument("--runs-dir", help=RUNS_DIR_HELP)
    sb.add_argument("--model", action="append", help="only this model nick (repeatable; default: every model)")
    sb.set_defaults(func=cmd_submission)


MAX_BOOTSTRAP = 100_000  # resamples: more adds nothing to a 95 % interval and can take hours


def cmd_validate(args: argparse.Namespace) -> int:
    rep = validate_items(load_items(args.file))
    if args.json:
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(rep), indent=2).decode() + "\n")
        return 0 if rep.ok else 1
    console = Console()
    console.print(f"[bold]{args.file}[/bold]: {rep.n} items, {rep.n_labeled} with a reference answer")
    classes = Table("class", "items", title="items per class (from outputs)")
    for cls, count in rep.per_class.items():
        classes.add_row(cls, str(count))
    console.print(classes)
    letters = Table(*rep.letters, title="correct letters")
    letters.add_row(*(str(c) for c in rep.letters.values()))
    console.print(letters)
    if rep.chi2 is not None and rep.chi2_p_value is not None:
        console.print(f"chi-square vs uniform: {rep.chi2:.3f} (3 dof), p = {rep.chi2_p_value:.4f}")
    if rep.duplicate_ids:
        console.print(f"[red]duplicate ids:[/red] {rep.duplicate_ids}")
    if rep.errors or rep.warnings:
        issues = Table("severity", "#", "id", "field", "message", title="issues")
        for issue in [*rep.errors, *rep.warnings]:
            style = "red" if issue.severity == "error" else "yellow"
            issues.add_row(
                f"[{style}]{issue.severity}[/{style}]", str(issue.index), str(issue.id), issue.field, issue.message
            )
        console.print(issues)
    console.print(
        f"[green]OK[/green]: no errors ({len(rep.warnings)} warnings)"
        if rep.ok
        else f"[red]{len(rep.errors)} errors[/red], {len(rep.warnings)} warnings"
    )
    return 0 if rep.ok else 1


def cmd_score(args: argparse.Namespace) -> int:
    if not 1 <= args.bootstrap <= MAX_BOOTSTRAP:
        raise ConfigError(f"must be between 1 and {MAX_BOOTSTRAP}, got {args.bootstrap}", field="--bootstrap")
    if args.seed < 0:
        raise ConfigError(f"must be >= 0, got {args.seed}", field="--seed")
    if args.judge_threshold is not None and not (
        math.isfinite(args.judge_threshold) and 0 <= args.judge_threshold <= 1
    ):
        raise ConfigError(f"must be a number in [0, 1], got {args.judge_threshold}", field="--judge-threshold")
    report, paths = score_files(
        args.out,
        args.data,
        args.predictions,
        judge_scores_path=args.judge_scores,
        judge_mera_scores_path=args.judge_mera_scores,
        judge_threshold=DEFAULT_THRESHOLD if args.judge_threshold is None else args.judge_threshold,
        resamples=args.bootstrap,
        seed=args.seed,
    )
    if args.json:
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(report), indent=2).decode() + "\n")
        return 0
    written = [paths.report_json, paths.report_md, paths.confusion_png, paths.confusion_svg]
    print_score_summary(report, [*([paths.submission] if paths.submission else []), *written])
    return 0


def print_score_summary(report: HumorReport, written: list[str], console: Console | None = None) -> None:
    """The human summary of a scored run (also used by the engine's Humor pipeline)."""
    console = console or Console()
    metrics, judge = report, report.judge
    t = Table("metric", "value", title=f"Humor: {metrics.n} items")
    for line in headlines(report):
        if line.value is not None:
            t.add_row(line.label, line.shown())
    t.add_row("class accuracy", f"{100 * metrics.class_accuracy:.1f} %")
    t.add_row("letter accuracy", f"{100 * metrics.letter_accuracy:.1f} %")
    t.add_row("parse failures", f"{100 * metrics.parse_failure_rate:.1f} %")
    t.add_row("ambiguous (never credited)", f"{100 * metrics.ambiguous_rate:.1f} % ({metrics.ambiguous})")
    t.add_row("missing predictions", str(metrics.n_missing))
    if judge is not None:
        t.add_row("judge missing", str(judge.n_missing))
        kappa = "–" if judge.kappa_with_em is None else f"{judge.kappa_with_em:.3f}"
        t.add_row("judge vs EM kappa", kappa)
    if report.judge_mera_failed_calls is not None:
        t.add_row("MERA's judge: failed calls (scored 0)", str(report.judge_mera_failed_calls))
    console.print(t)
    for name in written:
        print(f"wrote {name}")  # a path whole on one line (rich wraps at 80 columns off a terminal)


def cmd_submission(args: argparse.Namespace) -> int:
    written = submission_of_run(
        args.run,
        runs_dir=args.runs_dir,
        out_dir=args.out or f"submission-{args.run}",
        models=args.model,
    )
    for name in written:
        print(f"wrote {name}")  # a path whole on one line, as the puns commands print theirs
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """``punchline humor run``: ``punchline run`` for a ``pipeline = "humor"`` config (which prints each model's
    scores as the pipeline's headlines); any other pipeline is refused, naming ``run.pipeline``."""
    return run_config(args, pipeline=PIPELINE.name, command="humor run")
