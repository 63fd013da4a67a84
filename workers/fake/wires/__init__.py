"""The simulated wires of punchline's own provider kinds, each named by its kind's ``simulated_wire``
(:mod:`punchline.workers.providers.kinds`), as a plug-in's kind names its own: the fake provider imports them
through the kinds registry, never by name."""
