"""A worker's plan pages: each shard's units come from its page in the store, handed out once, with at most
``keep`` pages held (issue 42: a worker's memory does not grow with the stage); a shard asked for again, or one of a
page dropped, reads its page again."""

from __future__ import annotations

import asyncio
from pathlib import Path

from punchline.data.requests import ProviderRequest
from punchline.data.stores.local import LocalStore
from punchline.data.units import StagePlan, UnitSpec, cut, encode_page, plan_page_key
from punchline.workers.plan_pages import PlanPages

SHARD_SIZE = 3
PER_PAGE = 2


class CountingStore(LocalStore):
    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.gets: list[str] = []

    def get(self, key: str) -> bytes | None:
        self.gets.append(key)
        return super().get(key)


def _plan(store: LocalStore, units: int) -> StagePlan:
    specs = [
        UnitSpec(unit_id=f"u{i:03d}", request=ProviderRequest(provider="p", model="m", messages=(("user", f"q{i}"),)))
        for i in range(units)
    ]
    shape = cut("s", specs, SHARD_SIZE, PER_PAGE, on_page=lambda page: store.put(
        plan_page_key("r", "s", page.first_shard // PER_PAGE), encode_page(page)))  # fmt: skip
    return StagePlan(run_id="r", stage="s", shard_size=SHARD_SIZE, shards_per_page=PER_PAGE,
                     units_total=shape.units_total, shards_total=shape.shards_total, digest=shape.digest)  # fmt: skip


def test_shards_are_handed_out_once_from_at_most_keep_pages(tmp_path: Path) -> None:
    store = CountingStore(str(tmp_path))
    plan = _plan(store, 20)  # 7 shards on 4 pages
    pages = PlanPages(store, keep=2)

    async def claims(order: list[int]) -> list[list[str]]:
        return [[u.unit_id for u in await pages.shard(plan, s)] for s in order]

    got = asyncio.run(claims(list(range(plan.shards_total))))
    assert got == [[f"u{i:03d}" for i in range(s * SHARD_SIZE, min(20, (s + 1) * SHARD_SIZE))] for s in range(7)]
    assert len(store.gets) == 4  # each page read once when claims come in order
    assert len(pages.pages) == 2  # the last two pages: the earlier ones were dropped
    assert all(shards == [None] * len(shards) for shards in pages.pages.values())  # no unit kept once handed out

    # a shard claimed again (its lease was lost) and one of a dropped page: their pages are read again
    again = asyncio.run(claims([6, 0]))
    assert again == [["u018", "u019"], ["u000", "u001", "u002"]]
    assert len(store.gets) == 6
