"""Puns 205 (the built-in ``puns`` pipeline): its pipeline object and stages (:mod:`.pipeline`), its simulated
answers (:mod:`.simulate`), the reproduction of upstream's files (:mod:`.reproduce`, :mod:`.legacy`). The data
code it builds on (jokes, tiers, cloze tests) is on the ground floor, ``pipelines/puns/data/``.

Registered through punchline's own ``punchline.pipelines`` entry points, as a plug-in is; the engine imports none of
this package. Importing the package itself is light (``punchline --help`` reads its ``cli``
module); the entry point names its ``pipeline`` module's ``PIPELINE``."""
