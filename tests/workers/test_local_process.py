"""The driver's own worker process (``workers/local_process.py``): how its work's event loop ends."""

from __future__ import annotations

import asyncio
import threading
import time

from punchline.workers.local_process import run_to_end
from punchline.workers.worker_config import WorkerReport


def test_the_work_ends_though_a_thread_of_its_executor_never_does() -> None:
    """A forked child's thread may block forever on a lock the fork left taken (OpenSSL's): ``asyncio.run`` would
    wait for it at its close and the worker would never report. ``run_to_end`` returns the report at once."""
    stuck = threading.Event()

    async def work() -> WorkerReport:
        loop = asyncio.get_running_loop()
        loop.run_in_executor(None, stuck.wait)  # a thread of the default executor that does not end by itself
        await asyncio.sleep(0.05)
        return WorkerReport(worker_id="w")

    started = time.monotonic()
    try:
        report = run_to_end(work())
        assert report.worker_id == "w"
        assert time.monotonic() - started < 30.0  # asyncio.run's close waits until the thread ends: forever here
        assert not stuck.is_set()
    finally:
        stuck.set()  # the thread ends now, so this test process exits
