"""Curation of candidate jokes (the built-in ``curate`` pipeline): its pipeline object and stages
(:mod:`.pipeline`) and its simulated answers (:mod:`.simulate`); the data code is ``pipelines/curate/curation.py``.

Registered through punchline's own ``punchline.pipelines`` entry points, as a plug-in is; the engine imports none of
this package. Importing the package itself is light (``punchline --help`` reads its ``cli``
module); the entry point names its ``pipeline`` module's ``PIPELINE``."""
