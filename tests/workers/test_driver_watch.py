"""The lifeguard of a detached worker, without Ray, against real Redis: once the driver is gone (its process
killed on this machine, its claim taken over, or its Ray job ended) it waits for the running work calls,
then ends the worker, exactly once; while the driver lives (or is paused: its claim lapsed) it never does."""

from __future__ import annotations

import json
import secrets
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable

import pytest
import redis

from punchline.schedulers.redis_client import connect_async
from punchline.workers import driver_watch
from punchline.workers.driver_watch import DriverWatch, Lifeguard, driver_claim_key
from tests.fixtures.redis import client_url


def _claim(pid: int) -> str:
    return json.dumps({"host": socket.gethostname(), "pid": pid, "token": secrets.token_hex(8)})


class _Worker:
    """What the lifeguard sees of a worker: its running work calls, and whether it left (and how often)."""

    def __init__(self) -> None:
        self.running = 0
        self.leaves = 0
        self.left_while_running = False

    def leave(self) -> None:
        self.leaves += 1
        self.left_while_running |= self.running > 0


def _guard(url: str, run_id: str, claim: str | None, worker: _Worker, owner_gone: Callable[[], bool]) -> Lifeguard:
    return Lifeguard(
        lambda: DriverWatch(connect_async(url), run_id, claim),
        busy=lambda: worker.running > 0,
        leave=worker.leave,
        owner_gone=owner_gone,
    ).start()


def _wait(cond: Callable[[], bool], timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_killed_driver_ends_the_worker_after_its_running_work(redis_client: redis.Redis) -> None:
    url = client_url(redis_client)
    run_id = f"lg-{uuid.uuid4().hex[:8]}"
    driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    claim = _claim(driver.pid)
    redis_client.set(driver_claim_key(run_id), claim, px=30_000)
    worker = _Worker()
    worker.running = 1  # a work call with calls in flight
    guard = _guard(url, run_id, claim, worker, lambda: False)
    try:
        time.sleep(1.0)
        assert not guard.gone.is_set() and worker.leaves == 0  # a live driver: nothing happens
        driver.kill()
        driver.wait()
        assert _wait(guard.gone.is_set), "the driver's death was not seen"
        time.sleep(0.6)
        assert worker.leaves == 0  # the running work call finishes first
        worker.running = 0
        assert _wait(lambda: worker.leaves > 0)
        guard.join(10)
        assert worker.leaves == 1 and not worker.left_while_running
    finally:
        driver.kill()
        driver.wait()


def test_a_resumed_driver_taking_the_claim_ends_the_old_workers_a_lapsed_claim_does_not(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(driver_watch, "CLAIM_GRACE_S", 0.5)
    url = client_url(redis_client)
    run_id = f"lg-{uuid.uuid4().hex[:8]}"
    old = json.dumps({"host": "another-machine", "pid": 1, "token": "a"})  # no pid to check here
    worker = _Worker()
    guard = _guard(url, run_id, old, worker, lambda: False)
    time.sleep(4.5)  # the claim missing (lapsed: a paused driver) for two claim checks, past the grace
    assert worker.leaves == 0 and not guard.gone.is_set()
    redis_client.set(driver_claim_key(run_id), _claim(12345), px=30_000)
    assert _wait(lambda: worker.leaves == 1)
    guard.join(10)


def test_an_ended_ray_job_ends_a_worker_with_no_claim_to_watch(redis_client: redis.Redis) -> None:
    worker = _Worker()
    ended = threading.Event()
    guard = _guard(client_url(redis_client), "no-claim", None, worker, ended.is_set)
    time.sleep(2.5)
    assert worker.leaves == 0
    ended.set()
    assert _wait(lambda: worker.leaves == 1)
    guard.join(10)
