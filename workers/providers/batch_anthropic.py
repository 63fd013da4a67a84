"""Anthropic Message Batches via ``anthropic.Anthropic`` (``client.messages.batches.*``).

Message batches carry no metadata, so a batch created by a driver that died before recording its id is
found again by what only its intent could have written: the custom ids, prefixed with the intent's random tag
(:func:`~punchline.workers.batch_provider.wire_id`). The listing narrows the candidates (request count,
creation time); a candidate is the intent's batch only once its results carry exactly the intent's wire ids
(see :mod:`punchline.cluster.run.executors.batches`). Results come as JSONL with one ``succeeded`` / ``errored`` /
``expired`` / ``canceled`` result per custom id. A request the API refuses is refused at create (a 400 naming
it). SDK retries are off.
"""

from __future__ import annotations

from collections.abc import Container, Iterator
from datetime import datetime
from typing import Any

import anthropic

from punchline.data.errors import RetryableProviderError
from punchline.data.requests import ProviderRequest
from punchline.workers.batch_provider import BatchInfo, PartOutcome, parts, wire_id
from punchline.workers.providers.anthropic import message_body, message_response
from punchline.workers.providers.base import SdkBatches, redact

PAGE = 1000  # the most a listing page holds (``limit`` 1-1000, default 20)


class AnthropicBatches(SdkBatches):
    has_metadata = False

    sdk = anthropic
    client_class = anthropic.Anthropic
    label = "message batches"

    def batch_requests(
        self, requests: list[ProviderRequest], skip: Container[str] = (), tag: str = ""
    ) -> list[dict[str, Any]]:
        return [
            {"custom_id": wire_id(tag, part.custom_id), "params": message_body(request)}
            for request in requests
            for part in parts(self.settings, request, skip)
        ]

    def create(
        self, batch_key: str, requests: list[ProviderRequest], skip: Container[str] = (), tag: str = ""
    ) -> BatchInfo:
        del batch_key  # no metadata in this API: the tag travels in the custom ids
        body = self.batch_requests(requests, skip, tag)
        with self._errors("create"):
            return _info(self._client.messages.batches.create(requests=body))

    def retrieve(self, batch_id: str) -> BatchInfo:
        with self._errors("retrieve"):
            return _info(self._client.messages.batches.retrieve(batch_id))

    def listing(self, since: float = 0.0) -> Iterator[BatchInfo]:
        with self._errors("list"):
            for batch in self._client.messages.batches.list(limit=PAGE):  # next pages by ``after_id``
                info = _info(batch)
                if info.created_at < since:
                    return
                yield info

    def cancel(self, batch_id: str) -> BatchInfo:
        with self._errors("cancel"):
            return _info(self._client.messages.batches.cancel(batch_id))

    def results(self, batch_id: str) -> dict[str, PartOutcome]:
        got: dict[str, PartOutcome] = {}
        with self._errors("results"):
            for line in self._client.messages.batches.results(batch_id):
                result = line.result
                if result.type == "succeeded":
                    try:
                        got[line.custom_id] = message_response(f"{self.name}/{line.custom_id}", result.message)
                    except RetryableProviderError as exc:
                        got[line.custom_id] = f"errored: {exc}"[:300]
                elif result.type == "errored":
                    err = getattr(getattr(result.error, "error", None), "message", "") or "error"
                    got[line.custom_id] = f"errored: {redact(str(err), self._secret)[:200]}"
                else:
                    got[line.custom_id] = str(result.type)
        return got


def _timestamp(value: Any) -> float:
    if isinstance(value, datetime):
        return value.timestamp()
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def _info(batch: Any) -> BatchInfo:
    c = batch.request_counts
    total = c.processing + c.succeeded + c.errored + c.canceled + c.expired
    return BatchInfo(
        batch_id=batch.id,
        status="ended" if batch.processing_status == "ended" else "in_progress",
        provider_status=str(batch.processing_status),
        created_at=_timestamp(batch.created_at),
        total=int(total),
        succeeded=int(c.succeeded),
        failed=int(c.errored + c.canceled + c.expired),
    )
