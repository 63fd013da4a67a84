"""What a run config is: the msgspec Structs a config file decodes into, and where its relative paths point.

Apart from :mod:`punchline.cluster.config`, which reads and checks a file (through the pipeline registry), so
that the :class:`~punchline.cluster.pipeline.Pipeline` protocol, whose methods are handed a :class:`RunConfig`,
sits above this module and below the loader: no import circle, not even a type-only one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import msgspec

from punchline.data.errors import ConfigError
from punchline.data.provider_settings import Mode, ProviderSettings
from punchline.data.simulator import FakeConfig

# Ranges checked when the file is read, so a bad value stops the run before anything starts.
# ``le`` bounds also refuse ``inf``; NaN fails every comparison, so it is refused too.
Count = Annotated[int, msgspec.Meta(ge=1, le=1_000_000)]
NonNegative = Annotated[int, msgspec.Meta(ge=0, le=1_000_000)]
Usd = Annotated[float, msgspec.Meta(ge=0.0, le=1e9)]
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
Names = Annotated[list[Name], msgspec.Meta(min_length=1)]
RUN_NAME = r"^([A-Za-z0-9][A-Za-z0-9._-]{0,63})?$"


class RunSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """How the engine runs: sharding, leases and budget. Every field has a safe default."""

    pipeline: Annotated[
        str,
        msgspec.Meta(
            min_length=1,
            max_length=300,
            description='a built-in or installed pipeline\'s name, or "package.module:Name" (cluster/registry.py)',
        ),
    ]
    name: Annotated[
        str, msgspec.Meta(pattern=RUN_NAME, description="the start of new run ids (default: the pipeline's)")
    ] = ""
    shard_size: Annotated[int, msgspec.Meta(ge=1, le=100_000, description="units per shard")] = 8
    lease_ms: Annotated[
        int, msgspec.Meta(ge=1000, le=86_400_000, description="a unit's lease; a holder silent this long loses it")
    ] = 30_000
    workers_per_node: Annotated[int, msgspec.Meta(ge=1, le=1024, description="worker actors on every node")] = 2
    units_in_flight: Annotated[
        int,
        msgspec.Meta(
            ge=0,
            le=100_000,
            description="calls a worker has in flight at once, across shards (0: its providers' max_concurrency)",
        ),
    ] = 0
    worker_cpus: Annotated[float, msgspec.Meta(gt=0.0, le=1024.0, description="Ray CPUs one worker actor takes")] = 0.25
    max_workers: Annotated[
        int,
        msgspec.Meta(
            ge=0,
            le=100_000,
            description="worker nodes to ask the autoscaler for while shards outnumber workers (0: never)",
        ),
    ] = 0
    max_cost_usd: Annotated[
        Usd | None, msgspec.Meta(description="stop scheduling units before this budget would be exceeded")
    ] = None
    offline: Annotated[bool, msgspec.Meta(description="never call a provider: a cache miss fails the unit")] = False
    store: Annotated[
        str | None, msgspec.Meta(description="a folder or s3://bucket/prefix (under --store and PUNCHLINE_STORE)")
    ] = None
    redis_url: Annotated[
        str | None, msgspec.Meta(description="the ledger's Redis (under --redis-url and PUNCHLINE_REDIS_URL)")
    ] = None
    ray_address: Annotated[
        str | None, msgspec.Meta(description="the Ray cluster to join (under --ray-address and PUNCHLINE_RAY_ADDRESS)")
    ] = None


class RunConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A run's config: the engine's tables, and the pipeline's own table decoded into its ``settings_type``."""

    run: Annotated[RunSettings, msgspec.Meta(description="how the engine runs")]
    providers: Annotated[dict[str, ProviderSettings], msgspec.Meta(description="the providers, one table each")]
    simulator: Annotated[
        FakeConfig | None, msgspec.Meta(description='knobs of the simulated provider (base_url = "simulated")')
    ] = None
    source: str = ""  # the file it was read from (filled by load_config)
    settings: Any = None  # the pipeline's table as its settings_type (filled by load_config)
    # the Pipeline ``run.pipeline`` names, as load_config resolved it: asked for its stages' modes. Typed Any: the
    # Pipeline protocol names this module (its methods take a RunConfig), so this module cannot name it back
    resolved_pipeline: Any = None

    def stage_mode(self, stage: str) -> Mode | None:
        """The ``mode`` a stage's own table sets, which overrides its providers' ``mode`` for that stage's
        units; None where the table says nothing (or the stage has no table of its own)."""
        if self.resolved_pipeline is None:
            raise ValueError(f"this config of {self.run.pipeline!r} was not made by load_config: no pipeline to ask")
        mode: Mode | None = self.resolved_pipeline.stage_mode(self.settings, stage)
        return mode

    def provider(self, name: str) -> ProviderSettings:
        try:
            return self.providers[name]
        except KeyError:
            raise ConfigError(
                f"unknown provider {name!r}; configured: {sorted(self.providers)}", file=self.source, field="provider"
            ) from None


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
