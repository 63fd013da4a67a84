"""What a pipeline shows of a run's results in the viewer: :class:`ResultSection` blocks, read through a
:class:`ResultsView`.

A pipeline knows what its artifacts mean (per-model scores with their CIs, a ranking's tiers); the viewer knows
how a page is written and escaped. So a pipeline's optional ``results(view)`` and ``artifact_results(view,
artifact)`` hooks (:class:`~punchline.cluster.pipeline.Pipeline`) return structured sections (a title, a table,
a list, a markdown report) and never HTML: the viewer renders them with its own escaping, and a plug-in's text cannot
become a script on the page. The view hands a hook what it needs to read the run's artifacts (the store, the run
id, the artifacts' names, the run's settings) with the viewer's limits: a read never pulls a large artifact whole.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from punchline.data.storage.run_layout import RunLayout
from punchline.data.store import Store
from punchline.data.stores.local import LocalStore, validate_key

MAX_READ_BYTES = 20 << 20  # the most of one artifact a page reads; a larger JSON is not parsed on a page view


class Link(msgspec.Struct, frozen=True):
    """A table cell that links to one of the run's artifacts (its page in the viewer, whatever its URL)."""

    text: str
    artifact: str  # its name under the run's ``artifacts/``


Cell = str | int | float | bool | Link | None


class ResultSection(msgspec.Struct, frozen=True, kw_only=True):
    """One block of a run's results: a title, then (any of, in this order) a bullet list, a table, a markdown
    report and a note. Every string is text: the viewer escapes it."""

    title: str = ""
    anchor: str = ""  # the id of the block on the page (``<pipeline>-results``): links and tests find it by it
    items: list[str] = []  # a bullet list
    rows: list[dict[str, Cell]] = []  # a table: one dict a row, its keys the columns (in first-seen order)
    empty: str = ""  # what to say when ``rows`` is empty ("none"); nothing when empty
    markdown: str = ""  # headings, pipe tables and paragraphs (a report's .md), rendered as the viewer's own tables
    note: str = ""  # one line under it


def head_bytes(store: Store, key: str, limit: int) -> tuple[bytes | None, bool]:
    """The first ``limit`` bytes of ``key`` and whether there is more (a local file is not read past them)."""
    if isinstance(store, LocalStore):
        path = (store.root / validate_key(key)).resolve()
        if not path.is_relative_to(store.root.resolve()):  # a link out of the store is not followed
            return None, False
        try:
            with open(path, "rb") as fh:
                head = fh.read(limit + 1)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None, False
        return head[:limit], len(head) > limit
    data = store.get(key)
    return (None, False) if data is None else (data[:limit], len(data) > limit)


class ResultsView:
    """A run's artifacts as a results hook reads them: by name, at most :data:`MAX_READ_BYTES` of each."""

    def __init__(self, store: Store, run_id: str, artifacts: list[str], settings: Any = None) -> None:
        self.store = store
        self.run_id = run_id
        self.artifacts = artifacts  # every artifact's name under the run's ``artifacts/``, sorted
        self.settings = settings  # the run's pipeline table as its settings_type; None when not readable here

    def read_head(self, name: str, limit: int = MAX_READ_BYTES) -> tuple[bytes | None, bool]:
        """The first ``limit`` bytes of artifact ``name`` (None: missing) and whether the artifact is longer."""
        return head_bytes(self.store, RunLayout(self.run_id).artifact(name), limit)

    def read_text(self, name: str) -> str | None:
        """Artifact ``name`` as text; None when missing or larger than :data:`MAX_READ_BYTES`."""
        data, more = self.read_head(name)
        return None if data is None or more else data.decode("utf-8", "replace")

    def read_json(self, name: str) -> Any:
        """Artifact ``name`` decoded; None when missing, too large or not JSON."""
        text = self.read_text(name)
        if text is None:
            return None
        try:
            return json.loads(text)
        except ValueError:
            return None
