"""stop_tasks ends helpers that lose their cancellation, and never waits past its bound."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from punchline.data import background
from punchline.data.background import stop_tasks


async def _loses_first_cancel(periods: list[int]) -> None:
    """A loop whose call swallows one cancellation (as a client tearing its connection down can)."""
    lost = False
    while True:
        try:
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            if lost:
                raise
            lost = True
        periods.append(1)


async def _never_ends(hold: list[bool]) -> None:
    """Swallows every cancellation while ``hold[0]`` (then ends, so the test's loop can close)."""
    while hold[0]:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0.01)


def test_a_helper_that_loses_its_cancellation_is_cancelled_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(background, "RECANCEL_S", 0.05)

    async def main() -> tuple[list[str], bool, int]:
        periods: list[int] = []
        task = asyncio.create_task(_loses_first_cancel(periods), name="figures")
        await asyncio.sleep(0.05)
        # what the worker did before: cancel once and await, which never returned
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=0.2)
        assert not done  # the cancellation was lost: the task goes on
        left = await stop_tasks([task], timeout_s=5.0)
        return left, task.cancelled(), len(periods)

    left, cancelled, periods = asyncio.run(main())
    assert left == [] and cancelled and periods > 0


def test_the_wait_is_bounded_and_names_what_is_left() -> None:
    async def main() -> tuple[list[str], float]:
        hold = [True]
        stuck = asyncio.create_task(_never_ends(hold), name="stuck")
        fine = asyncio.create_task(asyncio.sleep(60), name="fine")
        await asyncio.sleep(0.05)  # both started: a task cancelled before its first step cannot catch it
        loop = asyncio.get_running_loop()
        started = loop.time()
        left = await stop_tasks([stuck, fine], timeout_s=0.3)
        took = loop.time() - started
        assert fine.cancelled() and not stuck.done()
        hold[0] = False
        await stuck
        return left, took

    left, took = asyncio.run(main())
    assert left == ["stuck"] and took < 5.0


def test_an_error_a_helper_raised_is_retrieved_not_raised() -> None:
    async def boom() -> None:
        raise RuntimeError("figures failed")

    async def main() -> list[str]:
        task = asyncio.create_task(boom())
        await asyncio.sleep(0)
        return await stop_tasks([task])

    assert asyncio.run(main()) == []
