"""The simulated provider as a run's driver starts it: its stages' answers worked out, the server listening.

Why a module of its own: the driver loads it by name (``cluster/run/run_services.py``) only when a provider of
the run is ``simulated``. The server's modules (its HTTP handler, the batch wires, the answer formats with their
JSON Schema validator) are some 20 MB; a run against real endpoints would carry them in the driver and in every
worker forked from it.
"""

from __future__ import annotations

from collections.abc import Iterable

from punchline.data.simulator import FakeConfig
from punchline.workers.fake.server import FakeProviderServer
from punchline.workers.fake.stage_answers import stage_answers


def start_simulator(
    sim: FakeConfig, stages: Iterable[object], cfg: object, file: str | None, *, host: str
) -> FakeProviderServer:
    """The simulated provider for a run, started: its stages' answers follow what each stage parses
    (:func:`~punchline.workers.fake.stage_answers.stage_answers`), and it keeps no per-key counts (a run's)."""
    server = FakeProviderServer(sim, host=host, stages=stage_answers(sim, stages, cfg, file), per_key=False)
    server.start()
    return server
