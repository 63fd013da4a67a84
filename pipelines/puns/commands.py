"""``punchline puns validate | rank | cloze | cloze-report``: the deterministic Puns stages.

These run offline on files (no providers, no cluster): they rebuild the published artifacts from
the checkpoints, and score cloze answers. Every input is validated before anything is written, so a
bad file ends with one clear error naming the file, the record and the field, and ``--out`` is left
as it was.
"""

from __future__ import annotations

import argparse

from punchline.cluster.cli.commands import summary
from punchline.cluster.cli.shared import (
    Subcommands,
    add_run_options,
    exit_status,
    no_bars,
    run_and_report,
    run_options,
)
from punchline.data.errors import InputError
from punchline.pipelines.puns.data import puns_io
from punchline.pipelines.puns.data.cloze_report import to_markdown
from punchline.pipelines.puns.data.offline import cloze_file, cloze_report_files, rank_file
from punchline.pipelines.puns.data.puns_history import PUBLISHED_TIERS
from punchline.pipelines.puns.data.tiers import tier_counts
from punchline.pipelines.puns.legacy import import_legacy_files
from punchline.pipelines.puns.reproduce import (
    Reproduction,
    UpstreamFiles,
    prepare_reproduction,
    reproduction_of,
)


def register(sub: Subcommands) -> None:
    """``punchline puns ...`` and ``punchline import-legacy``."""
    _register_puns(sub)
    _register_import_legacy(sub)


def _register_puns(sub: Subcommands) -> None:
    puns = sub.add_parser(
        "puns",
        help=summary("puns"),
        description="Offline stages of the Puns 205 pipeline. Files use the upstream JSON shapes "
        "(puns_205.json, classified_completions.json, contextual_cloze_tests_100.json) and are written "
        "byte-compatible with them (json indent=2), atomically.",
    )
    ps = puns.add_subparsers(dest="puns_command", metavar="SUBCOMMAND")
    ps.required = True

    _add_validate(ps)
    _add_rank(ps)
    _add_cloze(ps)
    _add_cloze_report(ps)
    _add_reproduce(ps)


def _add_validate(ps: Subcommands) -> None:
    """The subcommand ``puns validate``."""
    v = ps.add_parser(
        "validate",
        help="check a puns file (exactly one ___, non-empty word lists, unique indices, known tiers)",
        description="Load a puns file the way every stage does and print its size and tier counts.",
    )
    v.add_argument("puns", help="puns file, e.g. puns_205.json or data/samples/puns_sample.json")
    v.set_defaults(func=cmd_validate)


def _add_rank(ps: Subcommands) -> None:
    """The subcommand ``puns rank`` (stage 5)."""
    r = ps.add_parser(
        "rank",
        help="stage 5: add cloze_* fields (balance, p_straight/p_funny/p_other, tier, per-model funny rate)",
        description="Tally each joke's 100 model samples by class (straight / funny / other) and assign "
        "a tier: balanced (balance >= 0.3 and p_funny >= 0.05), leaning (balance > 0.05 and "
        "p_funny >= 0.05), funny_dominated (p_funny > 0.5 and balance <= 0.05), else straight_dominated. "
        "On the published checkpoints this reproduces puns_205.json byte for byte.",
    )
    r.add_argument("--classified", required=True, help="stage 4 checkpoint (classified_completions.json)")
    r.add_argument("--puns", required=True, help="puns file to annotate (every joke needs a classified entry)")
    r.add_argument("--out", required=True, help="where to write the ranked puns file")
    r.add_argument("--plot", metavar="PNG", help="also draw the tiers (balance vs P(funny), funny rate per model)")
    r.set_defaults(func=cmd_rank)


def _add_cloze(ps: Subcommands) -> None:
    """The subcommand ``puns cloze`` (stage 6)."""
    c = ps.add_parser(
        "cloze",
        help="stage 6: build contrastive cloze tests (2 per pair: straight-primed, funny-primed)",
        description="Targets C are straight_dominated jokes, contexts A and B come from balanced + leaning "
        "+ the leftover straight_dominated jokes; one RNG seeded with --seed shuffles both pools. "
        "With the defaults on puns_205.json this is the published contextual_cloze_tests_100.json "
        "(up to words appended to the puns file's lists after publication).",
    )
    c.add_argument("--puns", required=True, help="ranked puns file (with cloze_tier)")
    c.add_argument("--seed", type=int, default=42, help="shuffle seed (default: 42)")
    c.add_argument("--pairs", type=int, default=50, help="number of pairs; 2 tests each (default: 50)")
    c.add_argument("--out", required=True, help="where to write the tests file")
    c.set_defaults(func=cmd_cloze)


