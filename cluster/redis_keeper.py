"""The keeper of a runs folder's Redis server (``python -m punchline.cluster.redis_keeper DIR PID TICKS``): a
detached process that stops the server once no live driver has been registered for ``KEEPER_GRACE_S`` (the last
driver was killed before it could leave), and exits when the server is gone.

Its loop is the shared keeper's (``cluster/keeper.py``); what it keeps is :class:`KeptRedis`. A module of its
own, beside the drivers' side (``cluster/local_redis.py``), so that this process imports only the keeper, the
folder's record and a socket (``cluster/redis_folder.py``): one starts beside every local run, and redis-py with
structlog cost it a quarter of a CPU second, more than a thousand calls of the run's own bookkeeping.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path

from punchline.cluster import keeper
from punchline.cluster.keeper import live_clients
from punchline.cluster.redis_folder import find_running, recorded_pid, stop_running

KEEPER_MODULE = "punchline.cluster.redis_keeper"  # this module: the keeper's entry point
KEEPER_POLL_S = 2.0
KEEPER_GRACE_S = 4.0  # no live driver for this long (three polls in a row) before the keeper stops the server


class KeptRedis:
    """What the keeper (:func:`keeper.keep`) keeps here: the folder's server, in use while a driver is registered."""

    def running(self, folder: Path) -> int | None:
        return recorded_pid(folder) if find_running(folder) is not None else None

    def in_use(self, folder: Path, pid: int) -> bool:
        return bool(live_clients(folder))

    def retire(self, folder: Path) -> None:
        stop_running(folder)  # under join.lock: a driver joining next starts a new server

    def stop(self, pid: int) -> None:
        """Stopped by :meth:`retire` already."""

    def ended(self, folder: Path) -> None:
        """Nothing to clear: the next driver starts the server again from its AOF."""

    def stop_orphan(self, pid: int) -> None:
        """SIGTERM the server whose folder is gone (the keeper checked it is still that server)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)


def spawn_keeper(folder: Path) -> None:
    """Start the folder's keeper unless one is already watching it."""
    keeper.spawn_keeper(KEEPER_MODULE, folder, recorded_pid(folder))


def keep(folder: Path, server_pid: int = 0, server_ticks: int = 0) -> int:
    """The keeper's loop (:func:`keeper.keep`). ``server_pid`` and ``server_ticks`` name the server the spawning
    driver saw: it is stopped if its folder is deleted under it."""
    return keeper.keep(
        folder, KeptRedis(), linger_s=KEEPER_GRACE_S, poll_s=KEEPER_POLL_S, pid=server_pid, ticks=server_ticks
    )


if __name__ == "__main__":
    sys.exit(keep(Path(sys.argv[1]), *(int(a) for a in sys.argv[2:4])))
