"""The global response cache: one stored answer per request key, shared by every run and pipeline.

It lives in the checkpoint store (not in Redis) so that it survives a wiped Redis and can be
shared by runs on different clusters that point at the same bucket. Entries are written with
``if_absent`` so two runs that raced on the same request keep one answer.
"""

from __future__ import annotations

import msgspec

from punchline.data.requests import ProviderRequest, ProviderResponse
from punchline.data.store import Store

CACHE_PREFIX = "_cache/"


class CachedResponse(msgspec.Struct, kw_only=True):
    """A response together with the request that produced it (for audits and ``--offline`` errors)."""

    request: ProviderRequest
    response: ProviderResponse
    source: str = "provider"  # "provider" or "legacy-import"


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(CachedResponse)


class ResponseCache:
    def __init__(self, store: Store) -> None:
        self.store = store

    @staticmethod
    def path(key: str) -> str:
        return f"{CACHE_PREFIX}{key[:2]}/{key}.msgpack"

    def get(self, key: str) -> CachedResponse | None:
        raw = self.store.get(self.path(key))
        return None if raw is None else _decoder.decode(raw)

    def contains(self, key: str) -> bool:
        return self.store.exists(self.path(key))

    def put(self, request: ProviderRequest, response: ProviderResponse, *, source: str = "provider") -> bool:
        """Store the answer unless one is already there; returns whether this call wrote it."""
        entry = CachedResponse(request=request, response=response, source=source)
        return self.store.put(self.path(request.key()), _encoder.encode(entry), if_absent=True)
