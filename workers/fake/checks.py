"""Range checks of the simulated provider's knobs (a run config's ``[simulator]`` table or a
``fake-provider --config`` file), so a bad knob is one line naming it before the server starts."""

from __future__ import annotations

import math
from pathlib import Path

import msgspec

from punchline.data.errors import ConfigError
from punchline.data.simulator import FakeConfig
from punchline.data.storage.jsonio import validation_location
from punchline.workers.fake.simulators import decode_knobs, find_simulators


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
    if sim.pipeline_knobs:  # each table decodes into its pipeline's own knobs (found only when there are some)
        try:
            decode_knobs(find_simulators(sim.simulators), sim.pipeline_knobs)
        except ValueError as exc:
            where, _, detail = str(exc).partition(": ")
            raise ConfigError(detail, file=file, field=f"{prefix}{where}") from None


def load_knobs(path: str | Path) -> FakeConfig:
    """A ``FakeConfig`` from a TOML file (top-level keys are the knobs)."""
    return msgspec.toml.decode(Path(path).read_bytes(), type=FakeConfig)


def server_config(knobs: str | None, *, answer_keys: list[str] | None = None) -> FakeConfig:
    """``fake-provider``'s knobs: the TOML file ``knobs`` (top-level keys), range-checked, with each
    ``PIPELINE=FILE`` of ``answer_keys`` added to that pipeline's ``answer_key`` knob (the files whose answers its
    simulator knows); any of them unreadable or wrong is one ConfigError naming it."""
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
    files: dict[str, list[str]] = {}
    for given in answer_keys or ():
        name, sep, path = given.partition("=")
        if not sep or not name or not path:
            raise ConfigError(f"want PIPELINE=FILE, got {given!r}", field="--answer-key")
        if not Path(path).is_file():
            raise ConfigError("file not found", file=path, field="--answer-key")
        files.setdefault(name, []).append(path)
    if files:
        tables = {name: dict(table) for name, table in config.pipeline_knobs.items()}
        for name, paths in files.items():
            tables.setdefault(name, {})["answer_key"] = paths
        config = msgspec.structs.replace(config, pipeline_knobs=tables)
    return config
