"""Range checks of the simulated provider's knobs (a run config's ``[simulator]`` table or a
``fake-provider --config`` file), so a bad knob is one line naming it before the server starts."""

from __future__ import annotations

import math

from punchline.data.errors import ConfigError
from punchline.workers.fake.server import FakeConfig


def finite(value: float, low: float, high: float) -> bool:
    """A finite number in [low, high] (NaN and infinities never are)."""
    return math.isfinite(value) and low <= value <= high


def check_simulator(sim: FakeConfig, file: str | None, *, prefix: str = "simulator.") -> None:
    """Range checks of the simulated provider's knobs (``[simulator]`` or a ``fake-provider --config`` file)."""

    # each knob's own range is in FakeConfig's Meta (checked as the table is decoded); here what spans knobs
    if sim.latency_ms_max < sim.latency_ms_min:
        raise ConfigError(
            f"is below latency_ms_min ({sim.latency_ms_max} < {sim.latency_ms_min})",
            file=file,
            field=f"{prefix}latency_ms_max",
        )
