"""``punchline puns validate | rank | cloze | cloze-report``: the deterministic Puns stages.

These run offline on files (no providers, no cluster): they rebuild the published artifacts from
the checkpoints, and score cloze answers. Every input is validated before anything is written, so a
bad file ends with one clear error naming the file, the record and the field, and ``--out`` is left
as it was.
"""

from __future__ import annotations

import argparse
from typing import Any

from punchline.data import puns_io


def register(sub: Any) -> None:
    puns = sub.add_parser(
        "puns",
        help="Puns 205: validate, rank (tiers), build cloze tests, score cloze answers",
        description="Offline stages of the Puns 205 pipeline. Files use the upstream JSON shapes "
        "(puns_205.json, classified_completions.json, contextual_cloze_tests_100.json) and are written "
        "byte-compatible with them (json indent=2), atomically.",
    )
    ps = puns.add_subparsers(dest="puns_command", metavar="SUBCOMMAND")
    ps.required = True

    v = ps.add_parser(
        "validate",
        help="check a puns file (exactly one ___, non-empty word lists, unique indices, known tiers)",
        description="Load a puns file the way every stage does and print its size and tier counts.",
    )
    v.add_argument("puns", help="puns file, e.g. puns_205.json or data/samples/puns_sample.json")
    v.set_defaults(func=cmd_validate)

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

    s = ps.add_parser(
        "cloze-report",
        help="score cloze answers: straight/funny/other rates per model and priming context",
        description="Classify each answer against the target joke's straight/punny lists (equal to an "
        "entry or its first word, lowercased; straight first) and report the funny-rate shift "
        "(funny-primed minus straight-primed, in percentage points). Writes report.json, report.md, "
        "context_effect.png and funny_shift.png into --out.",
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


def cmd_validate(args: argparse.Namespace) -> int:
    from punchline.data.tiers import tier_counts

    puns = puns_io.load_puns(args.puns)
    counts = tier_counts(puns)
    ranked = sum(counts.values())
    print(f"{args.puns}: {len(puns)} jokes, all valid")
    if ranked:
        print("  tiers: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return 0


def cmd_rank(args: argparse.Namespace) -> int:
    from punchline.data.tiers import apply_rankings, rank, tier_counts

    out = puns_io.out_path(args.out)
    plot = puns_io.out_path(args.plot) if args.plot else None
    puns = puns_io.load_puns(args.puns)
    classified = puns_io.load_classified(args.classified)
    ranked = apply_rankings(puns, rank(classified), file=args.classified)
    puns_io.dump_puns(out, ranked)
    counts = tier_counts(ranked)
    print(f"wrote {out}: {len(ranked)} jokes; " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    if plot is not None:
        from punchline.data.jsonio import atomic_write_bytes
        from punchline.data.plots import plot_tiers

        atomic_write_bytes(plot, plot_tiers(ranked))
        print(f"wrote {plot}")
    return 0


def cmd_cloze(args: argparse.Namespace) -> int:
    from punchline.data.cloze import build_tests
    from punchline.data.errors import InputError

    if not 1 <= args.pairs <= 100_000:
        raise InputError(f"must be between 1 and 100000, got {args.pairs}", field="--pairs")
    if args.seed < 0:
        raise InputError(f"must be >= 0, got {args.seed}", field="--seed")
    out = puns_io.out_path(args.out)
    puns = puns_io.load_puns(args.puns)
    tests = build_tests(puns, seed=args.seed, pairs=args.pairs, file=args.puns)
    puns_io.dump_cloze_tests(out, tests)
    print(f"wrote {out}: {len(tests)} tests ({args.pairs} pairs, seed {args.seed})")
    return 0


def cmd_cloze_report(args: argparse.Namespace) -> int:
    from punchline.data.cloze_report import build_report, to_markdown, write_report
    from punchline.data.jsonio import check_out_dir

    check_out_dir(args.out)
    puns = puns_io.load_puns(args.puns)
    tests = puns_io.load_cloze_tests(args.tests, puns, puns_file=args.puns)
    responses = puns_io.load_cloze_responses(args.responses, tests)
    report = build_report(responses, tests, puns, file=args.responses)
    paths = write_report(report, args.out)
    print(to_markdown(report), end="")
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0
