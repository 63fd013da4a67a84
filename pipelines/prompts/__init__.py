"""Any prompt template over any rows (the built-in ``prompts`` pipeline): its pipeline object and stages
(:mod:`.pipeline`); the data code (settings, rows, templates, parsers, outputs) is ``cluster/stages/``.

Registered through punchline's own ``punchline.pipelines`` entry points, as a plug-in is; the engine imports none of
this package. Importing the package itself is light (``punchline --help`` reads its ``cli``
module); the entry point names its ``pipeline`` module's ``PIPELINE``."""
