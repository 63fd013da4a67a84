"""Scores with their uncertainty, for built-in pipelines and plug-ins alike (``punchline.plugin`` re-exports them).

Four small modules, pure functions over plain values and msgspec Structs:

* :mod:`.intervals`: a rate's Wilson or Clopper-Pearson interval, a mean's seeded percentile bootstrap,
  Newcombe's interval of a difference of two independent rates;
* :mod:`.paired`: two models on the same items: McNemar's exact and mid-p tests for right/wrong outcomes, a
  paired bootstrap of the difference of means;
* :mod:`.tables`: per-model estimates from rows, and how a table shows them;
* :mod:`.plots`: error-bar and paired-difference figures as PNG and SVG bytes (matplotlib, loaded on first use).

An undefined value (0/0: a precision of a class never predicted, a rate over no answers) is ``None``, shown
``n/a``: never ``0.0``, which would read as a measured zero.
"""
