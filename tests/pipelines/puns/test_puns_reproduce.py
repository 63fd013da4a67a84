"""``punchline puns reproduce``: the Puns study from upstream's recorded outputs, offline.

The recorded cloze answers (upstream's cloze_benchmark_raw.json) are optional: a copy of upstream may
or may not hold them. The tests cover both cases honestly: a folder holding only the three checkpoints
(linked from the shared files) reproduces tiers and cloze tests and says the table is missing; the
shared folder with its recorded answers (or, in a copy without them, answers generated in upstream's
layout) reproduces the context-effect table docs/pipelines/puns.md states.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import msgspec
import pytest

from punchline.cluster.cli.main import main
from punchline.cluster.config import load_config
from punchline.data.errors import InputError
from punchline.pipelines.puns.commands import render_reproduction
from punchline.pipelines.puns.data.cloze_report import build_report, classify_word
from punchline.pipelines.puns.data.puns_history import (
    PUBLISHED_DELTA_PP,
    PUBLISHED_TIERS,
    RemovedWord,
    is_published_selection,
    lists_as_classified,
)
from punchline.pipelines.puns.data.puns_io import load_classified, load_cloze_responses, load_cloze_tests, load_puns
from punchline.pipelines.puns.data.schemas import ClozeTest, PunEntry
from punchline.pipelines.puns.data.words import extract_word
from punchline.pipelines.puns.reproduce import (
    ModelShift,
    Reproduction,
    UpstreamFiles,
    find_upstream,
    reproduce_config_text,
    toml_text,
)
from punchline.workers.fake.server import FakeProviderServer

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "configs" / "puns_reproduce.toml"


# --- the config ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "configs").glob("*.toml")))
def test_toml_text_round_trips_every_shipped_config(name: str) -> None:
    tables = msgspec.toml.decode((ROOT / "configs" / name).read_bytes(), type=dict[str, Any])
    assert msgspec.toml.decode(toml_text(tables).encode(), type=dict[str, Any]) == tables


def test_shipped_config_runs_the_study_on_the_documented_layout(shared_puns: Path) -> None:
    cfg = load_config(CONFIG)
    assert cfg.settings is not None and cfg.settings.evaluate is not None and cfg.settings.cloze is not None
    assert cfg.run.offline and (cfg.settings.cloze.pairs, cfg.settings.cloze.seed) == (50, 42)
    here = CONFIG.parent
    assert (here / cfg.settings.jokes).resolve() == (shared_puns / "puns_205.json").resolve()
    assert (here / str(cfg.settings.lists_at_classification)).resolve() == (
        shared_puns / "classified_completions.json"
    ).resolve()
    assert (here / str(cfg.settings.evaluate.score_against)).resolve() == (shared_puns / "puns_205.json").resolve()
    assert all(p.api_key_env is None and p.api_key_file is None for p in cfg.providers.values())  # no key needed


def _checkpoints_only(shared_puns: Path, folder: Path) -> Path:
    """An upstream folder with the three checkpoints and no recorded cloze answers (links, no copies)."""
    folder.mkdir()
    for name in ("puns_205.json", "raw_completions.json", "classified_completions.json"):
        (folder / name).symlink_to(shared_puns / name)
    return folder


def test_effective_config_points_at_the_upstream_folder(shared_puns: Path, tmp_path: Path) -> None:
    upstream = find_upstream(str(_checkpoints_only(shared_puns, tmp_path / "up")))
    text = reproduce_config_text(str(CONFIG), upstream)
    (tmp_path / "r.toml").write_text(text)
    cfg = load_config(tmp_path / "r.toml")
    assert cfg.settings is not None and cfg.run.offline
    assert (cfg.settings.jokes, cfg.settings.lists_at_classification) == (upstream.puns, upstream.classified)
    assert cfg.settings.evaluate is None  # no recorded cloze answers: nothing to evaluate
    with_cloze = msgspec.structs.replace(upstream, cloze_answers=str(tmp_path / "c.json"))
    (tmp_path / "c.toml").write_text(reproduce_config_text(str(CONFIG), with_cloze))
    cfg = load_config(tmp_path / "c.toml")
    assert cfg.settings is not None and cfg.settings.evaluate is not None
    assert cfg.settings.evaluate.score_against == upstream.puns


def test_upstream_files_are_found_or_named(shared_puns: Path, tmp_path: Path) -> None:
    found = find_upstream(str(_checkpoints_only(shared_puns, tmp_path / "up")))
    assert Path(found.raw).name == "raw_completions.json" and found.cloze_answers is None
    shared = find_upstream(str(shared_puns))
    recorded = shared_puns / "cloze_benchmark_raw.json"
    assert shared.cloze_answers == (str(recorded.resolve()) if recorded.is_file() else None)
    tmp_path = tmp_path / "other"
    tmp_path.mkdir()
    (tmp_path / "results").mkdir()
    for name in ("puns_205.json", "raw_completions.json"):
        (tmp_path / name).write_text("[]")
    with pytest.raises(InputError, match=r"missing classified_completions\.json"):
        find_upstream(str(tmp_path))
    (tmp_path / "classified_completions.json").write_text("{}")
    (tmp_path / "results" / "cloze_benchmark_raw.json").write_text("{}")
    assert find_upstream(str(tmp_path)).cloze_answers == str(tmp_path / "results" / "cloze_benchmark_raw.json")
    with pytest.raises(InputError, match="no such file"):
        find_upstream(str(tmp_path), cloze=str(tmp_path / "nope.json"))


def test_bad_upstream_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["puns", "reproduce", "--upstream", str(tmp_path / "nope"), "--runs-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nope" in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())  # nothing started, nothing written


def test_cloze_answers_that_do_not_fit_stop_before_anything_is_written(
    shared_puns: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    answer = {"pair_id": 3, "type": "straight", "raw_response": "a", "extracted_word": "a"}  # test 0 is pair 0
    bad = {"3b": {"model_id": "x", "responses": {"0": answer}}}
    cloze = tmp_path / "cloze.json"
    cloze.write_text(json.dumps(bad))
    runs = tmp_path / "runs"
    argv = ["puns", "reproduce", "--upstream", str(shared_puns), "--cloze", str(cloze), "--runs-dir", str(runs)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "cloze.json" in err and "response '0'" in err and "pair_id" in err and "Traceback" not in err
    assert not runs.exists()


def _reproduction(**changes: Any) -> Reproduction:
    base = Reproduction(
        state="finished",
        provider_calls=0,
        units=2569,
        cache_hits=2569,
        removed_words=[RemovedWord(19, "record", "punny")],
        tiers=dict(PUBLISHED_TIERS),
        tiers_match=True,
        tests=100,
        tests_match=True,
        published_file=None,
        shifts=[ModelShift(n, 0.1, 0.1 + pp / 100, pp, pp) for n, pp in PUBLISHED_DELTA_PP.items()],
        table_match=True,
    )
    return msgspec.structs.replace(base, **changes)


def test_the_summary_says_what_differs_and_what_is_missing() -> None:
    upstream = UpstreamFiles(folder="/up", puns="/up/p", raw="/up/r", classified="/up/c")
    ok = render_reproduction(_reproduction(), upstream)
    assert "DIFFERENT" not in ok and "context-effect table as published" in ok and "| 405b |" in ok
    assert _reproduction().matches
    tiers = _reproduction(tiers={**PUBLISHED_TIERS, "leaning": 53}, tiers_match=False)
    tiers_line = next(x for x in render_reproduction(tiers, upstream).splitlines() if x.startswith("- tiers:"))
    assert "leaning 53" in tiers_line and tiers_line.endswith("— DIFFERENT from the publication")
    assert not tiers.matches
    missing = _reproduction(shifts=[], table_match=None)
    text = render_reproduction(missing, upstream)
    assert "context effect: NOT reproduced" in text and "--cloze" in text and "/up" in text
    assert missing.matches and not missing.complete  # what could be checked matches; the table is missing


# --- end to end ---------------------------------------------------------------------------------------


def _answers_with_the_published_counts(tests: list[ClozeTest], puns: list[PunEntry], removed: set) -> dict:
    """A cloze_benchmark_raw.json in upstream's layout whose answers, scored against today's lists, have
    the published counts per model and context (EXPERIMENTS.md: straight / funny / other out of 50).
    Funny answers prefer a word upstream's classifier called "other" (it counts as funny only against
    today's lists, so the table depends on scoring against them)."""
    counts = {  # (straight, funny, other) for straight-primed, then funny-primed tests
        "3b": ((40, 0, 10), (38, 1, 11)),
        "8b": ((37, 4, 9), (31, 5, 14)),
        "70b": ((37, 7, 6), (18, 26, 6)),
        "3.3-70b": ((37, 7, 6), (21, 25, 4)),
        "405b": ((35, 11, 4), (13, 32, 5)),
    }
    by_index = {p.index: p for p in puns}
    rng = random.Random(5)
    out: dict = {}
    for nick, per_context in counts.items():
        responses = {}
        for ctx, (n_straight, n_funny, n_other) in zip(("straight", "funny"), per_context, strict=True):
            positions = [i for i, t in enumerate(tests) if t.type == ctx]
            kinds = ["straight"] * n_straight + ["funny"] * n_funny + ["other"] * n_other
            rng.shuffle(kinds)
            for i, kind in zip(positions, kinds, strict=True):
                joke = by_index[tests[i].joke_c_index]
                if kind == "straight":
                    word = joke.straight[0]
                elif kind == "funny":
                    late = [w for w in joke.punny if (joke.index, w) in removed]
                    word = (late or [w for w in joke.punny if classify_word(w, joke.straight, joke.punny) == "funny"])[
                        0
                    ]
                else:
                    word = "Zzyzx!"
                responses[str(i)] = {
                    "pair_id": tests[i].pair_id,
                    "type": ctx,
                    "raw_response": word,
                    "extracted_word": extract_word(word),
                }
        out[nick] = {"model_id": nick, "responses": dict(sorted(responses.items(), key=lambda kv: int(kv[0])))}
    return out


