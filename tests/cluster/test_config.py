"""Run configs: every mistake names the file and the key."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from punchline.cluster.config import load_config
from punchline.data.errors import ConfigError

GOOD = """
[run]
pipeline = "puns"

[providers.sim]
kind = "openai"
base_url = "simulated"

[puns]
jokes = "data/samples/puns_sample.json"
collect = { provider = "sim", models = ["m"] }
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "run.toml"
    p.write_text(text)
    return p


def test_a_good_config_loads(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, GOOD))
    assert cfg.run.pipeline == "puns" and cfg.settings is not None and cfg.settings.collect.samples == 20
    assert cfg.run.shard_size == 8 and cfg.run.lease_ms == 30_000


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        (GOOD.replace('pipeline = "puns"', 'pipeline = "puns"\nshard_sise = 3'), "run", "shard_sise"),
        (GOOD.replace('kind = "openai"', 'kind = "openai"\ntimeout = 3'), "providers.sim", "timeout"),
        (
            GOOD.replace('kind = "openai"', 'kind = "openai"\nmax_concurrency = "x"'),
            "providers.sim.max_concurrency",
            "Expected `int`",
        ),
        (GOOD.replace('jokes = "data/samples/puns_sample.json"\n', ""), "puns", "jokes"),
        (GOOD.replace('pipeline = "puns"', 'pipeline = "limericks"'), "run.pipeline", "limericks"),
        (GOOD.replace('provider = "sim"', 'provider = "together"'), "puns.collect.provider", "together"),
        (GOOD.replace('pipeline = "puns"', 'pipeline = "puns"\nlease_ms = 10'), "run.lease_ms", ">= 1000"),
        (GOOD.replace('pipeline = "puns"', 'pipeline = "humor"'), None, "no [humor] table"),
    ],
)
def test_mistakes_name_the_file_and_key(tmp_path: Path, text: str, field: str | None, words: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.file == str(path)
    assert info.value.field == field
    assert words in str(info.value)


def test_malformed_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="malformed TOML"):
        load_config(write(tmp_path, "[run\npipeline = 1"))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "nope.toml")


def test_humor_answers_may_be_256_tokens_long_by_default() -> None:
    from punchline.pipelines.humor.pipeline import HumorSettings

    assert HumorSettings(data="x.json", provider="p", models=["m"]).max_tokens == 256  # lm-eval's default


def test_a_stage_table_may_set_the_mode_of_its_units(tmp_path: Path) -> None:
    from punchline.cluster.run.executor import batch_mode, stage_providers

    text = GOOD.replace(
        'collect = { provider = "sim", models = ["m"] }',
        'collect = { provider = "sim", models = ["m"], mode = "batch" }',
    )
    text += 'classify = { provider = "sim", model = "m" }\n'
    text += 'evaluate = { provider = "sim", models = ["m"], mode = "online" }\n'
    cfg = load_config(write(tmp_path, text))
    assert [cfg.stage_mode(s) for s in ("collect", "classify", "rank", "evaluate")] == ["batch", None, None, "online"]
    # the stage's mode overrides the provider's (online here) for that stage's units only
    assert batch_mode(stage_providers(cfg.providers, cfg.stage_mode("collect")))
    assert not batch_mode(stage_providers(cfg.providers, cfg.stage_mode("classify")))
    assert cfg.providers["sim"].mode == "online"
    batch_provider = cfg.providers | {"sim": msgspec.structs.replace(cfg.providers["sim"], mode="batch")}
    assert not batch_mode(stage_providers(batch_provider, cfg.stage_mode("evaluate")))
    assert batch_mode(stage_providers(batch_provider, cfg.stage_mode("classify")))


def test_the_humor_tables_set_the_mode_of_generate_and_judge(tmp_path: Path) -> None:
    text = GOOD.replace('pipeline = "puns"', 'pipeline = "humor"') + (
        '[humor]\ndata = "x.json"\nprovider = "sim"\nmodels = ["m"]\nmode = "batch"\n'
        'judge = { provider = "sim", model = "m", mode = "online" }\n'
    )
    cfg = load_config(write(tmp_path, text))
    assert [cfg.stage_mode(s) for s in ("generate", "score", "judge", "collect")] == ["batch", None, "online", None]
