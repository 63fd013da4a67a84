"""The Humor benchmark (the built-in ``humor`` pipeline): its pipeline object and stages (:mod:`.pipeline`) and
its simulated answers (:mod:`.simulate`). The data code (loaders, parser, judges, metrics) is ``pipelines/humor/data/``.

Registered through punchline's own ``punchline.pipelines`` entry points, as a plug-in is; the engine imports none of
this package. Importing the package itself is light (``punchline --help`` reads its ``cli``
module); the entry point names its ``pipeline`` module's ``PIPELINE``."""
