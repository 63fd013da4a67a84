"""import-legacy: upstream checkpoints land under the exact keys a puns run asks for, idempotently,
and the imported verdicts reproduce classified_completions.json byte for byte."""

from __future__ import annotations

import json
from pathlib import Path

from punchline.cluster.cli import main
from punchline.cluster.commands.providers import (
    UPSTREAM_CLASSIFY,
    UPSTREAM_MODELS,
    LegacyTargets,
    import_legacy,
    targets_from_config,
)
from punchline.data.classify import batches, classify_request, merge_all, parse_verdicts
from punchline.data.completions import greedy_request, sample_request, truncate_before_blank
from punchline.data.jsonio import decode_file, dumps_upstream
from punchline.data.response_cache import ResponseCache
from punchline.data.schemas import RawCompletions
from punchline.data.stores import open_store


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
    t = targets_from_config(str(cfg))
    assert (t.provider, t.models, t.samples) == ("tg", {"8b": "my/8b"}, 7)
    assert (t.classify_provider, t.classify_model, t.batch_size) == ("cl", "judge-1", 3)
