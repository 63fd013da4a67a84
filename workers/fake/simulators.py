"""The installed pipelines' own simulated answers, as the fake provider asks for them.

A pipeline object may have a ``simulate(request)`` hook (see :mod:`punchline.data.simulator`) and a
``simulate_knobs`` Struct type (its table in ``[simulator.pipeline_knobs.<name>]``). The fake finds them through
the ``punchline.pipelines`` entry points when it starts, by group name (never by importing a pipeline here), or
is handed them by its caller; it asks them in name order. A plug-in that cannot be imported is skipped with a
warning (a run of it fails on its own, with its own error line; the simulator must not).
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from punchline.data.simulator import SimRequest, installed_pipelines


@dataclass(frozen=True)
class Simulator:
    """One pipeline's answers: its name (the key of its knobs), its hook and the type its knobs decode into."""

    name: str
    simulate: Callable[[SimRequest], str | None]
    knobs_type: type | None = None


def simulator_of(name: str, obj: object) -> Simulator | None:
    """The simulator of pipeline object ``obj`` (named ``name``), or None when it has no ``simulate`` hook."""
    hook = getattr(obj, "simulate", None)
    if not callable(hook):
        return None
    knobs_type = getattr(obj, "simulate_knobs", None)
    return Simulator(name, hook, knobs_type if isinstance(knobs_type, type) else None)


def find_simulators(extra: Sequence[str] = ()) -> list[Simulator]:
    """The simulators of the pipelines ``extra`` names (``package.module:Name``, in order: a run's own pipeline that
    is not installed), then of every installed pipeline (the entry points of
    :data:`~punchline.data.simulator.PIPELINES_GROUP`) in name order; a name is asked once, its first one."""
    targets = [(None, ref) for ref in extra] + sorted(installed_pipelines().items())
    found: list[Simulator] = []
    for name, target in targets:
        module_name, _, attr = target.partition(":")
        try:
            value = getattr(importlib.import_module(module_name), attr)
            obj = value() if isinstance(value, type) else value
        except Exception as exc:  # a broken plug-in: its own run reports it; the simulator answers generically
            warnings.warn(f"simulated provider: pipeline {name or target!r} ({target}) not loaded: {exc}", stacklevel=2)
            continue
        sim = simulator_of(name or str(getattr(obj, "name", target)), obj)
        if sim is not None and all(s.name != sim.name for s in found):
            found.append(sim)
    return found


def decode_knobs(simulators: Sequence[Simulator], tables: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Each simulator's knobs, decoded from its table (``pipeline_knobs``) into its ``simulate_knobs`` type; a
    table of no installed pipeline, or a bad knob, is a ValueError naming ``pipeline_knobs.<name>[.<key>]``."""
    by_name = {s.name: s for s in simulators}
    decoded: dict[str, Any] = {}
    for name, table in tables.items():
        sim = by_name.get(name)
        if sim is None:
            raise ValueError(f"pipeline_knobs.{name}: no installed pipeline {name!r} has simulated answers")
        if sim.knobs_type is None:
            decoded[name] = dict(table)
            continue
        try:
            decoded[name] = msgspec.convert(dict(table), sim.knobs_type)
        except msgspec.ValidationError as exc:
            raise ValueError(f"pipeline_knobs.{name}: {exc}") from None
    return decoded
