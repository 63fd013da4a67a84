"""import-legacy: upstream checkpoints land under the exact keys a puns run asks for, idempotently,
and the imported verdicts reproduce classified_completions.json byte for byte."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from punchline.cluster.cli.main import main
from punchline.cluster.config import load_config
from punchline.data.storage.jsonio import decode_file, dumps_upstream
from punchline.data.storage.response_cache import ResponseCache
from punchline.data.stores import open_store
from punchline.pipelines.puns.data.classify import batches, classify_request, merge_all, parse_verdicts
from punchline.pipelines.puns.data.completions import (
    build_raw_entry,
    greedy_request,
    sample_request,
    truncate_before_blank,
)
from punchline.pipelines.puns.data.schemas import RawCompletions
from punchline.pipelines.puns.legacy import (
    UPSTREAM_CLASSIFY,
    UPSTREAM_MODELS,
    LegacyTargets,
    import_legacy,
    targets_from_config,
)


def _head(src: Path, dst: Path, count: int) -> Path:
    """The first ``count`` jokes of an upstream checkpoint, written as upstream writes (keeps the test fast)."""
    data = json.loads(src.read_text())
    dst.write_text(json.dumps(dict(list(data.items())[:count]), indent=2))
    return dst


def test_import_legacy_keys_and_reproduction(shared_puns: Path, tmp_path: Path) -> None:
    raw_path = _head(shared_puns / "raw_completions.json", tmp_path / "raw.json", 25)
    classified_path = _head(shared_puns / "classified_completions.json", tmp_path / "classified.json", 25)
    store = tmp_path / "store"
    assert (
        main(["import-legacy", "--raw", str(raw_path), "--classified", str(classified_path), "--store", str(store)])
        == 0
    )

    raw: RawCompletions = decode_file(raw_path, RawCompletions)
    cache = ResponseCache(open_store(str(store)))
    entry = raw["0"]
    prompt = truncate_before_blank(entry.sentence)
    for nick, model_id in UPSTREAM_MODELS.items():
        got = cache.get(sample_request("together", model_id, prompt).key())
        assert got is not None and got.source == "legacy-import"
        assert got.response.texts == entry.models[nick].samples
        greedy = cache.get(greedy_request("together", model_id, prompt).key())
        assert greedy is not None and greedy.response.texts == [entry.models[nick].greedy]

    verdicts: dict = {}
    assert len(batches(list(raw.values()))) >= 2
    for batch in batches(list(raw.values())):
        hit = cache.get(classify_request(*UPSTREAM_CLASSIFY, batch).key())
        assert hit is not None
        verdicts.update(parse_verdicts(hit.response.texts[0]))
    assert dumps_upstream(merge_all(raw, verdicts)) == classified_path.read_text()

    again = import_legacy(str(raw_path), None, str(store), LegacyTargets())
    assert again.written == 0 and again.already_cached == len(raw) * len(UPSTREAM_MODELS) * 2


def test_targets_follow_the_run_config(tmp_path: Path) -> None:
    cfg = tmp_path / "run.toml"
    cfg.write_text(
        '[run]\npipeline = "puns"\n\n'
        '[providers.tg]\nkind = "openai"\nbase_url = "simulated"\n'
        '[providers.tg.models]\n"8b" = { id = "my/8b" }\n\n'
        '[providers.cl]\nkind = "anthropic"\n[providers.cl.models]\nj = { id = "judge-1" }\n\n'
        '[puns]\njokes = "x.json"\n'
        'collect = { provider = "tg", models = ["8b"], samples = 7 }\n'
        'classify = { provider = "cl", model = "j", batch_size = 3 }\n'
    )
    t = targets_from_config(load_config(cfg))
    assert (t.provider, t.models, t.samples) == ("tg", {"8b": "my/8b"}, 7)
    assert (t.classify_provider, t.classify_model, t.batch_size) == ("cl", "judge-1", 3)


# --- cloze answers, and classify prompts built from the run's own lists -----------------------------


def _cloze_answers(tests: list, words: dict[str, list[str]]) -> dict:
    """A cloze_benchmark_raw.json in upstream's layout: answers keyed by the test's position."""
    from punchline.pipelines.puns.data.words import extract_word

    return {
        nick: {
            "model_id": UPSTREAM_MODELS[nick],
            "responses": {
                str(i): {
                    "pair_id": t.pair_id,
                    "type": t.type,
                    "raw_response": said[i % len(said)],
                    "extracted_word": extract_word(said[i % len(said)]),
                }
                for i, t in enumerate(tests)
            },
        }
        for nick, said in words.items()
    }


def test_cloze_answers_land_under_the_cloze_requests_of_their_tests(shared_puns: Path, tmp_path: Path) -> None:
    from punchline.pipelines.puns.data.cloze import build_tests
    from punchline.pipelines.puns.data.cloze_run import cloze_request
    from punchline.pipelines.puns.data.puns_io import dump_cloze_tests, load_puns

    tests = build_tests(load_puns(shared_puns / "puns_205.json"))
    tests_path = tmp_path / "tests.json"
    dump_cloze_tests(tests_path, tests)
    said = {"70b": ["Schooled", "under pressure", "cliché"], "405b": ["toast", ""]}
    answers = _cloze_answers(tests, said)
    answers["405b"]["responses"]["3"]["extracted_word"] = "toasted"  # recorded differently from the text
    cloze_path = tmp_path / "cloze_benchmark_raw.json"
    cloze_path.write_text(json.dumps(answers, indent=2))
    store = tmp_path / "store"

    argv = ["import-legacy", "--cloze", str(cloze_path), "--tests", str(tests_path), "--store", str(store)]
    assert main(argv) == 0
    cache = ResponseCache(open_store(str(store)))
    for nick, words in said.items():
        for i, test in enumerate(tests):
            hit = cache.get(cloze_request("together", UPSTREAM_MODELS[nick], test).key())
            assert hit is not None and hit.source == "legacy-import"
            assert hit.response.texts == [words[i % len(words)]]
    again = import_legacy(
        None, None, str(store), LegacyTargets(), cloze_path=str(cloze_path), tests_path=str(tests_path)
    )
    assert (again.cloze_answers, again.written, again.already_cached) == (200, 0, 200)
    assert again.cloze_words_differ == 1 and again.empty_answers == 50


def test_cloze_answers_that_do_not_match_their_tests_are_refused(
    shared_puns: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from punchline.pipelines.puns.data.cloze import build_tests
    from punchline.pipelines.puns.data.puns_io import dump_cloze_tests, load_puns

    tests = build_tests(load_puns(shared_puns / "puns_205.json"))
    tests_path = tmp_path / "tests.json"
    dump_cloze_tests(tests_path, tests)
    answers = _cloze_answers(tests, {"8b": ["speech"]})
    answers["8b"]["responses"]["4"]["type"] = "funny"  # test 4 is pair 2, straight
    cloze_path = tmp_path / "cloze.json"
    cloze_path.write_text(json.dumps(answers))
    store = tmp_path / "store"
    argv = ["import-legacy", "--cloze", str(cloze_path), "--tests", str(tests_path), "--store", str(store)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "cloze.json" in err and "'8b'" in err and "response '4'" in err and "Traceback" not in err
    assert not (store / "_cache").exists()  # validated before anything was written
    assert main(["import-legacy", "--cloze", str(cloze_path), "--store", str(store)]) == 2
    assert "--cloze needs --tests" in capsys.readouterr().err


def test_with_a_config_the_classify_prompts_are_built_from_the_runs_lists(shared_puns: Path, tmp_path: Path) -> None:
    from punchline.pipelines.puns.pipeline import run_jokes

    count = 25
    raw_path = _head(shared_puns / "raw_completions.json", tmp_path / "raw.json", count)
    classified_path = _head(shared_puns / "classified_completions.json", tmp_path / "classified.json", count)
    jokes = json.loads((shared_puns / "puns_205.json").read_text())[:count]
    (tmp_path / "jokes.json").write_text(json.dumps(jokes, indent=2))
    cfg = tmp_path / "run.toml"
    cfg.write_text(
        '[run]\npipeline = "puns"\n\n'
        '[providers.together]\nkind = "openai"\n[providers.together.models]\n'
        + "".join(f'"{nick}" = {{ id = "{mid}" }}\n' for nick, mid in UPSTREAM_MODELS.items())
        + '\n[providers.anthropic]\nkind = "anthropic"\n[providers.anthropic.models]\n'
        f'sonnet = {{ id = "{UPSTREAM_CLASSIFY[1]}" }}\n\n'
        '[puns]\njokes = "jokes.json"\nlists_at_classification = "classified.json"\n'
        f'collect = {{ provider = "together", models = {json.dumps(list(UPSTREAM_MODELS))}, samples = 20 }}\n'
        'classify = { provider = "anthropic", model = "sonnet", batch_size = 10 }\n'
    )
    store = tmp_path / "store"
    argv = ["import-legacy", "--raw", str(raw_path), "--classified", str(classified_path), "--store", str(store)]
    assert main([*argv, "--config", str(cfg)]) == 0

    raw: RawCompletions = decode_file(raw_path, RawCompletions)
    run_raw = {str(j.index): build_raw_entry(j, raw[str(j.index)].models) for j in run_jokes(load_config(cfg))}
    cache = ResponseCache(open_store(str(store)))
    verdicts: dict = {}
    for batch in batches(list(run_raw.values())):
        hit = cache.get(classify_request(*UPSTREAM_CLASSIFY, batch).key())
        assert hit is not None, "a classify prompt of the run has no imported verdicts"
        verdicts.update(parse_verdicts(hit.response.texts[0]))
    merged = merge_all(run_raw, verdicts)
    upstream = json.loads(classified_path.read_text())
    assert {k: e.classifications for k, e in merged.items()} == {k: e["classifications"] for k, e in upstream.items()}
    # upstream's own prompts (its recorded lists) are different requests: they would all miss
    upstream_keys = {classify_request(*UPSTREAM_CLASSIFY, b).key() for b in batches(list(raw.values()))}
    run_keys = {classify_request(*UPSTREAM_CLASSIFY, b).key() for b in batches(list(run_raw.values()))}
    assert not upstream_keys & run_keys
