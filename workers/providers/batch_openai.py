"""OpenAI-compatible batches (OpenAI, Together, vLLM's batch runner, the fake) via ``openai.OpenAI``.

A batch is a JSONL file uploaded with ``files.create(purpose="batch")`` and a ``batches.create`` over it;
OpenAI validates the file (one model and one endpoint per file) and a file that breaks a rule makes a batch
that ends ``failed`` with the reason in its ``errors`` (:attr:`BatchInfo.error`). The batch key and the
intent's random tag travel in the batch's ``metadata`` (the key also in the input file's name,
``punchline-<batch key>.jsonl``), so a driver that died between the create call and recording its id finds
the batch again by listing, and only its own. SDK retries are off: a create is never repeated behind the
runner's back.
"""

from __future__ import annotations

import json
from collections.abc import Container, Iterator
from typing import Any, Literal

import openai

from punchline.data.errors import RetryableProviderError
from punchline.data.requests import ProviderRequest
from punchline.workers.batch_provider import BatchInfo, PartOutcome, parts, wire_id
from punchline.workers.providers import SdkBatches, redact
from punchline.workers.providers.openai_compat import chat_body, response_of

METADATA_KEY = "punchline_batch_key"
METADATA_TAG = "punchline_intent"
PAGE = 100  # the most a listing page holds (``limit`` 1-100, default 20)
ENDPOINT: Literal["/v1/chat/completions"] = "/v1/chat/completions"


class OpenAIBatches(SdkBatches):
    has_metadata = True

    sdk = openai
    client_class = openai.OpenAI
    label = "batches"

    def input_file(self, requests: list[ProviderRequest], skip: Container[str] = (), tag: str = "") -> bytes:
        lines = []
        for request in requests:
            for part in parts(self.settings, request, skip):
                body = chat_body(request, part.n)
                cid = wire_id(tag, part.custom_id)
                lines.append(
                    json.dumps(
                        {"custom_id": cid, "method": "POST", "url": ENDPOINT, "body": body},
                        ensure_ascii=False,
                        separators=(",", ":"),
                    )
                )
        return ("\n".join(lines) + "\n").encode()

    def create(
        self, batch_key: str, requests: list[ProviderRequest], skip: Container[str] = (), tag: str = ""
    ) -> BatchInfo:
        data = self.input_file(requests, skip, tag)
        with self._errors("upload"):
            uploaded = self._client.files.create(file=(f"punchline-{batch_key}.jsonl", data), purpose="batch")
        with self._errors("create"):
            batch = self._client.batches.create(
                input_file_id=uploaded.id,
                endpoint=ENDPOINT,
                completion_window="24h",
                metadata={METADATA_KEY: batch_key, METADATA_TAG: tag},
            )
        return _info(batch)

    def retrieve(self, batch_id: str) -> BatchInfo:
        with self._errors("retrieve"):
            return _info(self._client.batches.retrieve(batch_id))

    def listing(self, since: float = 0.0) -> Iterator[BatchInfo]:
        with self._errors("list"):
            for batch in self._client.batches.list(limit=PAGE):  # the SDK fetches the next page (``after``)
                info = _info(batch)
                if info.created_at < since:
                    return
                yield info

    def cancel(self, batch_id: str) -> BatchInfo:
        with self._errors("cancel"):
            return _info(self._client.batches.cancel(batch_id))

    def _lines(self, file_id: str | None) -> list[dict[str, Any]]:
        if not file_id:
            return []
        with self._errors("download"):
            text = self._client.files.content(file_id).text
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def results(self, batch_id: str) -> dict[str, PartOutcome]:
        with self._errors("retrieve"):
            batch = self._client.batches.retrieve(batch_id)
        got: dict[str, PartOutcome] = {}
        for line in self._lines(batch.output_file_id) + self._lines(batch.error_file_id):
            cid = str(line.get("custom_id"))
            resp = line.get("response") or {}
            if resp.get("status_code") == 200:
                try:
                    got[cid] = response_of(f"{self.name}/{cid}", openai.types.chat.ChatCompletion(**resp["body"]))
                except (RetryableProviderError, TypeError, ValueError) as exc:
                    got[cid] = f"errored: {exc}"[:300]
            elif line.get("error"):
                code = str(line["error"].get("code") or "error")
                got[cid] = "expired" if "expired" in code else ("canceled" if "cancel" in code else f"errored: {code}")
            else:
                message = json.dumps(resp.get("body"))[:200]
                got[cid] = f"errored: HTTP {resp.get('status_code')}: {redact(message, self._secret)}"
        return got


def _info(batch: Any) -> BatchInfo:
    status = str(batch.status)
    counts = batch.request_counts
    return BatchInfo(
        batch_id=batch.id,
        status="ended" if status in ("completed", "expired", "cancelled", "failed") else "in_progress",
        provider_status=status,
        created_at=float(batch.created_at),
        total=int(counts.total) if counts else 0,
        succeeded=int(counts.completed) if counts else 0,
        failed=int(counts.failed) if counts else 0,
        batch_key=str((batch.metadata or {}).get(METADATA_KEY, "")),
        tag=str((batch.metadata or {}).get(METADATA_TAG, "")),
        error=_error(batch),
    )


def _error(batch: Any) -> str:
    """The provider's reason for failing a whole batch (validation), one line."""
    errors = getattr(getattr(batch, "errors", None), "data", None) or []
    if not errors:
        return "failed without a reason given" if str(batch.status) == "failed" else ""
    first = errors[0]
    where = f" (line {first.line})" if getattr(first, "line", None) else ""
    text = f"{first.code or 'error'}{where}: {first.message or ''}".strip()
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return " ".join(f"{text}{more}".split())[:300]
