"""The OpenAI and Anthropic wire shapes of the fake provider's online endpoints, and the request key.

Why a module of its own: the request key (:func:`wire_key`) is what tests look calls up by, and the bodies it
reads and writes must match what the official SDKs send and accept; keeping both shapes in one place, apart
from the HTTP plumbing (:mod:`punchline.workers.fake.handler`) and the counters
(:mod:`punchline.workers.fake.state`), means one place spells each field. See
:mod:`punchline.workers.fake.server` for how the key is built.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from typing import Any

import msgspec

from punchline.data.requests import ProviderRequest

_ERROR_KINDS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def wire_key(
    model: str,
    messages: list[tuple[str, str]],
    temperature: float,
    max_tokens: int | None,
    n: int,
    stop: list[str],
    seed: int | None,
) -> str:
    canonical = [model, [[r, c] for r, c in messages], float(temperature), max_tokens, n, list(stop), seed]
    blob = json.dumps(canonical, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:40]


def request_wire_key(request: ProviderRequest, *, kind: str = "openai", supports_n: bool = True) -> str:
    """The key the fake counts a provider's calls for ``request`` under (see the module doc)."""
    messages: list[tuple[str, str]] = [(str(m.role), m.content) for m in request.messages]
    if kind == "anthropic":
        system = "\n\n".join(c for r, c in messages if r == "system")
        rest = [(r, c) for r, c in messages if r != "system"]
        messages = ([("system", system)] if system else []) + rest
        stop = [s for s in request.stop if s.strip()]
        return wire_key(request.model, messages, request.temperature, request.max_tokens, 1, stop, None)
    n = request.n if supports_n else 1
    return wire_key(
        request.model, messages, request.temperature, request.max_tokens, n, list(request.stop), request.seed
    )


def tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / 4)) if text else 0


class Parsed(msgspec.Struct):
    api: str  # "openai" or "anthropic"
    model: str
    messages: list[tuple[str, str]]
    temperature: float
    max_tokens: int | None
    n: int
    stop: list[str]
    seed: int | None

    def key(self) -> str:
        """The request's wire key (see the module doc of :mod:`punchline.workers.fake.server`)."""
        return wire_key(self.model, self.messages, self.temperature, self.max_tokens, self.n, self.stop, self.seed)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict))
    return ""


def parse(api: str, body: dict[str, Any]) -> Parsed:
    messages = [(str(m.get("role", "user")), _content_text(m.get("content"))) for m in body.get("messages", [])]
    stop_raw = body.get("stop" if api == "openai" else "stop_sequences") or []
    stop = [stop_raw] if isinstance(stop_raw, str) else [str(s) for s in stop_raw]
    if api == "anthropic":
        system = _content_text(body.get("system")) if body.get("system") else ""
        if system:
            messages = [("system", system), *messages]
        n = 1
        seed = None
    else:
        n = int(body.get("n") or 1)
        seed = body.get("seed")
    temperature = float(body.get("temperature", 1.0))
    return Parsed(api, str(body.get("model", "")), messages, temperature, body.get("max_tokens"), n, stop, seed)


def apply_stop(text: str, stop: list[str]) -> str:
    cut = len(text)
    for s in stop:
        if s and s in text:
            cut = min(cut, text.index(s))
    return text[:cut]


def error_body(api: str, status: int, message: str) -> dict[str, Any]:
    """An error response body in the API's shape."""
    kind = _ERROR_KINDS.get(status, "api_error")
    if api == "anthropic":
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {"error": {"message": message, "type": kind, "code": status}}


def completion_body(api: str, req: Parsed, texts: list[str], input_tokens: int, output_tokens: int) -> dict[str, Any]:
    """A 200 body in the API's shape (OpenAI: one choice per text; Anthropic: the first text)."""
    if api == "anthropic":
        return {
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "model": req.model,
            "content": [{"type": "text", "text": t} for t in texts[:1]],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
        }
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": req.model,
        "choices": [
            {"index": i, "message": {"role": "assistant", "content": t}, "finish_reason": "stop", "logprobs": None}
            for i, t in enumerate(texts)
        ],
        "usage": {
            "prompt_tokens": input_tokens,
            "completion_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
        },
    }
