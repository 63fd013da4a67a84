"""The keeper of a runs folder's Redis server, and the server's parent: it starts the server as its own child
(``python -m punchline.services.redis_keeper DIR --start PORT``), stops it once no live driver has been
registered for ``KEEPER_GRACE_S`` (the last driver was killed before it could leave), and exits when the server is gone.

Why the keeper starts the server, not the driver that needs it: a server must end with whoever keeps it. Started by
a driver, the server's parent was that driver, which may be killed while other drivers of the folder still use the
server; and once the keeper was killed too, nothing was left to stop it (``valkey-server`` ran on with parent 1, for
44 minutes in a runs folder since deleted). A child of the keeper gets the parent-death signal
(:func:`keeper.die_with_parent`, set before ``exec``): the kernel ends the server when its keeper ends, however it
ends. A killed keeper thus takes its server with it; a driver still running sees the server gone within its
``WATCH_S`` and starts a keeper (and so the server) again from the AOF on the same port
(``services/local_redis.py``), as it does for a server killed on its own.

Its loop is the shared keeper's (``services/keeper.py``); what it keeps is :class:`KeptRedis`. A module of
its own, beside the drivers' side (``services/local_redis.py``), so that it imports no logging stack and no Redis
client: one runs beside every local run, for the whole run. It starts the server and loads the engine's scripts into
it as the server's loader (:mod:`~punchline.services.redis_server`), over a bare socket
(:mod:`punchline.schedulers.server.server_info`): with redis-py imported for that, it held 38 MB of RSS all run long
(and paid 0.1 s more CPU to import it); without, 25 MB (``tests/services/test_keeper_imports.py`` keeps it so).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path

from punchline.data.errors import LedgerUnavailable
from punchline.services import keeper
from punchline.services.keeper import FAILED, READY, START_FLAG, live_clients, say, start_ticks
from punchline.services.redis_folder import find_running, recorded_pid, stop_running
from punchline.services.redis_server import EmbeddedRedis

KEEPER_MODULE = "punchline.services.redis_keeper"  # this module: the keeper's entry point
KEEPER_POLL_S = 2.0
KEEPER_GRACE_S = 4.0  # no live driver for this long (three polls in a row) before the keeper stops the server
# a starting keeper waits this long for the last keeper (whose server ended) to let go of keeper.lock: one poll
TAKEOVER_S = 3 * KEEPER_POLL_S
START_TIMEOUT_S = 60.0  # a driver waits this long for its keeper to say the server is up (it replays the AOF)


class KeptRedis:
    """What the keeper (:func:`keeper.watch`) keeps here: the folder's server, in use while a driver is registered."""

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


def start_server(folder: Path, port: int | None = None) -> None:
    """Start the folder's server through a new keeper, its parent (call under ``join.lock``, with this driver
    registered); returns once it answers. ``port``: the port a restart keeps (the URLs workers hold stay valid),
    else a free one. LedgerUnavailable with the reason when it cannot start."""
    keeper.spawn_starter(KEEPER_MODULE, folder, [str(port or 0)], timeout_s=START_TIMEOUT_S)


def serve(folder: Path, port: int) -> int:
    """A starting keeper (``--start PORT``, 0: any): take the folder's ``keeper.lock``, start the server as this
    process's child, say so to the driver waiting for it (:func:`keeper.say`), then keep it."""
    taken = keeper.take_folder(folder, "the ledger's folder", wait_s=TAKEOVER_S)
    if taken is None:
        return 1
    hold, fd = taken
    try:
        server = EmbeddedRedis(hold.path, port=port or None, parent_bound=True).start()
    except (LedgerUnavailable, OSError) as exc:
        os.close(fd)
        hold.close()
        say(f"{FAILED} {exc}")
        return 1
    pid = server.pid or 0
    server.detach()  # stopped by the keeper's loop (or by its own end, through the parent-death signal)
    say(READY)
    return keeper.watch(
        hold, fd, KeptRedis(), linger_s=KEEPER_GRACE_S, poll_s=KEEPER_POLL_S, pid=pid, ticks=start_ticks(pid)
    )


if __name__ == "__main__":
    if sys.argv[2:3] != [START_FLAG]:
        sys.exit(f"usage: python -m {KEEPER_MODULE} DIR {START_FLAG} PORT")
    sys.exit(serve(Path(sys.argv[1]), int(sys.argv[3])))
