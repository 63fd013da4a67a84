"""The Anthropic Messages wire, as the fake provider serves it (the ``anthropic`` kind's): the system prompt
apart, ``stop_sequences``, no ``n`` and no seed, one text block per answer."""

from __future__ import annotations

from typing import Any

from punchline.data.requests import ProviderRequest
from punchline.workers.fake.wire import SimulatedWire, WireRequest, content_text, error_type


class AnthropicWire(SimulatedWire):
    name = "anthropic"
    base_path = ""  # the SDK adds /v1 itself
    paths = ("/v1/messages", "/messages")
    key_headers = ("x-api-key", "anthropic-version")

    def parse(self, body: dict[str, Any]) -> WireRequest:
        if not body.get("model") or not body.get("messages"):
            raise ValueError("model and messages are required")
        messages = [(str(m.get("role", "user")), content_text(m.get("content"))) for m in body["messages"]]
        system = content_text(body.get("system")) if body.get("system") else ""
        if system:
            messages = [("system", system), *messages]
        stop_raw = body.get("stop_sequences") or []
        stop = [stop_raw] if isinstance(stop_raw, str) else [str(s) for s in stop_raw]
        temperature = float(body.get("temperature", 1.0))
        return WireRequest(str(body["model"]), messages, temperature, body.get("max_tokens"), 1, stop, None)

    def sent(self, request: ProviderRequest, supports_n: bool = True) -> WireRequest:
        """The system messages joined into one leading one, blank stop sequences dropped (the API refuses
        them), one choice per call and no seed."""
        del supports_n  # the Messages API never returns n choices
        messages = [(str(m.role), m.content) for m in request.messages]
        system = "\n\n".join(c for r, c in messages if r == "system")
        rest = [(r, c) for r, c in messages if r != "system"]
        messages = ([("system", system)] if system else []) + rest
        stop = [s for s in request.stop if s.strip()]
        return WireRequest(request.model, messages, request.temperature, request.max_tokens, 1, stop, None)

    def answer(self, request: WireRequest, texts: list[str], input_tokens: int, output_tokens: int) -> dict[str, Any]:
        """The first text (one choice per call)."""
        return {
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "model": request.model,
            "content": [{"type": "text", "text": t} for t in texts[:1]],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
        }

    def error(self, status: int, message: str) -> dict[str, Any]:
        return {"type": "error", "error": {"type": error_type(status), "message": message}}


WIRE = AnthropicWire()
