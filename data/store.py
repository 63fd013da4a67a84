"""The checkpoint store interface: shard outputs, manifests and cached responses.

Two backends implement it (``data/stores/local.py`` and ``data/stores/s3.py``); both pass the
same contract tests. Keys are ``/``-separated relative paths. ``put(..., if_absent=True)`` is the
commit primitive: exactly one writer wins, so a shard committed twice (by a worker whose lease
expired and the one that took over) keeps the first, byte-identical, copy.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Iterator


class Store(abc.ABC):
    """A flat key -> bytes namespace under a root (a folder or an S3 prefix)."""

    url: str

    @abc.abstractmethod
    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> bool:
        """Write ``data`` at ``key``; readers see old or new, never half.

        With ``if_absent`` the write happens only if nothing is there yet; returns whether it wrote.
        """

    def put_chunks(self, key: str, chunks: Iterable[bytes]) -> None:
        """Write the concatenation of ``chunks`` at ``key`` (readers see old or new, never half).

        For artifacts too large to hold twice: a backend that can stream (the local folder) never holds
        the whole value; the default joins the chunks first."""
        self.put(key, b"".join(chunks))

    @abc.abstractmethod
    def get(self, key: str) -> bytes | None:
        """The bytes at ``key``, or None if absent."""

    def get_chunks(self, key: str) -> Iterator[bytes] | None:
        """The bytes at ``key`` a piece at a time, or None if absent: for artifacts too large to hold (a reduce reads
        a 10^6-row JSONL back). A backend that can stream (the local folder) never holds the whole value; the
        default reads it whole."""
        data = self.get(key)
        return None if data is None else iter((data,))

    @abc.abstractmethod
    def exists(self, key: str) -> bool: ...

    @abc.abstractmethod
    def list(self, prefix: str = "") -> Iterator[str]:
        """Keys under ``prefix`` (a folder-like prefix ending in ``/`` or empty), sorted."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key``; absent keys are fine."""
