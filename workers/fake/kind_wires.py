"""Which simulated wire answers which path, and which one each provider kind speaks: read from the kinds registry.

Why a module of its own: the fake provider serves every installed kind's wire (the ``punchline.providers`` entry
points, punchline's own kinds among them) without naming one, so a kind that runs offline is its own module and
an entry point, no edit here. A kind's ``simulated_wire`` is a ``"module:attr"`` naming a
:class:`~punchline.workers.fake.wire.SimulatedWire`, or the name of another kind whose wire it reuses. A kind
that cannot be loaded, or whose wire cannot, is left out with a warning: its own run fails on its own with its
own error line (when the config is read); the simulator must not, nor the other kinds' runs.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping

from punchline.data.errors import ConfigError
from punchline.data.plugins import PROVIDER_KINDS
from punchline.workers.fake.wire import SimulatedWire
from punchline.workers.providers.registry import kind_of


def wire_of(kind: str, *, record: str | None = None, file: str | None = None) -> SimulatedWire:
    """The wire ``kind`` speaks offline; one ConfigError naming ``record`` and the kind when there is none."""
    seen: list[str] = []
    name = kind
    while True:
        target = kind_of(name, record=record, file=file).simulated_wire
        seen.append(name)
        if ":" in target:
            break
        if target in seen:
            raise ConfigError(
                f"provider kind {kind!r}: its simulated_wire names kinds in a circle ({' -> '.join([*seen, target])})",
                file=file,
                record=record,
                field="kind",
            )
        name = target  # reuses another kind's wire
    value = PROVIDER_KINDS.load(name, target, file=file, record=record, field="kind")
    if not isinstance(value, SimulatedWire):
        raise ConfigError(
            f"provider kind {name!r}: simulated_wire {target} is not a punchline.plugin.SimulatedWire",
            file=file,
            record=record,
            field="kind",
        )
    return value


class KindWires:
    """The wires of a set of kinds: by kind, by the path they answer, by name (what a batch says it speaks)."""

    def __init__(self, by_kind: Mapping[str, SimulatedWire]) -> None:
        self.by_kind = dict(by_kind)
        self.by_name: dict[str, SimulatedWire] = {}
        self.by_path: dict[str, SimulatedWire] = {}
        for kind, wire in sorted(self.by_kind.items()):
            if self.by_name.setdefault(wire.name, wire) is not wire:
                warnings.warn(f"simulated provider: kind {kind!r}'s wire {wire!r} is named as another's", stacklevel=2)
                continue
            for path in wire.paths:
                taken = self.by_path.setdefault(path, wire)
                if taken is not wire:
                    warnings.warn(f"simulated provider: {path} is {taken!r}'s, not {wire!r}'s", stacklevel=2)

    def of_kind(self, kind: str, *, record: str | None = None, file: str | None = None) -> SimulatedWire:
        wire = self.by_kind.get(kind)
        if wire is None:
            raise ConfigError(
                f"the simulated provider speaks no wire of kind {kind!r} (it serves {sorted(self.by_kind)})",
                file=file,
                record=record,
                field="kind",
            )
        return wire

    def of_headers(self, header: Callable[[str], str | None]) -> SimulatedWire:
        """The wire whose SDK sent a request whose headers ``header`` looks up (the first whose ``key_headers``
        are there, else the first that has none): whose shape a request that does not say its API is answered in."""
        wires = list(self.by_name.values())
        marked = next((w for w in wires if any(header(h) for h in w.key_headers)), None)
        return marked or next((w for w in wires if not w.key_headers), wires[0])


def find_wires() -> KindWires:
    """The wires of every kind installed now (read afresh: a kind installed since the registry first looked, or
    a test's dist-info, is served; a kind or wire that cannot be loaded is left out, with a warning)."""
    found: dict[str, SimulatedWire] = {}
    for kind in sorted(PROVIDER_KINDS.targets()):
        try:
            found[kind] = wire_of(kind)
        except ConfigError as exc:
            warnings.warn(f"simulated provider: kind {kind!r} not served: {exc}", stacklevel=2)
    return KindWires(found)
