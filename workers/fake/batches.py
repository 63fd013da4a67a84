"""The fake provider's batch endpoints: OpenAI's ``/v1/files`` + ``/v1/batches`` and Anthropic's
``/v1/messages/batches``, enough of both for the official SDKs.

Why a fake of its own: batch submission is where a crash costs money twice (a batch created but never
recorded is paid again), so the tests need a provider that counts every batch created and every request
billed, and that can stop at the worst moments.

**Answers** are the online endpoints' answers for the same request body
(:func:`punchline.workers.fake.state.completion`), so a run in batch mode caches the same texts as an
online run. A request's choice offset (the online ``X-Choice-Offset`` header) travels in its custom id as a
``-o<offset>`` suffix; a custom id without one answers from offset 0.

**Processing** is lazy: a batch is decided when it is looked at after ``batch_delay_s``. Each request then
errors with ``batch_error_rate`` or expires with ``batch_expire_rate``, decided by a hash of (seed, the
request's body and choice offset, how often that request was processed before), so a resubmitted request gets a
fresh draw, and the draws do not depend on how a client names its requests (custom ids may carry random parts). A batch
with expired requests ends as ``expired`` (OpenAI) or ``ended`` with ``expired`` results (Anthropic).
Succeeded requests are **billed** once each; errored, expired and cancelled ones are not.

**Validation** follows OpenAI's rules for an input file: one model and one endpoint per file
(``batch_one_model_per_file``, on by default as at OpenAI) and at most ``batch_max_file_requests`` lines. A file
that breaks one makes a batch that is ``validating`` when created and ``failed`` at the first look, with the
reason in its ``errors`` and nothing billed. Anthropic's Message Batches take mixed models.

**Listing** pages as the providers do: newest first, ``limit`` 20 by default, at most 100 with ``after``
(OpenAI) and at most 1000 with ``after_id`` / ``before_id`` (Anthropic); a limit out of range is a 400.

**Other users' batches** share the account: ``POST /batch-seed`` (:meth:`BatchBook.seed`) adds ``count``
foreign batches of ``requests`` requests each, created at a given time, open for ``delay_s``. They are listed,
retrieved, answered and cancellable like any other, but counted apart (``foreign_*``), so a test sees at once
when a run adopted, waited on or cancelled one.

**Crash points** (``batch_crash_point``): ``before_create`` hangs a create call without creating anything,
``after_create`` creates the batch and then hangs (the client never learns its id), ``late_create`` hangs
first and creates the batch when the client has given up, ``results`` hangs the results download; each hang
lasts ``hang_s`` and then drops the connection. A test kills the client while it hangs (``GET /batch-stats``
shows ``hanging``) or lets the client's timeout fire.
"""

from __future__ import annotations

import email.parser
import email.policy
import hashlib
import json
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlparse

import msgspec

from punchline.workers.fake.batch_records import Batch, BatchRequest, BatchStats
from punchline.workers.fake.batch_wire import anthropic_result_lines, openai_output_lines, validate
from punchline.workers.fake.batch_wire import view as batch_view
from punchline.workers.fake.draws import unit

__all__ = ["BATCH_PATHS", "BatchBook", "BatchStats"]

BATCH_PATHS = ("/v1/files", "/v1/batches", "/v1/messages/batches")
_OFFSET = re.compile(r"-o(\d+)$")