def _add_cloze_report(ps: Subcommands) -> None:
    """The subcommand ``puns cloze-report``."""
    s = ps.add_parser(
        "cloze-report",
        help="score cloze answers: straight/funny/other rates per model and priming context",
        description="Classify each answer against the target joke's straight/punny lists (equal to an "
        "entry or its first word, lowercased; straight first) and report the funny-rate shift "
        "(funny-primed minus straight-primed, in percentage points), with 95 % Wilson intervals. Writes "
        "report.json, report.md and the figures context_effect and funny_shift (PNG at 200 dpi, PDF, SVG) into --out.",
    )
    s.add_argument(
        "--responses",
        required=True,
        help='answers: {nick: {"model_id", "responses": {"<test position>": {"pair_id", "type", '
        '"raw_response", "extracted_word"}}}}',
    )
    s.add_argument("--tests", required=True, help="the cloze tests file the answers respond to")
    s.add_argument("--puns", required=True, help="puns file holding the target jokes' word lists")
    s.add_argument("--out", required=True, help="output folder (created if missing)")
    s.set_defaults(func=cmd_cloze_report)


def _add_reproduce(ps: Subcommands) -> None:
    """The subcommand ``puns reproduce``."""
    rp = ps.add_parser(
        "reproduce",
        help="reproduce the published study from upstream's recorded outputs (no provider call, no key)",
        description="Run the whole Puns pipeline over upstream's jokes offline, replaying its recorded model "
        "outputs: the lists as they were when upstream classified (today's lists minus the words its "
        "classifier called 'other'), raw_completions.json, classified_completions.json and the recorded cloze "
        "answers (cloze_benchmark_raw.json) loaded into the response cache with import-legacy, the cloze answers "
        "scored against today's lists as the published analysis did. Prints the tiers (published: 42/51/24/88), "
        "checks the cloze tests against the published ones and prints the context-effect table beside the "
        "published one (+2, +2, +38, +36, +42 pp). Exit status 1 if anything differs from the publication.",
    )
    rp.add_argument("--upstream", required=True, help="folder with puns_205.json and its checkpoints")
    rp.add_argument(
        "--config",
        default="configs/puns_reproduce.toml",
        help="the study's config (default configs/puns_reproduce.toml); its [puns] paths are set to --upstream",
    )
    rp.add_argument("--cloze", help="the recorded cloze answers (default: cloze_benchmark_raw.json in --upstream)")
    rp.add_argument(
        "--published-tests",
        help="upstream's contextual_cloze_tests_100.json, to compare with (default: looked for in --upstream)",
    )
    add_run_options(rp)
    rp.set_defaults(func=cmd_reproduce)


