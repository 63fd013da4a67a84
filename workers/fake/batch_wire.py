"""The OpenAI and Anthropic wire shapes of a fake batch: its view, its input-file validation, its result lines.

Why a module of its own: these are the bodies the official SDKs parse, field for field; keeping them apart from
the routes and the processing in :mod:`punchline.workers.fake.batches` means one place spells each API's shape.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from punchline.workers.fake.batch_records import Batch


def iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, tz=UTC).isoformat().replace("+00:00", "Z")


def counts(batch: Batch) -> dict[str, int]:
    """The request counts by outcome (Anthropic's names; OpenAI's are derived from them)."""
    kinds = Counter(k for k, _ in batch.outcomes.values())
    return {
        "processing": len(batch.requests) - len(batch.outcomes),
        "succeeded": kinds["succeeded"],
        "errored": kinds["errored"],
        "canceled": kinds["canceled"],
        "expired": kinds["expired"],
    }


def view(batch: Batch, base_url: str) -> dict[str, Any]:
    """The batch as the API's retrieve and list calls show it."""
    c = counts(batch)
    if batch.api == "anthropic":
        return {
            "id": batch.id,
            "type": "message_batch",
            "processing_status": "ended"
            if batch.ended_at is not None
            else ("canceling" if batch.cancel_at else "in_progress"),
            "request_counts": c,
            "created_at": iso(batch.created_at),
            "expires_at": iso(batch.created_at + 86400),
            "ended_at": iso(batch.ended_at),
            "cancel_initiated_at": iso(batch.cancel_at),
            "archived_at": None,
            "results_url": f"{base_url}/v1/messages/batches/{batch.id}/results" if batch.ended_at else None,
        }
    status = batch.status if batch.ended_at is not None else ("cancelling" if batch.cancel_at else "in_progress")
    if batch.errors and batch.ended_at is None:
        status = "validating"
    total = 0 if batch.errors else len(batch.requests)  # a file that failed validation holds no requests
    return {
        "id": batch.id,
        "object": "batch",
        "endpoint": "/v1/chat/completions",
        "errors": {"object": "list", "data": batch.errors} if batch.errors else None,
        "input_file_id": batch.input_file_id,
        "completion_window": "24h",
        "status": status,
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "created_at": int(batch.created_at),
        "in_progress_at": int(batch.created_at),
        "expires_at": int(batch.created_at + 86400),
        "completed_at": int(batch.ended_at) if batch.ended_at and status == "completed" else None,
        "failed_at": int(batch.ended_at) if batch.ended_at and status == "failed" else None,
        "expired_at": int(batch.ended_at) if batch.ended_at and status == "expired" else None,
        "cancelled_at": int(batch.ended_at) if batch.ended_at and status == "cancelled" else None,
        "cancelling_at": int(batch.cancel_at) if batch.cancel_at else None,
        "request_counts": {
            "total": total,
            "completed": c["succeeded"],
            "failed": c["errored"] + c["expired"] + c["canceled"],
        },
        "metadata": batch.metadata,
    }


def validate(lines: list[dict[str, Any]], cfg: Any) -> list[dict[str, Any]]:
    """OpenAI's rules for a batch input file; each broken one is an entry of the batch's ``errors``."""
    if len(lines) > cfg.batch_max_file_requests:
        return [
            {
                "code": "too_many_requests",
                "message": f"The batch input file has {len(lines)} requests, more than the maximum of "
                f"{cfg.batch_max_file_requests}.",
                "param": None,
                "line": None,
            }
        ]
    first = lines[0] if lines else {}
    for i, ln in enumerate(lines[1:], start=2):
        if ln.get("url") != first.get("url"):
            return [
                {
                    "code": "mismatched_endpoint",
                    "message": "All requests in a batch input file must use the same endpoint.",
                    "param": "url",
                    "line": i,
                }
            ]
        model, model_1 = (ln.get("body") or {}).get("model"), (first.get("body") or {}).get("model")
        if cfg.batch_one_model_per_file and model != model_1:
            return [
                {
                    "code": "mismatched_model",
                    "message": f"The model in line {i} ({model}) differs from the model in line 1 ({model_1}): "
                    "all requests in a batch input file must use the same model.",
                    "param": "body.model",
                    "line": i,
                }
            ]
    return []


def openai_output_lines(batch: Batch) -> tuple[list[str], list[str]]:
    """The lines of an ended OpenAI batch's output file and error file."""
    out: list[str] = []
    err: list[str] = []
    for r in batch.requests:
        kind, payload = batch.outcomes[r.custom_id]
        line: dict[str, Any] = {"id": f"batch_req_{uuid.uuid4().hex[:16]}", "custom_id": r.custom_id}
        if kind == "succeeded":
            out.append(json.dumps({**line, "response": {"status_code": 200, "body": payload}, "error": None}))
        elif kind == "errored":
            body = {"error": {"message": payload, "type": "server_error"}}
            out.append(json.dumps({**line, "response": {"status_code": 500, "body": body}, "error": None}))
        else:
            code = "batch_expired" if kind == "expired" else "batch_cancelled"
            err.append(json.dumps({**line, "response": None, "error": {"code": code, "message": kind}}))
    return out, err


def anthropic_result_lines(batch: Batch) -> list[str]:
    """The lines of an ended Anthropic batch's results download."""
    lines = []
    for r in batch.requests:
        kind, payload = batch.outcomes[r.custom_id]
        result: dict[str, Any] = {"type": kind}
        if kind == "succeeded":
            result["message"] = payload
        elif kind == "errored":
            result["error"] = {"type": "error", "error": {"type": "api_error", "message": payload}}
        lines.append(json.dumps({"custom_id": r.custom_id, "result": result}))
    return lines
