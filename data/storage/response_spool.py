"""Answers paid for that the store could not take: kept on this node's disk, committed on resume.

A worker that paid for an answer holds it while the store is down (every store operation waits out
an outage for ``PUNCHLINE_S3_OUTAGE_S``). When the outage outlasts that bound the store raises and
the run stops; without this spool the answer, paid for, would be lost with the worker and paid again
on resume. So before the error goes up, the answer is written here (``runs/<run-id>/spool/`` on the
node's own disk, one fsynced file per request key), and the next worker or driver of the run on this
machine puts every spooled answer into the response cache (``if_absent``, like any answer) before it
claims work, then removes the file.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from punchline.data.requests import ProviderRequest, ProviderResponse
from punchline.data.storage.jsonio import atomic_write_bytes
from punchline.data.storage.response_cache import CachedResponse, ResponseCache

SUFFIX = ".msgpack"
_decoder = msgspec.msgpack.Decoder(CachedResponse)


class ResponseSpool:
    """``folder/<request key>.msgpack``: one paid answer each, until the store has it."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)

    def keep(self, request: ProviderRequest, response: ProviderResponse) -> Path:
        """Write the answer durably (temp file, fsync, rename); the file's path."""
        path = self.folder / f"{request.key()}{SUFFIX}"
        atomic_write_bytes(path, msgspec.msgpack.encode(CachedResponse(request=request, response=response)))
        return path

    def pending(self) -> list[Path]:
        if not self.folder.is_dir():
            return []
        return sorted(p for p in self.folder.iterdir() if p.name.endswith(SUFFIX) and not p.name.startswith("."))

    def commit(self, cache: ResponseCache) -> int:
        """Put every spooled answer into the cache (a store error leaves the rest spooled); how many."""
        done = 0
        for path in self.pending():
            try:
                entry = _decoder.decode(path.read_bytes())
            except (OSError, msgspec.DecodeError):  # torn by a crash before the rename: never a paid answer
                continue
            cache.put(entry.request, entry.response, source=entry.source)
            path.unlink(missing_ok=True)
            done += 1
        return done
