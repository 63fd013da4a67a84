"""The Humor benchmark (the built-in ``humor`` pipeline): its pipeline object and stages (:mod:`.pipeline`) and
its simulated answers (:mod:`.simulate`). The data code (loaders, parser, judges, metrics) is ``data/humor/``.

Registered through punchline's own ``punchline.pipelines`` entry points, as a plug-in is; the engine imports none of
this package."""

from punchline.cluster.pipelines.humor.pipeline import PIPELINE, HumorSettings

__all__ = ["PIPELINE", "HumorSettings"]
