"""What a pipeline is made of: stages that expand into units, shards of units, and reduce steps.

A stage's ``plan`` is a pure function of the config and earlier stages' artifacts, so a resumed
run (or another node) computes exactly the same units and the same shard boundaries; a stage's
``reduce`` is a pure function of its units' results, so artifacts are byte-identical whatever the
number of workers, the order of completion or the faults along the way.
"""

from __future__ import annotations

from typing import Protocol

import msgspec

from cluster.config import RunConfig
from data.store import Store
from workers.provider import ProviderRequest, ProviderResponse


class UnitSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One deterministic provider request of a stage. ``check`` names a response validator
    (``workers/validators.py``) run before the answer is accepted, so that a malformed answer is
    retried instead of cached."""

    unit_id: str
    request: ProviderRequest
    check: str = ""


class UnitResult(msgspec.Struct, kw_only=True):
    unit_id: str
    key: str
    response: ProviderResponse | None = None
    error: str | None = None


class ShardOutput(msgspec.Struct, kw_only=True):
    """The committed output of one shard: written once (``if_absent``) to the store."""

    stage: str
    shard: int
    results: list[UnitResult]


class StagePlan(msgspec.Struct, kw_only=True):
    stage: str
    units: list[UnitSpec]
    shard_size: int

    def shard_count(self) -> int:
        return (len(self.units) + self.shard_size - 1) // self.shard_size

    def shard(self, index: int) -> list[UnitSpec]:
        return self.units[index * self.shard_size : (index + 1) * self.shard_size]


def make_plan(stage: str, units: list[UnitSpec], shard_size: int) -> StagePlan:
    """Sort units by id so shard boundaries do not depend on the order a stage listed them in."""
    ids = [u.unit_id for u in units]
    if len(set(ids)) != len(ids):
        raise ValueError(f"stage {stage}: duplicate unit ids")
    return StagePlan(stage=stage, units=sorted(units, key=lambda u: u.unit_id), shard_size=shard_size)


class StageContext:
    """What a stage may read and write: the config and the run's artifacts in the store."""

    def __init__(self, cfg: RunConfig, run_id: str, store: Store) -> None:
        self.cfg = cfg
        self.run_id = run_id
        self.store = store

    def artifact_key(self, name: str) -> str:
        return f"{self.run_id}/artifacts/{name}"

    def write_artifact(self, name: str, data: bytes) -> None:
        self.store.put(self.artifact_key(name), data)

    def read_artifact(self, name: str) -> bytes:
        raw = self.store.get(self.artifact_key(name))
        if raw is None:
            raise FileNotFoundError(f"artifact {name} of run {self.run_id} is missing from {self.store.url}")
        return raw


class Stage(Protocol):
    name: str

    def plan(self, ctx: StageContext) -> list[UnitSpec]:
        """The stage's units (may be empty for a reduce-only stage)."""
        ...

    def reduce(self, ctx: StageContext, results: dict[str, UnitResult]) -> list[str]:
        """Build the stage's artifacts from its results; returns the artifact names written."""
        ...