def cmd_validate(args: argparse.Namespace) -> int:
    puns = puns_io.load_puns(args.puns)
    counts = tier_counts(puns)
    ranked = sum(counts.values())
    print(f"{args.puns}: {len(puns)} jokes, all valid")
    if ranked:
        print("  tiers: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return 0


def cmd_rank(args: argparse.Namespace) -> int:
    ranked = rank_file(args.puns, args.classified, args.out, plot=args.plot)
    print(f"wrote {ranked.out}: {ranked.jokes} jokes; " + ", ".join(f"{k} {v}" for k, v in ranked.tiers.items()))
    if ranked.plot is not None:
        print(f"wrote {ranked.plot}")
    return 0


def cmd_cloze(args: argparse.Namespace) -> int:
    if not 1 <= args.pairs <= 100_000:
        raise InputError(f"must be between 1 and 100000, got {args.pairs}", field="--pairs")
    if args.seed < 0:
        raise InputError(f"must be >= 0, got {args.seed}", field="--seed")
    written = cloze_file(args.puns, args.out, seed=args.seed, pairs=args.pairs)
    print(f"wrote {written.out}: {written.tests} tests ({args.pairs} pairs, seed {args.seed})")
    return 0


def cmd_cloze_report(args: argparse.Namespace) -> int:
    report, paths = cloze_report_files(args.responses, args.tests, args.puns, args.out)
    print(to_markdown(report), end="")
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    prepared = prepare_reproduction(
        args.config,
        run_options(args, offline=True),
        upstream_folder=args.upstream,
        cloze=args.cloze,
        published_tests=args.published_tests,
    )
    print(prepared.imported.describe(prepared.store_url), flush=True)
    record = run_and_report(prepared.config_path, prepared.opts, no_bars(args), prepared.cfg)
    result = reproduction_of(record, prepared.upstream)
    print(render_reproduction(result, prepared.upstream))
    return exit_status(record) or (0 if result.matches else 1)


def render_reproduction(r: Reproduction, upstream: UpstreamFiles) -> str:
    """The reproduction beside the publication, as plain text (markdown tables)."""

    def ok(flag: bool) -> str:
        return "as published" if flag else "DIFFERENT from the publication"

    jokes = len({w.index for w in r.removed_words})
    lines = [
        "",
        "## Puns study, reproduced from upstream's recorded outputs",
        "",
        f"- run {r.state}: {r.provider_calls} provider calls; {r.cache_hits} of {r.units} answers replayed from "
        "the response cache",
        f"- lists as upstream classified them: {len(r.removed_words)} words removed from {jokes} jokes' lists "
        '(upstream\'s classifier called them "other"; they were added to puns_205.json afterwards)',
        "- tiers: " + ", ".join(f"{t} {r.tiers.get(t, 0)}" for t in PUBLISHED_TIERS) + f" — {ok(r.tiers_match)}",
        f"- cloze tests: {r.tests}; jokes, order, prompts, tiers and balances {ok(r.tests_match)}",
    ]
    if r.published_file is not None:
        pf = r.published_file
        lines.append(
            f"  (against {upstream.published_tests}: selection {ok(pf.same_selection)}; the word lists differ in "
            f"{pf.lists_differ} tests, the published file carries the lists of the day it was written)"
        )
    if r.table_match is None:
        lines += [
            "- context effect: NOT reproduced — the recorded cloze answers (cloze_benchmark_raw.json, upstream's "
            f"results/) are not in {upstream.folder}; put them there or pass --cloze FILE",
        ]
        return "\n".join(lines)
    lines += [
        "- context effect, recorded answers scored against today's lists (as the published analysis did):",
        "",
        "| Model | P(funny \\| straight ctx) | P(funny \\| funny ctx) | Delta (pp) | published Delta (pp) |",
        "|-------|------------------------:|---------------------:|-----------:|---------------------:|",
    ]
    for s in r.shifts:
        published = "–" if s.published_delta_pp is None else f"{s.published_delta_pp:+.0f}"
        lines.append(
            f"| {s.nick} | {100 * s.p_funny_straight_ctx:.1f}% | {100 * s.p_funny_funny_ctx:.1f}% | "
            f"{s.delta_pp:+.1f} | {published} |"
        )
    lines += ["", f"- context-effect table {ok(bool(r.table_match))}"]
    return "\n".join(lines)


def _register_import_legacy(sub: Subcommands) -> None:
    i = sub.add_parser(
        "import-legacy",
        help=summary("import-legacy"),
        description="Store upstream's recorded answers in the response cache under the exact request keys a "
        "puns run computes, so that run re-pays for nothing and reproduces upstream's files: every completion "
        "of raw_completions.json, with --classified the judge verdicts of classified_completions.json, with "
        "--cloze the recorded cloze answers (cloze_benchmark_raw.json) of the tests in --tests. Provider and "
        "model ids come from --config (its [puns.collect], [puns.classify] and [puns.evaluate] tables; the "
        "classify prompts are built from the config's jokes and lists, as the run builds them) or default to "
        "upstream's: Together.ai Llama models and claude-sonnet-4-20250514 on provider 'anthropic'.",
    )
    i.add_argument("--raw", help="upstream raw_completions.json")
    i.add_argument("--classified", help="upstream classified_completions.json (the classify stage; needs --raw)")
    i.add_argument("--cloze", help="upstream cloze_benchmark_raw.json: recorded answers to the tests in --tests")
    i.add_argument("--tests", help="the cloze tests file the --cloze answers respond to (keys by position)")
    i.add_argument("--store", required=True, help="checkpoint store: a folder or s3://bucket/prefix")
    i.add_argument("--config", help="the run config whose requests should hit the imported answers")
    i.set_defaults(func=cmd_import_legacy)


def cmd_import_legacy(args: argparse.Namespace) -> int:
    report = import_legacy_files(
        args.raw, args.classified, args.store, config_path=args.config, cloze_path=args.cloze, tests_path=args.tests
    )
    print(report.describe(args.store))
    return 0
