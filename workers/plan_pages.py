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
    """A few recently read plan pages: consecutive claims mostly land on the same page."""

    def __init__(self, store: Store, keep: int = 4) -> None:
        self.store = store
        self.keep = keep
        self.pages: OrderedDict[tuple[str, int], list[list[UnitSpec]]] = OrderedDict()

    def _read(self, plan: StagePlan, page: int) -> list[list[UnitSpec]]:
        raw = self.store.get(plan_page_key(plan.run_id, plan.stage, page))
        if raw is None:
            raise FileNotFoundError(f"plan page {page} of stage {plan.stage} is missing from {self.store.url}")
        return decode_page(raw).shards

    async def shard(self, plan: StagePlan, shard: int) -> list[UnitSpec]:
        page = plan.page_of(shard)
        key = (plan.stage, page)
        if key not in self.pages:
            self.pages[key] = await asyncio.to_thread(self._read, plan, page)
            if len(self.pages) > self.keep:
                self.pages.popitem(last=False)
        return self.pages[key][shard - page * plan.shards_per_page]
