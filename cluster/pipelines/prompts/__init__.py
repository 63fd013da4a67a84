"""Any prompt template over any rows (the built-in ``prompts`` pipeline): its pipeline object and stages
(:mod:`.pipeline`); the data code (settings, rows, templates, parsers, outputs) is ``data/prompts/``.

Registered through punchline's own ``punchline.pipelines`` entry points, as a plug-in is; the engine imports none of
this package."""

from punchline.cluster.pipelines.prompts.pipeline import PIPELINE

__all__ = ["PIPELINE"]
