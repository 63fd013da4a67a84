"""The local Ray head's keeper (``services/ray_keeper.py``) run as ``python -m
tests.services.stand_in_keeper``, its ``ray start`` replaced by what ``STAND_IN_HEAD`` in its environment names (a test
hands the module to ``ray_keeper.start_head`` through ``ray_keeper.KEEPER_MODULE``):

* ``draining``: a process titled as a head whose child is titled as Ray titles a shard-worker actor, busy 3 s;
* ``stuck``: the same, the child busy for 10 min and deaf to SIGTERM (a process only a SIGKILL of the session ends);
* ``slow-once``: the first head says what Ray says when a loaded machine missed its start-up wait, and ends; the
  next ones are real.

Each head's command line is appended to the file ``STAND_IN_LOG`` names, one JSON list a line.
"""

from __future__ import annotations

import json
import os
import sys

from punchline.services import ray_keeper
from punchline.services.ray_settings import RaySettings

real_command = ray_keeper.head_command
WORKER = "exec -a ray::ShardWorker.work sleep {s}"
CHILD = "import subprocess, time; subprocess.Popen(['bash', '-c', {worker!r}]); print({ready!r}, flush=True); {rest}"
STAND_INS = {
    "draining": CHILD.format(worker=WORKER.format(s=3), ready=ray_keeper.READY_TEXT, rest="time.sleep(600)"),
    "stuck": CHILD.format(
        worker=f"trap '' TERM; {WORKER.format(s=600)}", ready=ray_keeper.READY_TEXT, rest="time.sleep(600)"
    ),
}


def stand_in_command(settings: RaySettings, temp_dir: str, dashboard_port: int = 0) -> list[str]:
    argv = real_command(settings, temp_dir, dashboard_port)
    kind = os.environ["STAND_IN_HEAD"]
    with open(os.environ["STAND_IN_LOG"], "a") as log:
        first = log.tell() == 0
        if kind == "slow-once" and first:
            said = f"print('Exception: The current node {ray_keeper.SLOW_START_TEXT}.')"
            argv = [sys.executable, "-c", said, *(a for a in argv if a.startswith("--port="))]
        elif kind in STAND_INS:  # what the keeper reads of a head: --head, --block and its port
            kept = [a for a in argv if a.startswith(("--port=", "--temp-dir="))]
            argv = [sys.executable, "-c", STAND_INS[kind], "--head", "--block", *kept]
        log.write(json.dumps(argv) + "\n")
    return argv


if __name__ == "__main__":
    ray_keeper.head_command = stand_in_command
    sys.exit(ray_keeper.main(sys.argv))