@pytest.mark.slow
def test_reproduce_command_end_to_end(
    tmp_path: Path,
    shared_puns: Path,
    fake: FakeProviderServer,
    redis_url: str,
    ray_local: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # the shipped config, its providers pointed at the fake so that any call would be seen
    config = tmp_path / "study.toml"
    config.write_text(
        CONFIG.read_text()
        .replace("https://api.together.xyz/v1", fake.openai_base_url)
        .replace("https://api.anthropic.com", fake.anthropic_base_url)
    )
    runs = tmp_path / "runs"
    opts = ["--config", str(config), "--runs-dir", str(runs), "--redis-url", redis_url, "--no-progress"]

    # 1. what the three checkpoints allow: tiers and cloze tests
    checkpoints = _checkpoints_only(shared_puns, tmp_path / "up")
    assert main(["puns", "reproduce", "--upstream", str(checkpoints), *opts]) == 0
    out = capsys.readouterr().out
    assert "0 provider calls; 2069 of 2069 answers replayed" in out
    assert "24 words removed from 16 jokes' lists" in out
    assert "tiers: balanced 42, leaning 51, funny_dominated 24, straight_dominated 88 — as published" in out
    assert "cloze tests: 100; jokes, order, prompts, tiers and balances as published" in out
    assert "context effect: NOT reproduced" in out
    assert fake.stats().total_calls == 0
    (first,) = runs.glob("puns-reproduce-*/artifacts/contextual_cloze_tests.json")
    tests = load_cloze_tests(first)
    assert is_published_selection(tests)

    # 2. with recorded cloze answers: upstream's own when the shared folder holds them (found there
    # without --cloze), else answers generated here in upstream's layout with the published counts
    puns = load_puns(shared_puns / "puns_205.json")
    recorded = shared_puns / "cloze_benchmark_raw.json"
    if recorded.is_file():
        answers = json.loads(recorded.read_text())
        given: list[str] = []
    else:
        _, removed = lists_as_classified(puns, load_classified(shared_puns / "classified_completions.json"))
        answers = _answers_with_the_published_counts(tests, puns, {(r.index, r.word) for r in removed})
        cloze = tmp_path / "cloze_benchmark_raw.json"
        cloze.write_text(json.dumps(answers, indent=2))
        given = ["--cloze", str(cloze)]
    assert main(["puns", "reproduce", "--upstream", str(shared_puns), *given, *opts]) == 0
    out = capsys.readouterr().out
    assert "0 provider calls; 2569 of 2569 answers replayed" in out and "500 cloze answers" in out
    for nick, pp in PUBLISHED_DELTA_PP.items():
        assert f"{pp:+.1f} | {pp:+.0f} |" in next(line for line in out.splitlines() if line.startswith(f"| {nick} |"))
    assert "context-effect table as published" in out
    assert fake.stats().total_calls == 0

    # the run's own answers are the recorded ones, scored against today's lists (not the run's)
    (second,) = [p for p in runs.glob("puns-reproduce-*/artifacts/cloze_responses.json")]
    replayed = load_cloze_responses(second, tests)
    assert {n: {k: r.raw_response for k, r in m.responses.items()} for n, m in replayed.items()} == {
        n: {k: r["raw_response"] for k, r in m["responses"].items()} for n, m in answers.items()
    }
    direct = build_report(replayed, tests, puns)
    assert {n: m.delta_funny_pp for n, m in direct.models.items()} == PUBLISHED_DELTA_PP
    ranked = msgspec.json.decode((second.parent / "puns_ranked.json").read_bytes(), type=list[PunEntry])
    assert build_report(replayed, tests, ranked).models != direct.models  # the run's own lists give another table
