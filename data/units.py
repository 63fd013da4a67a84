"""Units, shards and stage plans: what the coordinator hands out and the workers hand back.

A stage's plan is a pure function of the config and earlier artifacts, cut into shards at the same
boundaries on every node and every resume; these records cross processes (Ray) and files (the store).
"""

from __future__ import annotations

import msgspec

from punchline.data.requests import ProviderRequest, ProviderResponse


class UnitSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One deterministic provider request of a stage. ``check`` names a response validator
    (``punchline/workers/validators.py``) run before the answer is accepted, so that a malformed answer is
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
