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

    def bad(field: str, message: str) -> ConfigError:
        return ConfigError(message, file=file, field=f"{prefix}{field}")

    for field in (
        "error_500_rate",
        "error_503_rate",
        "hang_rate",
        "truncated_body_rate",
        "malformed_rate",
        "noise_rate",
        "format_variant_rate",
        "judge_flip_rate",
    ):
        if not finite(getattr(sim, field), 0.0, 1.0):
            raise bad(field, f"must be a probability in [0, 1], got {getattr(sim, field)}")
    for table in ("funny_propensity", "humor_skill"):
        for model, value in getattr(sim, table).items():
            if not finite(value, 0.0, 1.0):
                raise bad(f"{table}.{model}", f"must be a probability in [0, 1], got {value}")
    for field in ("latency_ms_min", "latency_ms_max", "hang_s"):
        if not finite(getattr(sim, field), 0.0, 3_600_000.0):
            raise bad(field, f"must be a finite number >= 0, got {getattr(sim, field)}")
    if sim.latency_ms_max < sim.latency_ms_min:
        raise bad("latency_ms_max", f"is below latency_ms_min ({sim.latency_ms_max} < {sim.latency_ms_min})")
    for field in ("requests_per_minute", "rate_limit_burst"):
        value = getattr(sim, field)
        if value is not None and not finite(value, 1e-6, 1e12):
            raise bad(field, f"must be a positive finite number, got {value}")
    if sim.fail_first_attempts < 0:
        raise bad("fail_first_attempts", f"must be >= 0, got {sim.fail_first_attempts}")
    if not 100 <= sim.fail_status <= 599:
        raise bad("fail_status", f"must be an HTTP status (100-599), got {sim.fail_status}")


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