class BatchBook:
    """Files, batches and counters of the batch endpoints; one lock guards them."""

    def __init__(self, answer: Callable[[str, dict[str, Any], int], tuple[dict[str, Any], str]]) -> None:
        self.answer = answer  # (api, body, offset) -> (200 body, wire key)
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.files: dict[str, tuple[dict[str, Any], bytes]] = {}
            self.batches: dict[str, Batch] = {}
            self.order: list[str] = []
            self.processed: Counter[str] = Counter()
            self.stats = BatchStats()
            self.billed: Counter[str] = Counter()
            self.billed_keys: Counter[str] = Counter()
            self.submitted: Counter[str] = Counter()
            self.crashes: Counter[str] = Counter()

    def snapshot(self) -> BatchStats:
        with self.lock:
            return msgspec.structs.replace(
                self.stats,
                billed=dict(self.billed),
                billed_keys=dict(self.billed_keys),
                submitted=dict(self.submitted),
                batches_by_api=dict(Counter(b.api for b in self.batches.values())),
                crashes=dict(self.crashes),
            )

    # --- processing ---------------------------------------------------------------------------------

    def _settle(self, batch: Batch, cfg: Any) -> None:
        """Decide a batch once its processing delay has passed (or it was cancelled)."""
        if batch.ended_at is not None:
            return
        now = time.time()
        if batch.errors:  # validation failed: nothing runs, nothing is billed
            batch.status, batch.ended_at = "failed", now
            self.stats.failed_validation += 1
            return
        if batch.cancel_at is not None:
            batch.status = "ended" if batch.api == "anthropic" else "cancelled"
            batch.ended_at = now
            for r in batch.requests:
                batch.outcomes[r.custom_id] = ("canceled", None)
                if not batch.foreign:
                    self.stats.cancelled += 1
            self._write_files(batch)
            return
        if now < batch.created_at + (cfg.batch_delay_s if batch.delay_s is None else batch.delay_s):
            return
        any_expired = False
        for r in batch.requests:
            match = _OFFSET.search(r.custom_id)
            offset = int(match.group(1)) if match else 0
            request = hashlib.sha256(f"{json.dumps(r.body, sort_keys=True)}|{offset}".encode()).hexdigest()
            attempt = self.processed[request]
            self.processed[request] += 1
            if cfg.batch_expire_rate > 0 and unit(cfg.seed, request, attempt, "expire") < cfg.batch_expire_rate:
                batch.outcomes[r.custom_id] = ("expired", None)
                self.stats.expired += 1
                any_expired = True
                continue
            if cfg.batch_error_rate > 0 and unit(cfg.seed, request, attempt, "error") < cfg.batch_error_rate:
                batch.outcomes[r.custom_id] = ("errored", "injected batch request error")
                self.stats.errored += 1
                continue
            try:
                payload, key = self.answer(batch.api, r.body, offset)
            except ValueError as exc:  # a body its API refuses (no model or no messages): that request errors
                batch.outcomes[r.custom_id] = ("errored", str(exc))
                continue
            batch.outcomes[r.custom_id] = ("succeeded", payload)
            if not batch.foreign:
                self.billed[r.custom_id] += 1
                self.billed_keys[key] += 1
        batch.ended_at = now
        if batch.api == "anthropic":
            batch.status = "ended"
        else:
            batch.status = "expired" if any_expired else "completed"
        self._write_files(batch)

    def _write_files(self, batch: Batch) -> None:
        if batch.api != "openai":
            return
        out, err = openai_output_lines(batch)
        if out:
            batch.output_file_id = self._store_file("batch_output.jsonl", "batch_output", "\n".join(out) + "\n")
        if err:
            batch.error_file_id = self._store_file("batch_errors.jsonl", "batch_output", "\n".join(err) + "\n")

    def _store_file(self, name: str, purpose: str, content: str | bytes) -> str:
        data = content.encode() if isinstance(content, str) else content
        fid = "file-" + uuid.uuid4().hex[:24]
        meta = {
            "id": fid,
            "object": "file",
            "bytes": len(data),
            "created_at": int(time.time()),
            "filename": name,
            "purpose": purpose,
            "status": "processed",
        }
        self.files[fid] = (meta, data)
        return fid

    # --- routes --------------------------------------------------------------------------------------

    def handle(self, h: Any, method: str, cfg: Any, stop: threading.Event) -> None:
        """Serve one request of handler ``h`` (a ``BaseHTTPRequestHandler`` of the fake server)."""
        url = urlparse(h.path)
        path = url.path.rstrip("/")
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        base_url = f"http://{h.headers.get('Host', '127.0.0.1')}"
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        parts = path.split("/")[1:]  # ["v1", "batches", id, "cancel"]
        try:
            if parts[:2] == ["v1", "files"]:
                self._files(h, method, parts[2:], raw, cfg, stop)
            elif parts[:2] == ["v1", "batches"]:
                self._openai(h, method, parts[2:], raw, query, cfg, stop, base_url)
            elif parts[:3] == ["v1", "messages", "batches"]:
                self._anthropic(h, method, parts[3:], raw, query, cfg, stop, base_url)
            else:
                h._send(404, {"error": {"message": f"no route {h.path}"}})
        except (ValueError, KeyError, TypeError) as exc:
            h._send(400, {"error": {"message": f"bad request: {exc}", "type": "invalid_request_error"}})

    def _hang(self, h: Any, point: str, cfg: Any, stop: threading.Event) -> None:
        with self.lock:
            self.crashes[point] += 1
            self.stats.hanging += 1
        try:
            stop.wait(cfg.hang_s)
        finally:
            with self.lock:
                self.stats.hanging -= 1
        h.close_connection = True

    def _files(self, h: Any, method: str, rest: list[str], raw: bytes, cfg: Any, stop: threading.Event) -> None:
        if method == "POST" and not rest:
            msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
                b"Content-Type: " + h.headers.get("Content-Type", "").encode() + b"\r\n\r\n" + raw
            )
            fields: dict[str, tuple[str | None, bytes]] = {}
            for part in msg.iter_parts():
                name = part.get_param("name", header="content-disposition")
                payload = part.get_payload(decode=True)
                fields[str(name)] = (part.get_filename(), payload if isinstance(payload, bytes) else b"")
            filename, data = fields["file"]
            purpose = fields.get("purpose", (None, b"batch"))[1].decode()
            with self.lock:
                fid = self._store_file(filename or "upload.jsonl", purpose, data)
                self.stats.files_uploaded += 1
                meta = self.files[fid][0]
            h._send(200, meta)
            return
        with self.lock:
            found = self.files.get(rest[0]) if rest else None
        if method == "GET" and found and len(rest) == 1:
            h._send(200, found[0])
        elif method == "GET" and found and rest[1:] == ["content"]:
            if found[0]["purpose"] == "batch_output" and self.file_content_hook(cfg, h, stop):
                return
            self._send_raw(h, found[1], "application/jsonl")
        else:
            h._send(404, {"error": {"message": f"no file {'/'.join(rest)}", "type": "invalid_request_error"}})

    @staticmethod
    def _send_raw(h: Any, data: bytes, content_type: str) -> None:
        h.send_response(200)
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _create(self, api: str, requests: list[BatchRequest], metadata: dict[str, str], file_id: str) -> Batch:
        batch = Batch(api, requests, metadata, file_id)
        self.batches[batch.id] = batch
        self.order.append(batch.id)
        self.stats.batches_created += 1
        for r in requests:
            self.submitted[r.custom_id] += 1
        return batch

    def seed(self, spec: dict[str, Any]) -> list[str]:
        """Add other users' batches: ``api``, ``count``, ``requests`` each, ``created_at`` (epoch s, default
        now), ``delay_s`` (open that long; default the knob's), ``model``, ``custom_ids`` (default
        ``foreign-<n>``). Returns their ids, oldest first."""
        api = str(spec.get("api", "openai"))
        if api not in ("openai", "anthropic"):
            raise ValueError(f"api must be openai or anthropic, got {api!r}")
        n = int(spec.get("requests", 3))
        model = str(spec.get("model", "foreign-model"))
        ids = spec.get("custom_ids") or [f"foreign-{i}" for i in range(n)]
        created_at = spec.get("created_at")
        delay_s = spec.get("delay_s")
        out: list[str] = []
        with self.lock:
            for j in range(int(spec.get("count", 1))):
                requests = [
                    BatchRequest(
                        str(cid),
                        {
                            "model": model,
                            "max_tokens": 8,
                            "messages": [{"role": "user", "content": f"someone else's prompt {j}/{i}"}],
                        },
                    )
                    for i, cid in enumerate(ids)
                ]
                batch = Batch(
                    api,
                    requests,
                    {"owner": "someone-else"},
                    "",
                    foreign=True,
                    created_at=None if created_at is None else float(created_at),
                    delay_s=None if delay_s is None else float(delay_s),
                )
                self.batches[batch.id] = batch
                self.order.append(batch.id)
                self.stats.foreign_batches += 1
                out.append(batch.id)
            # listings are newest first by creation time, also for batches seeded in the past
            self.order.sort(key=lambda i: self.batches[i].created_at)
        return out

    def _listing(self, api: str, query: dict[str, str], cfg: Any, base_url: str, after_key: str) -> dict[str, Any]:
        """One page of the API's listing, newest first, at the provider's page sizes."""
        limit = int(query.get("limit", 20))
        most = 100 if api == "openai" else 1000
        if not 1 <= limit <= most:
            raise ValueError(f"limit must be between 1 and {most}, got {limit}")
        ids = [i for i in reversed(self.order) if self.batches[i].api == api]  # newest first
        after = query.get(after_key)
        before = query.get("before_id") if api == "anthropic" else None
        if before in ids:  # the page of newer batches right before that one
            end = ids.index(before)
            page, has_more = ids[max(0, end - limit) : end], end > limit
        else:
            if after in ids:
                ids = ids[ids.index(after) + 1 :]
            page, has_more = ids[:limit], len(ids) > limit
        for i in page:
            self._settle(self.batches[i], cfg)
        data = [batch_view(self.batches[i], base_url) for i in page]
        out: dict[str, Any] = {"data": data, "has_more": has_more}
        out["first_id"] = page[0] if page else None
        out["last_id"] = page[-1] if page else None
        if api == "openai":
            out["object"] = "list"
        return out

    def _openai(
        self,
        h: Any,
        method: str,
        rest: list[str],
        raw: bytes,
        query: dict[str, str],
        cfg: Any,
        stop: threading.Event,
        base_url: str,
    ) -> None:
        if method == "POST" and not rest:
            self._post_batch(h, raw, cfg, stop, base_url, lambda body: self._openai_batch(body, cfg))
        elif method == "GET" and not rest:
            with self.lock:
                h._send(200, self._listing("openai", query, cfg, base_url, "after"))
        else:
            self._one(h, method, rest, cfg, base_url, "openai")

    def _post_batch(
        self,
        h: Any,
        raw: bytes,
        cfg: Any,
        stop: threading.Event,
        base_url: str,
        create: Callable[[dict[str, Any]], Batch],
    ) -> None:
        """Create a batch (``create`` makes it from the request body, under the lock) with the crash points around
        its creation, the same for both APIs: ``before_create`` hangs before it exists; ``late_create`` hangs
        after reading the body, then creates it and drops the connection; ``after_create`` creates it, hangs and
        drops the connection, so the client never sees the id of a batch that exists."""
        if cfg.batch_crash_point == "before_create":
            self._hang(h, "before_create", cfg, stop)
            return
        body = json.loads(raw)
        if cfg.batch_crash_point == "late_create":
            self._hang(h, "late_create", cfg, stop)
        with self.lock:
            view = batch_view(create(body), base_url)
        if cfg.batch_crash_point in ("after_create", "late_create"):
            if cfg.batch_crash_point == "after_create":
                self._hang(h, "after_create", cfg, stop)
            h.close_connection = True
            return
        h._send(200, view)

    def _openai_batch(self, body: dict[str, Any], cfg: Any) -> Batch:
        """An OpenAI batch from its uploaded input file, with the file's validation errors (the lock held)."""
        meta, data = self.files[body["input_file_id"]]
        lines = [json.loads(ln) for ln in data.decode().splitlines() if ln.strip()]
        requests = [BatchRequest(ln["custom_id"], ln["body"]) for ln in lines]
        batch = self._create("openai", requests, dict(body.get("metadata") or {}), meta["id"])
        batch.errors = validate(lines, cfg)
        return batch

    def _anthropic_batch(self, body: dict[str, Any]) -> Batch:
        """An Anthropic batch from the requests in its body (the lock held)."""
        requests = [BatchRequest(r["custom_id"], r["params"]) for r in body["requests"]]
        return self._create("anthropic", requests, {}, "")

    def _one(self, h: Any, method: str, rest: list[str], cfg: Any, base_url: str, api: str) -> None:
        with self.lock:
            batch = self.batches.get(rest[0]) if rest else None
            if batch is None or batch.api != api:
                h._send(404, {"error": {"message": f"no batch {'/'.join(rest)}", "type": "not_found_error"}})
                return
            if method == "POST" and rest[1:] == ["cancel"]:
                if batch.foreign:
                    self.stats.foreign_cancelled += 1
                if batch.ended_at is None and batch.cancel_at is None:
                    batch.cancel_at = time.time()
                    if cfg.batch_delay_s > 0:  # a slow batch is cancelled before anything ran
                        self._settle(batch, cfg)
            elif not (method == "GET" and len(rest) == 1):
                h._send(404, {"error": {"message": f"no route {h.path}", "type": "not_found_error"}})
                return
            self._settle(batch, cfg)
            h._send(200, batch_view(batch, base_url))

    def _anthropic(
        self,
        h: Any,
        method: str,
        rest: list[str],
        raw: bytes,
        query: dict[str, str],
        cfg: Any,
        stop: threading.Event,
        base_url: str,
    ) -> None:
        if method == "POST" and not rest:
            self._post_batch(h, raw, cfg, stop, base_url, self._anthropic_batch)
        elif method == "GET" and not rest:
            with self.lock:
                h._send(200, self._listing("anthropic", query, cfg, base_url, "after_id"))
        elif method == "GET" and rest[1:] == ["results"]:
            if cfg.batch_crash_point == "results":
                self._hang(h, "results", cfg, stop)
                return
            with self.lock:
                found = self.batches.get(rest[0])
                if found is None or found.ended_at is None:
                    h._send(404, {"error": {"message": "results not ready", "type": "not_found_error"}})
                    return
                batch = found
                if batch.foreign:
                    self.stats.foreign_results_downloads += 1
                else:
                    self.stats.results_downloads += 1
                lines = anthropic_result_lines(batch)
            self._send_raw(h, ("\n".join(lines) + "\n").encode(), "application/binary")
        else:
            self._one(h, method, rest, cfg, base_url, "anthropic")

    def file_content_hook(self, cfg: Any, h: Any, stop: threading.Event) -> bool:
        """True when the results download of OpenAI output files must hang (crash point ``results``)."""
        if cfg.batch_crash_point == "results":
            self._hang(h, "results", cfg, stop)
            return True
        with self.lock:
            self.stats.results_downloads += 1
        return False
