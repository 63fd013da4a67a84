"""A worker's small cache of plan pages: a shard's units are read from its stage's plan page, and consecutive
claims mostly land on the same page. Apart from the worker's loop: it is about the store's plan layout.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from punchline.data.store import Store
from punchline.data.units import (
    StagePlan,
    UnitSpec,
    decode_page,
    plan_page_key,
)


class PlanPages:
    """The plan pages being claimed from, each shard's units handed out once (issue 42: a worker's memory is the
    shards it has not claimed yet on at most ``keep`` pages, not the stage). Claims come in queue order, so the
    current page and the next one are enough; a shard asked for again (its lease was lost and it came back, or
    its page was dropped) reads its page again."""

    def __init__(self, store: Store, keep: int = 2) -> None:
        self.store = store
        self.keep = keep
        self.pages: OrderedDict[tuple[str, int], list[list[UnitSpec] | None]] = OrderedDict()

    def _read(self, plan: StagePlan, page: int) -> list[list[UnitSpec] | None]:
        raw = self.store.get(plan_page_key(plan.run_id, plan.stage, page))
        if raw is None:
            raise FileNotFoundError(f"plan page {page} of stage {plan.stage} is missing from {self.store.url}")
        return list(decode_page(raw).shards)

    async def shard(self, plan: StagePlan, shard: int) -> list[UnitSpec]:
        page = plan.page_of(shard)
        key = (plan.stage, page)
        index = shard - page * plan.shards_per_page
        shards = self.pages.get(key)
        if shards is None or shards[index] is None:
            shards = await asyncio.to_thread(self._read, plan, page)
            self.pages[key] = shards
            self.pages.move_to_end(key)
            while len(self.pages) > self.keep:
                self.pages.popitem(last=False)
        units = shards[index]
        assert units is not None
        shards[index] = None  # handed out: the worker holds it while it runs
        return units
