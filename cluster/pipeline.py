"""What a pipeline is made of: stages that expand into units, shards of units, and reduce steps.

A stage's ``plan`` is a pure function of the config and earlier stages' artifacts, so a resumed
run (or another node) computes exactly the same units and the same shard boundaries; a stage's
``reduce`` is a pure function of its units' results, so artifacts are byte-identical whatever the
number of workers, the order of completion or the faults along the way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from punchline.cluster.config import RunConfig
from punchline.data.store import Store
from punchline.data.units import UnitResult, UnitSpec


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

    def write_artifact_chunks(self, name: str, chunks: Iterable[bytes]) -> None:
        self.store.put_chunks(self.artifact_key(name), chunks)

    def read_artifact(self, name: str) -> bytes:
        raw = self.store.get(self.artifact_key(name))
        if raw is None:
            raise FileNotFoundError(f"artifact {name} of run {self.run_id} is missing from {self.store.url}")
        return raw


class Stage(Protocol):
    name: str

    def plan(self, ctx: StageContext) -> Iterable[UnitSpec]:
        """The stage's units in strictly increasing ``unit_id`` order (may be empty for a reduce-only stage);
        a generator keeps a large plan out of memory, a small stage may return ``in_unit_order(units)``."""
        ...

    def reduce(self, ctx: StageContext, results: Mapping[str, UnitResult]) -> list[str]:
        """Build the stage's artifacts from its results; returns the artifact names written."""
        ...
