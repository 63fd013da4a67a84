"""What a wipe of the ledger costs (issue 39, item 4): the run's password can no longer make one, but the owner of
``runs/_ledger/`` still can. Measured end to end as ``test_engine_faults.py`` measures a killed ledger: a real driver,
its ledger's AOF taken away and the server killed mid-run, so the watcher starts it again empty; the run finishes,
its artifact is the uninterrupted run's, and what was paid twice is within the calls in flight at the wipe."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from punchline.schedulers.server.ledger_access import missing_scripts
from punchline.schedulers.server.redis_client import connect
from punchline.services.local_redis import redis_dir
from punchline.services.redis_server import EmbeddedRedis
from punchline.workers.fake.server import FakeProviderServer
from tests.cluster.run.test_engine_faults import (  # noqa: F401 (setup and slow_fake are fixtures)
    Setup,
    _argv,
    _artifact,
    _driver,
    _finish,
    _guarantee,
    _halfway,
    _progress_within,
    _server_pid,
    setup,
    slow_fake,
    wait_for,
)

pytestmark = pytest.mark.slow


def _restarted(folder: Path, old: int) -> bool:
    return EmbeddedRedis.find_running(folder) is not None and _server_pid(folder.parent) != old


def test_a_wiped_ledger_costs_at_most_the_calls_in_flight(
    tmp_path: Path,
    setup: Setup,  # noqa: F811
    slow_fake: FakeProviderServer,  # noqa: F811
) -> None:
    runs = tmp_path / "runs"
    with _driver(_argv(setup, runs, "wiped")) as proc:
        _halfway(slow_fake, proc)
        folder = redis_dir(runs)
        old = _server_pid(runs)
        (folder / "appendonlydir").rename(tmp_path / "aof-taken")  # the server writes on into the moved files
        os.kill(old, signal.SIGKILL)  # and starts again (the watcher) with nothing: every key is gone
        wait_for(lambda: _restarted(folder, old) or proc.poll() is not None, timeout_s=30)
        assert proc.poll() is None, proc.communicate()[1].decode()[-3000:]
        url = EmbeddedRedis.find_running(folder)
        assert url is not None and missing_scripts(connect(url)) == []  # the empty server has the scripts
        assert _progress_within(slow_fake, proc, timeout_s=30) < 30
        _finish(proc)
    assert _server_pid(runs) != old
    extra = _guarantee(slow_fake, faults=1)  # at most the calls in flight (and answers waiting) of each worker
    print(f"paid twice after the wipe: {extra} of {len(slow_fake.stats().calls)} requests")
    assert _artifact(runs, "wiped") == setup.expected
