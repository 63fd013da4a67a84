"""Run configuration: a TOML file decoded into msgspec Structs.

Unknown or missing keys are errors that name the file and the key path, so a typo in a 100-node
submission fails on the laptop before anything is scheduled.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import msgspec

from punchline.data.errors import ConfigError
from punchline.data.humor.prompts import ANSWER_MAX_TOKENS
from punchline.data.jsonio import validation_location
from punchline.data.provider_settings import ProviderSettings
from punchline.workers.fake.server import FakeConfig

SIMULATED = "simulated"  # a provider base_url that makes the driver start the fake provider itself


class RunSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """How the engine runs: sharding, leases and budget. Every field has a safe default."""

    pipeline: Literal["puns", "humor", "curate"]
    name: str = ""
    shard_size: int = 8
    lease_ms: int = 30_000
    workers_per_node: int = 2
    units_in_flight: int = 0  # units a worker runs at once, across shards; 0 = its providers' max_concurrency
    worker_cpus: float = 0.25
    max_workers: int = 0  # worker nodes to ask the autoscaler for while shards outnumber workers (0: never)
    max_cost_usd: float | None = None
    offline: bool = False
    store: str | None = None
    redis_url: str | None = None
    ray_address: str | None = None


class CollectSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    provider: str
    models: list[str]
    samples: int = 20


class ClassifySettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    provider: str
    model: str
    batch_size: int = 10


class ClozeSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pairs: int = 50
    seed: int = 42


class EvaluateSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    provider: str
    models: list[str]
    # score the answers against this puns file's lists instead of the run's own (upstream's analysis
    # scored against the lists of its day, which had grown since classification)
    score_against: str | None = None


class PunsSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The Puns 205 workflow: collect -> classify -> rank -> cloze -> evaluate."""

    jokes: str
    # a classified_completions.json: drop from the jokes' lists every word it calls "other", i.e. use
    # the lists as they were when it was made (data/puns_history.py)
    lists_at_classification: str | None = None
    collect: CollectSettings
    classify: ClassifySettings | None = None
    cloze: ClozeSettings | None = None
    evaluate: EvaluateSettings | None = None


class JudgeSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    provider: str
    model: str


class HumorSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The Humor (MERA) workflow: generate -> score (exact match) -> judge."""

    data: str
    provider: str
    models: list[str]
    shots: str | None = None
    k_shot: int = 0
    max_tokens: int = ANSWER_MAX_TOKENS  # 256, lm-eval's default for generation
    judge: JudgeSettings | None = None


class ModelRef(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    provider: str
    model: str


class CurateSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Puns stages 1-2: rate candidate jokes with several providers, repair the weak ones, build the set.

    ``raters`` maps a rating field's prefix (``gemini`` -> ``gemini_rating``) to the model that rates.
    """

    jokes: str
    raters: dict[str, ModelRef]
    repair: ModelRef | None = None
    repair_below: float = 7.0
    top: int = 205
    batch_size: int = 10
    consensus: list[str] = msgspec.field(default_factory=lambda: ["gemini", "claudecode"])  # summed
    tie_break: str = "anthropic"  # rater whose score breaks consensus ties (then sentence length)


class RunConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    run: RunSettings
    providers: dict[str, ProviderSettings]
    puns: PunsSettings | None = None
    humor: HumorSettings | None = None
    curate: CurateSettings | None = None
    simulator: FakeConfig | None = None  # knobs of the offline simulated provider (base_url = "simulated")
    source: str = ""  # the file it was read from (filled by load_config)

    def provider(self, name: str) -> ProviderSettings:
        try:
            return self.providers[name]
        except KeyError:
            raise ConfigError(
                f"unknown provider {name!r}; configured: {sorted(self.providers)}", file=self.source, field="provider"
            ) from None


def load_config(path: str | os.PathLike[str]) -> RunConfig:
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config: {exc.strerror}", file=str(p)) from None
    try:
        tables = msgspec.toml.decode(raw, type=dict[str, Any])
    except msgspec.DecodeError as exc:
        raise ConfigError(f"malformed TOML: {exc}", file=str(p)) from None
    # provider tables one by one: msgspec does not name dict keys in its error paths
    providers = tables.get("providers")
    for name, table in providers.items() if isinstance(providers, dict) else ():
        try:
            msgspec.convert(table, ProviderSettings)
        except msgspec.ValidationError as exc:
            record, key, detail = validation_location(exc)
            field = ".".join(k for k in ("providers", name, record, key) if k)
            raise ConfigError(detail, file=str(p), field=field) from None
    try:
        cfg = msgspec.convert(tables, RunConfig)
    except msgspec.ValidationError as exc:
        table, key, detail = validation_location(exc)  # $.run.pipeline -> table "run", key "pipeline"
        raise ConfigError(detail, file=str(p), field=".".join(k for k in (table, key) if k) or None) from None
    cfg.source = str(p)
    _check(cfg)
    return cfg


def _check(cfg: RunConfig) -> None:
    section = getattr(cfg, cfg.run.pipeline)
    if section is None:
        raise ConfigError(
            f"run.pipeline is {cfg.run.pipeline!r} but there is no [{cfg.run.pipeline}] table", file=cfg.source
        )
    if cfg.run.units_in_flight < 0:
        raise ConfigError(
            "must be >= 0 (0: the providers' max_concurrency)", file=cfg.source, field="run.units_in_flight"
        )
    if cfg.run.shard_size < 1:
        raise ConfigError("must be >= 1", file=cfg.source, field="run.shard_size")
    if cfg.run.lease_ms < 1000:
        raise ConfigError(
            "must be >= 1000 (a lease shorter than a provider call expires mid-call)",
            file=cfg.source,
            field="run.lease_ms",
        )
    names: list[tuple[str, str]] = []
    if cfg.puns:
        names.append(("puns.collect.provider", cfg.puns.collect.provider))
        if cfg.puns.classify:
            names.append(("puns.classify.provider", cfg.puns.classify.provider))
        if cfg.puns.evaluate:
            names.append(("puns.evaluate.provider", cfg.puns.evaluate.provider))
    if cfg.curate:
        for rater, ref in cfg.curate.raters.items():
            names.append((f"curate.raters.{rater}.provider", ref.provider))
        if cfg.curate.repair:
            names.append(("curate.repair.provider", cfg.curate.repair.provider))
    if cfg.humor:
        names.append(("humor.provider", cfg.humor.provider))
        if cfg.humor.judge:
            names.append(("humor.judge.provider", cfg.humor.judge.provider))
    for field, name in names:
        if name not in cfg.providers:
            raise ConfigError(
                f"unknown provider {name!r}; configured: {sorted(cfg.providers)}", file=cfg.source, field=field
            )


def resolve_path(cfg: RunConfig, value: str) -> Path:
    """A relative data path in a config is relative to the config file's folder (so a run does not
    depend on where it was started from); a path that exists only relative to the working directory
    is still accepted, for configs written before that rule."""
    p = Path(value).expanduser()
    if p.is_absolute():
        return p
    beside = Path(cfg.source).parent / p if cfg.source else p
    if beside.exists() or not p.exists():
        return beside
    return p
