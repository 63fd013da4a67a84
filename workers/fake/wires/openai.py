"""The OpenAI chat completions wire, as the fake provider serves it (the ``openai`` kind's, and every kind's
that reuses it, such as ``litellm``): the bodies the official SDK sends and accepts, field for field."""

from __future__ import annotations

import time
from typing import Any

from punchline.workers.fake.wire import SimulatedWire, WireRequest, content_text, error_type


class OpenAIWire(SimulatedWire):
    name = "openai"
    base_path = "/v1"
    paths = ("/v1/chat/completions", "/chat/completions")

    def parse(self, body: dict[str, Any]) -> WireRequest:
        if not body.get("model") or not body.get("messages"):
            raise ValueError("model and messages are required")
        messages = [(str(m.get("role", "user")), content_text(m.get("content"))) for m in body["messages"]]
        stop_raw = body.get("stop") or []
        stop = [stop_raw] if isinstance(stop_raw, str) else [str(s) for s in stop_raw]
        temperature = float(body.get("temperature", 1.0))
        n = int(body.get("n") or 1)
        return WireRequest(str(body["model"]), messages, temperature, body.get("max_tokens"), n, stop, body.get("seed"))

    def answer(self, request: WireRequest, texts: list[str], input_tokens: int, output_tokens: int) -> dict[str, Any]:
        """One choice per text."""
        return {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.model,
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

    def error(self, status: int, message: str) -> dict[str, Any]:
        return {"error": {"message": message, "type": error_type(status), "code": status}}


WIRE = OpenAIWire()
