"""Range checks of the simulated provider's knobs (a run config's ``[simulator]`` table or a
``fake-provider --config`` file), so a bad knob is one line naming it before the server starts."""

from __future__ import annotations

import math
from pathlib import Path

import msgspec

from punchline.data.errors import ConfigError
from punchline.data.jsonio import validation_location
from punchline.workers.fake.server import FakeConfig, load_knobs


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


def server_config(knobs: str | None, *, puns: list[str] | None = None, humor: list[str] | None = None) -> FakeConfig:
    """``fake-provider``'s knobs: the TOML file ``knobs`` (top-level keys), range-checked, answering from the
    ``puns`` and ``humor`` files; any of them unreadable or wrong is one ConfigError naming it."""
    config = FakeConfig()
    if knobs:
        try:
            config = load_knobs(knobs)
        except OSError as exc:
            raise ConfigError(f"cannot read: {exc.strerror}", file=knobs) from None
        except msgspec.ValidationError as exc:
            top, key, detail = validation_location(exc)
            raise ConfigError(detail, file=knobs, field=".".join(k for k in (top, key) if k) or None) from None
        except msgspec.DecodeError as exc:
            raise ConfigError(f"malformed TOML: {exc}", file=knobs) from None
        check_simulator(config, knobs, prefix="")
    for flag, paths in (("--puns", puns), ("--humor", humor)):
        for path in paths or ():
            if not Path(path).is_file():
                raise ConfigError("file not found", file=path, field=flag)
    if puns:
        config = msgspec.structs.replace(config, puns_path=list(puns))
    if humor:
        config = msgspec.structs.replace(config, humor_path=list(humor))
    return config
