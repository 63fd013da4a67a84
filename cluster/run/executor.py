"""The executor interface: how a stage's units get their answers, chosen per stage.

The coordinator plans a stage (its units, cut into shards in the store), hands the plan to one executor, and
reduces what comes back; it does not know how the answers were paid for. Two implementations live in
:mod:`punchline.cluster.run.executors`:

* ``shards`` (:mod:`~punchline.cluster.run.executors.shards`): workers (the driver's own while Ray starts, then
  Ray's on every node) claim the stage's shards and call the providers online, under leases;
* ``batches`` (:mod:`~punchline.cluster.run.executors.batches`): the stage's units of batch-mode providers go
  through the providers' batch APIs first (half price; it runs in the driver, which waits anyway), and their
  answers are written under the same response-cache keys, so the shards that follow find them there and the
  artifacts are byte-identical whichever executor paid.

Which one a stage gets is :func:`executor_name`: ``batches`` when one of the providers the stage sees
(:func:`stage_providers`: a stage's own ``mode`` overrides its providers') is in batch mode, unless the run is
offline (replaying the cache: nothing is paid, so there is nothing to batch).

Both return :class:`~punchline.data.units.ShardResults` (every shard's file, read lazily): the shards are the
stage's output whichever executor ran, so a resume, ``retry-failed`` and the reduce never ask which one did.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, Protocol

import msgspec

from punchline.cluster.pipeline import Stage
from punchline.data.provider_settings import Mode, ProviderSettings
from punchline.data.units import ShardResults, StagePlan
from punchline.schedulers.ledger import StageCounters

ExecutorName = Literal["shards", "batches"]
ProgressFn = Callable[[str, StageCounters], None]
# Connects this process to Ray once Ray is up (on the calling, the main, thread): True when connected.
# Called with wait=False while the driver's own worker has the stage in hand (never blocks then), with
# wait=True when nothing else can work the stage's missing shards.
RayStart = Callable[[bool], bool]


class StageExecutor(Protocol):
    """Answers a planned stage's units and returns its shards' outputs."""

    name: ExecutorName

    def execute(self, stage: Stage, plan: StagePlan, first_ids: list[str], *, queued: bool) -> ShardResults:
        """Work ``plan`` (the stage's plan, in the store) to the end. ``queued``: the stage's queue was built
        already and the driver's own worker may hold leases in it (it is not rebuilt)."""
        ...

    def close(self) -> None:
        """Stop what the executor started (at the end of the run, or when a stage fails)."""
        ...


def stage_providers(providers: dict[str, ProviderSettings], mode: Mode | None) -> dict[str, ProviderSettings]:
    """The providers as one stage sees them: a stage's own ``mode`` (None: none set) overrides theirs."""
    if mode is None:
        return providers
    return {name: msgspec.structs.replace(p, mode=mode) for name, p in providers.items()}


def batch_mode(providers: dict[str, ProviderSettings]) -> bool:
    return any(p.mode == "batch" for p in providers.values())


def executor_name(providers: dict[str, ProviderSettings], *, offline: bool) -> ExecutorName:
    """The executor of a stage whose providers (as it sees them) are ``providers``."""
    return "batches" if batch_mode(providers) and not offline else "shards"
