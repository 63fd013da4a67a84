"""The fake provider's HTTP plumbing: routes, authorization, fault injection for one completion call.

Why a module of its own: this is the part that speaks HTTP (headers, Nagle, cut bodies, dropped connections);
what it answers comes from :mod:`punchline.workers.fake.state`, and the shapes from the simulated wire whose path
was called (each installed kind's, :mod:`punchline.workers.fake.kind_wires`), so it names no API: a new kind's
wire, or a change to one's shape, does not touch the routing.
"""

from __future__ import annotations

import json
import math
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import msgspec

from punchline.data.simulator import FakeConfig
from punchline.workers.fake.batches import BATCH_PATHS
from punchline.workers.fake.draws import unit
from punchline.workers.fake.state import ServerState, answer_texts, billed_tokens, knob_models
from punchline.workers.fake.wire import SimulatedWire, WireRequest
from punchline.workers.providers.base import CHOICE_OFFSET_HEADER


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body leave in two writes; with Nagle on, the body waits for the client's delayed ACK of
    # the headers (40 ms on Linux) - a stall no real provider has, which capped every client at 0.8 of
    # C / latency in bench/engine_vs_loop.py.
    disable_nagle_algorithm = True
    server: FakeHTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        del format, args

    # --- plumbing ---------------------------------------------------------------------------

    def _read_json(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        return json.loads(raw) if raw else {}

    def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None, *, cut: bool = False) -> None:
        body = json.dumps(payload, ensure_ascii=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if cut:
            self.send_header("Connection", "close")
        self.end_headers()
        if cut:
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body)

    def _error(self, wire: SimulatedWire, status: int, message: str, retry_after_s: float | None = None) -> None:
        headers = {}
        if retry_after_s is not None:
            headers["Retry-After"] = str(max(1, math.ceil(retry_after_s)))
            headers["retry-after-ms"] = str(max(1, round(retry_after_s * 1000)))
        rpm = self.server.state.config.requests_per_minute
        if status == 429 and rpm:  # what real providers say about their limit (per minute, OpenAI's names)
            headers["x-ratelimit-limit-requests"] = f"{rpm:g}"
            headers["x-ratelimit-remaining-requests"] = "0"
        self._send(status, wire.error(status, message), headers)

    # --- routes -----------------------------------------------------------------------------

    def do_GET(self) -> None:
        state = self.server.state
        if self.path.startswith(BATCH_PATHS):
            state.batches.handle(self, "GET", state.config, state.stop_event)
        elif self.path in ("/stats", "/stats?brief=1"):
            self._send(200, msgspec.to_builtins(state.stats(brief=self.path.endswith("brief=1"))))
        elif self.path == "/batch-stats":
            self._send(200, msgspec.to_builtins(state.batches.snapshot()))
        elif self.path == "/config":
            self._send(200, msgspec.to_builtins(state.config))
        elif self.path == "/health":
            self._send(200, {"ok": True})
        elif self.path.split("?")[0] in ("/v1/models", "/models"):
            self._models()
        else:
            self._send(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:
        state = self.server.state
        if self.path.startswith(BATCH_PATHS):
            state.batches.handle(self, "POST", state.config, state.stop_event)
            return
        try:
            body = self._read_json()
        except (ValueError, UnicodeDecodeError):
            self._send(400, {"error": {"message": "body is not JSON", "type": "invalid_request_error"}})
            return
        if self.path == "/reset":
            state.reset()
            self._send(200, {"ok": True})
        elif self.path == "/batch-seed":
            try:
                self._send(200, {"ids": state.batches.seed(body)})
            except (ValueError, TypeError) as exc:
                self._send(400, {"error": {"message": f"bad seed: {exc}"}})
        elif self.path == "/configure":
            try:
                merged = {**msgspec.to_builtins(state.defaults), **body}
                state.set_config(msgspec.convert(merged, FakeConfig))
            except (msgspec.ValidationError, ValueError) as exc:
                self._send(400, {"error": {"message": str(exc)}})
                return
            self._send(200, msgspec.to_builtins(state.config))
        elif self.path in state.wires.by_path:
            with state.holding():
                self._complete(state.wires.by_path[self.path], body)
        else:
            self._send(404, {"error": {"message": f"no route {self.path}"}})

    def _authorized(self, wire: SimulatedWire) -> bool:
        """With ``require_api_key`` set, any other key gets 401 (echoing a masked key)."""
        required = self.server.state.config.require_api_key
        if required is None:
            return True
        given = self.headers.get("x-api-key") or (self.headers.get("Authorization") or "").removeprefix("Bearer ")
        if given == required:
            return True
        self.server.state.count("unauthorized")
        masked = f"{given[:3]}***{given[-4:]}" if len(given) > 8 else "***"
        self._error(wire, 401, f"Incorrect API key provided: {masked}")
        return False

    def _models(self) -> None:
        """``GET /v1/models``, the cheap authenticated request a driver makes before a run: the
        models this fake knows, in a shape both SDKs accept (OpenAI's list, Anthropic's page); a refused key in
        the shape of the wire whose SDK asks."""
        state = self.server.state
        with state.lock:
            state.models_calls += 1
        if not self._authorized(state.wires.of_headers(self.headers.get)):
            return
        names = sorted({*knob_models(state.config), "sim/llama-3b", "sim/llama-70b"})
        data = [
            {"id": n, "object": "model", "type": "model", "created": 0, "owned_by": "fake", "display_name": n,
             "created_at": "2024-01-01T00:00:00Z"}
            for n in names
        ]  # fmt: skip
        self._send(200, {"object": "list", "data": data, "has_more": False, "first_id": names[0], "last_id": names[-1]})

    def _complete(self, wire: SimulatedWire, body: dict[str, Any]) -> None:
        state = self.server.state
        cfg = state.config
        try:
            req = wire.parse(body)
        except ValueError as exc:  # like a real API: refused for free, not counted
            self._error(wire, 400, str(exc))
            return
        key = req.key()
        try:
            offset = int(self.headers.get(CHOICE_OFFSET_HEADER) or 0)
        except ValueError:
            offset = 0
        attempt, retry_after = state.admit(key, offset, req.model)
        if retry_after is not None:
            self._error(wire, 429, "rate limit exceeded (fake provider)", retry_after)
            return
        latency_s = (
            cfg.latency_ms_for_model[req.model]
            if req.model in cfg.latency_ms_for_model
            else cfg.latency_ms_min + (cfg.latency_ms_max - cfg.latency_ms_min) * unit(cfg.seed, key, attempt)
        ) / 1e3
        if latency_s > 0 and state.stop_event.wait(latency_s):
            return
        if req.model in cfg.status_for_model:
            state.count("status_for_model")
            status = cfg.status_for_model[req.model]
            self._error(wire, status, f"model {req.model!r} answered {status} by configuration")
            return
        if not self._authorized(wire):
            return
        if attempt < cfg.fail_first_attempts:
            state.count("fail_first")
            self._error(wire, cfg.fail_status, f"injected failure (attempt {attempt})", cfg.fail_retry_after_s)
            return
        for fault, rate in (
            ("error_500", cfg.error_500_rate),
            ("error_503", cfg.error_503_rate),
            ("hang", cfg.hang_rate),
            ("truncated", cfg.truncated_body_rate),
            ("malformed", cfg.malformed_rate),
        ):
            if rate > 0 and unit(cfg.seed, key, offset, attempt, fault) < rate:
                state.count(fault)
                self._fault(wire, fault, req)
                return
        self._answer(wire, req, offset)

    def _fault(self, wire: SimulatedWire, fault: str, req: WireRequest) -> None:
        state = self.server.state
        if fault == "error_500":
            self._error(wire, 500, "injected internal error")
        elif fault == "error_503":
            self._error(wire, 503, "injected overload")
        elif fault == "hang":
            state.stop_event.wait(state.config.hang_s)
            self.close_connection = True
        elif fault == "truncated":
            self._send(200, wire.answer(req, ["truncated " * 20], 1, 1), cut=True)
        elif fault == "malformed":
            self._send(200, wire.answer(req, [], 1, 0))

    def _answer(self, wire: SimulatedWire, req: WireRequest, offset: int) -> None:
        state = self.server.state
        texts = answer_texts(state, req, offset)
        input_tokens, output_tokens = billed_tokens(state.config, req, texts)
        state.success(req.model, input_tokens, output_tokens)
        self._send(200, wire.answer(req, texts, input_tokens, output_tokens))


class FakeHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], state: ServerState) -> None:
        self.state = state
        super().__init__(address, Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client that gave up (its timeout, a killed worker) is routine here, not worth a traceback
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)
