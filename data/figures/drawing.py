"""One lock for every figure any pipeline draws in this process.

matplotlib keeps process-wide state: ``rcParams`` (one dict, which ``rc_context`` changes and restores) and
pyplot's figure registry. Two runs of one process (threads of a notebook, a test's runs side by side, a
plug-in's plot beside a built-in's) drawing at once would see each other's settings and write different bytes
(seen: two runs of one pipeline at once wrote different plots). So every savefig / pyplot use holds this lock.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from typing import Any

DRAWING = threading.RLock()  # re-entrant: a figure drawn inside another's settings


@contextlib.contextmanager
def drawing(rc: Mapping[str, Any] | None = None) -> Iterator[None]:
    """Hold the drawing lock, with ``rc`` as matplotlib's settings meanwhile (restored after)."""
    with DRAWING:
        if rc is None:
            yield
            return
        import matplotlib  # lazy: a second to import, and only the drawing needs it

        with matplotlib.rc_context(dict(rc)):  # type: ignore[arg-type]  # (its stubs list every key as a Literal)
            yield
