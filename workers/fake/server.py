"""A fake LLM provider over real HTTP on 127.0.0.1, spoken to by the official OpenAI and Anthropic SDKs.

Tests and offline runs point a provider's ``base_url`` at it (``server.openai_base_url`` for
``kind = "openai"``, ``server.anthropic_base_url`` for ``kind = "anthropic"``). It answers
deterministically (see :mod:`punchline.workers.fake.answers`: the installed pipelines' own answers first, then
generic ones) and injects faults on demand.

**Request key.** Calls are counted per *wire key*: the first 40 hex digits of the sha256 of the
canonical JSON array ``[model, [[role, content], ...], temperature, max_tokens, n, stop, seed]``
built from the request body (Anthropic's ``system`` becomes a leading system message, its
``stop_sequences`` are ``stop``, its ``n`` is 1). :func:`request_wire_key` computes the same key from
a :class:`~punchline.workers.provider.ProviderRequest`, so a test can look up the calls one request caused.

**Determinism.** Every fault is decided by a hash of (seed, wire key, choice offset, attempt number,
fault name), where the attempt number counts the earlier non-rate-limited calls with the same key
and offset. A test that replays the same calls therefore sees the same faults, whatever the timing.
``fail_first_attempts`` fails exactly the first K attempts of every key with ``fail_status``, which
makes retry tests exact. The one timing-dependent fault is the rate limit: a real GCRA check.

**Choice offset.** A provider that splits an ``n``-sample request into single calls (or a unit that
asks for sample slot ``s``) sends the header ``X-Choice-Offset``; choice ``j`` of that call is then
answered as choice ``offset + j``, so a split request gets the same texts as one ``n`` call.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import sys
import threading
import time
import urllib.request
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import msgspec

from punchline.data.provider_settings import ProviderKind, ProviderSettings
from punchline.data.requests import ProviderRequest
from punchline.data.simulator import FakeConfig, SimRequest
from punchline.workers.fake.answers import answer
from punchline.workers.fake.batches import BATCH_PATHS, BatchBook, BatchStats
from punchline.workers.fake.simulators import Simulator, decode_knobs, find_simulators
from punchline.workers.providers.base import CHOICE_OFFSET_HEADER

FAULTS = (
    "rate_limited",
    "status_for_model",
    "unauthorized",
    "fail_first",
    "error_500",
    "error_503",
    "hang",
    "truncated",
    "malformed",
)


class FakeStats(msgspec.Struct, kw_only=True):
    total_calls: int = 0
    ok: int = 0
    calls: dict[str, int] = {}
    calls_by_model: dict[str, int] = {}
    faults: dict[str, int] = {}
    input_tokens: int = 0
    output_tokens: int = 0
    models_calls: int = 0  # GET /v1/models (free: not in total_calls)
    peak_in_flight: int = 0  # the most completion calls it held at once (a client's in-flight bound, seen from here)


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


def _unit(seed: int, *parts: object) -> float:
    digest = hashlib.sha256("|".join(str(p) for p in (seed, *parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def _tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / 4)) if text else 0


class _State:
    """Mutable server state, guarded by one lock."""

    def __init__(self, config: FakeConfig, simulators: Sequence[Simulator]) -> None:
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.defaults = config
        self.config = config
        self.simulators = list(simulators)
        self.knobs = decode_knobs(self.simulators, config.pipeline_knobs)  # each pipeline's, decoded once
        self.batches = BatchBook(lambda api, body, offset: completion(self, api, body, offset))
        self.window: deque[float] = deque()  # admitted calls' times, with rate_limit_window_s
        self.in_flight = 0  # completion calls being answered (holding)
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.calls: Counter[str] = Counter()
            self.attempts: Counter[tuple[str, int]] = Counter()
            self.by_model: Counter[str] = Counter()
            self.faults: Counter[str] = Counter()
            self.total = 0
            self.ok = 0
            self.input_tokens = 0
            self.output_tokens = 0
            self.models_calls = 0
            self.peak_in_flight = self.in_flight  # calls being answered now still end (and count down)
            self.tat = 0.0
            self.window.clear()
        self.batches.reset()

    def set_config(self, config: FakeConfig) -> None:
        """New knobs (a ValueError, before anything changes, when a pipeline's knobs are wrong)."""
        knobs = decode_knobs(self.simulators, config.pipeline_knobs)
        with self.lock:
            self.config = config
            self.knobs = knobs
            self.tat = 0.0
            self.window.clear()

    def stats(self, *, brief: bool = False) -> FakeStats:
        """The counters; ``brief`` leaves out the per-key call counts (one entry per request ever made),
        which a poller that only wants the totals would otherwise copy and encode every time."""
        with self.lock:
            return FakeStats(
                total_calls=self.total,
                ok=self.ok,
                calls={} if brief else dict(self.calls),
                calls_by_model=dict(self.by_model),
                faults={f: self.faults[f] for f in FAULTS},
                input_tokens=self.input_tokens,
                output_tokens=self.output_tokens,
                models_calls=self.models_calls,
                peak_in_flight=self.peak_in_flight,
            )

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """Count a completion call in flight while it is answered."""
        with self.lock:
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            yield
        finally:
            with self.lock:
                self.in_flight -= 1

    def admit(self, key: str, offset: int, model: str) -> tuple[int, float | None]:
        """Count the call; returns (attempt number, retry-after seconds if rate limited)."""
        cfg = self.config
        with self.lock:
            self.total += 1
            self.calls[key] += 1
            self.by_model[model] += 1
            if cfg.requests_per_minute and cfg.rate_limit_window_s > 0:
                now = time.monotonic()
                window = self.window
                while window and window[0] <= now - cfg.rate_limit_window_s:
                    window.popleft()
                if len(window) >= cfg.requests_per_minute * cfg.rate_limit_window_s / 60.0:
                    self.faults["rate_limited"] += 1
                    return -1, window[0] + cfg.rate_limit_window_s - now
                window.append(now)
            elif cfg.requests_per_minute:
                interval = 60.0 / cfg.requests_per_minute
                burst = cfg.rate_limit_burst or max(1.0, cfg.requests_per_minute / 60.0)
                now = time.monotonic()
                new_tat = max(self.tat, now) + interval
                if new_tat - now > burst * interval + 1e-9:
                    self.faults["rate_limited"] += 1
                    return -1, new_tat - now - burst * interval
                self.tat = new_tat
            attempt = self.attempts[(key, offset)]
            self.attempts[(key, offset)] += 1
            return attempt, None

    def count(self, fault: str) -> None:
        with self.lock:
            self.faults[fault] += 1

    def success(self, input_tokens: int, output_tokens: int) -> None:
        with self.lock:
            self.ok += 1
            self.input_tokens += input_tokens
            self.output_tokens += output_tokens


class _Parsed(msgspec.Struct):
    api: str  # "openai" or "anthropic"
    model: str
    messages: list[tuple[str, str]]
    temperature: float
    max_tokens: int | None
    n: int
    stop: list[str]
    seed: int | None


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict))
    return ""


def _parse(api: str, body: dict[str, Any]) -> _Parsed:
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
    return _Parsed(api, str(body.get("model", "")), messages, temperature, body.get("max_tokens"), n, stop, seed)


def _apply_stop(text: str, stop: list[str]) -> str:
    cut = len(text)
    for s in stop:
        if s and s in text:
            cut = min(cut, text.index(s))
    return text[:cut]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body leave in two writes; with Nagle on, the body waits for the client's delayed ACK of
    # the headers (40 ms on Linux) - a stall no real provider has, which capped every client at 0.8 of
    # C / latency in bench/engine_vs_loop.py.
    disable_nagle_algorithm = True
    server: _HTTPServer

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

    def _error(self, api: str, status: int, message: str, retry_after_s: float | None = None) -> None:
        kinds = {
            400: "invalid_request_error",
            401: "authentication_error",
            403: "permission_error",
            404: "not_found_error",
            429: "rate_limit_error",
            503: "overloaded_error",
        }
        kind = kinds.get(status, "api_error")
        headers = {}
        if retry_after_s is not None:
            headers["Retry-After"] = str(max(1, math.ceil(retry_after_s)))
            headers["retry-after-ms"] = str(max(1, round(retry_after_s * 1000)))
        rpm = self.server.state.config.requests_per_minute
        if status == 429 and rpm:  # what real providers say about their limit (per minute, OpenAI's names)
            headers["x-ratelimit-limit-requests"] = f"{rpm:g}"
            headers["x-ratelimit-remaining-requests"] = "0"
        if api == "anthropic":
            payload: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": message}}
        else:
            payload = {"error": {"message": message, "type": kind, "code": status}}
        self._send(status, payload, headers)

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
        elif self.path in ("/v1/chat/completions", "/chat/completions"):
            with state.holding():
                self._complete("openai", body)
        elif self.path in ("/v1/messages", "/messages"):
            with state.holding():
                self._complete("anthropic", body)
        else:
            self._send(404, {"error": {"message": f"no route {self.path}"}})

    def _authorized(self, api: str) -> bool:
        """With ``require_api_key`` set, any other key gets 401 (echoing a masked key)."""
        required = self.server.state.config.require_api_key
        if required is None:
            return True
        given = self.headers.get("x-api-key") or (self.headers.get("Authorization") or "").removeprefix("Bearer ")
        if given == required:
            return True
        self.server.state.count("unauthorized")
        masked = f"{given[:3]}***{given[-4:]}" if len(given) > 8 else "***"
        self._error(api, 401, f"Incorrect API key provided: {masked}")
        return False

    def _models(self) -> None:
        """``GET /v1/models``, the cheap authenticated request a driver makes before a run: the
        models this fake knows, in a shape both SDKs accept (OpenAI's list, Anthropic's page)."""
        state = self.server.state
        with state.lock:
            state.models_calls += 1
        api = "anthropic" if self.headers.get("x-api-key") or self.headers.get("anthropic-version") else "openai"
        if not self._authorized(api):
            return
        names = sorted({*_knob_models(state.config), "sim/llama-3b", "sim/llama-70b"})
        data = [
            {"id": n, "object": "model", "type": "model", "created": 0, "owned_by": "fake", "display_name": n,
             "created_at": "2024-01-01T00:00:00Z"}
            for n in names
        ]  # fmt: skip
        self._send(200, {"object": "list", "data": data, "has_more": False, "first_id": names[0], "last_id": names[-1]})

    def _complete(self, api: str, body: dict[str, Any]) -> None:
        state = self.server.state
        cfg = state.config
        if not body.get("model") or not body.get("messages"):  # like a real API: refused for free, not counted
            self._error(api, 400, "model and messages are required")
            return
        req = _parse(api, body)
        key = wire_key(req.model, req.messages, req.temperature, req.max_tokens, req.n, req.stop, req.seed)
        try:
            offset = int(self.headers.get(CHOICE_OFFSET_HEADER) or 0)
        except ValueError:
            offset = 0
        attempt, retry_after = state.admit(key, offset, req.model)
        if retry_after is not None:
            self._error(api, 429, "rate limit exceeded (fake provider)", retry_after)
            return
        latency_s = (
            cfg.latency_ms_for_model[req.model]
            if req.model in cfg.latency_ms_for_model
            else cfg.latency_ms_min + (cfg.latency_ms_max - cfg.latency_ms_min) * _unit(cfg.seed, key, attempt)
        ) / 1e3
        if latency_s > 0 and state.stop_event.wait(latency_s):
            return
        if req.model in cfg.status_for_model:
            state.count("status_for_model")
            status = cfg.status_for_model[req.model]
            self._error(api, status, f"model {req.model!r} answered {status} by configuration")
            return
        if not self._authorized(api):
            return
        if attempt < cfg.fail_first_attempts:
            state.count("fail_first")
            self._error(api, cfg.fail_status, f"injected failure (attempt {attempt})", cfg.fail_retry_after_s)
            return
        for fault, rate in (
            ("error_500", cfg.error_500_rate),
            ("error_503", cfg.error_503_rate),
            ("hang", cfg.hang_rate),
            ("truncated", cfg.truncated_body_rate),
            ("malformed", cfg.malformed_rate),
        ):
            if rate > 0 and _unit(cfg.seed, key, offset, attempt, fault) < rate:
                state.count(fault)
                self._fault(api, fault, req)
                return
        self._answer(api, req, key, offset)

    def _fault(self, api: str, fault: str, req: _Parsed) -> None:
        state = self.server.state
        if fault == "error_500":
            self._error(api, 500, "injected internal error")
        elif fault == "error_503":
            self._error(api, 503, "injected overload")
        elif fault == "hang":
            state.stop_event.wait(state.config.hang_s)
            self.close_connection = True
        elif fault == "truncated":
            self._send(200, self._payload(api, req, ["truncated " * 20], 1, 1), cut=True)
        elif fault == "malformed":
            self._send(200, self._payload(api, req, [], 1, 0))

    def _answer(self, api: str, req: _Parsed, key: str, offset: int) -> None:
        state = self.server.state
        texts = answer_texts(state, req, offset)
        input_tokens = sum(_tokens(c) for _, c in req.messages)
        output_tokens = sum(_tokens(t) for t in texts)
        state.success(input_tokens, output_tokens)
        self._send(200, self._payload(api, req, texts, input_tokens, output_tokens))

    @staticmethod
    def _payload(api: str, req: _Parsed, texts: list[str], input_tokens: int, output_tokens: int) -> dict[str, Any]:
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


def answer_texts(state: _State, req: _Parsed, offset: int) -> list[str]:
    """The texts the online endpoints answer ``req`` with (the batch endpoints give the same)."""
    # Answers ignore ``n`` so that n single calls (with offsets) give the texts of one n call.
    key = wire_key(req.model, req.messages, req.temperature, req.max_tokens, 1, req.stop, req.seed)
    cfg = state.config
    system = "\n\n".join(c for r, c in req.messages if r == "system")
    user = next((c for r, c in reversed(req.messages) if r == "user"), "")
    base = SimRequest(
        key=key,
        choice=offset,
        model=req.model,
        system=system,
        user=user,
        temperature=req.temperature,
        seed=cfg.seed,
        noise_rate=cfg.noise_rate,
        format_variant_rate=cfg.format_variant_rate,
        judge_flip_rate=cfg.judge_flip_rate,
    )
    knobs = state.knobs
    return [
        _apply_stop(answer(msgspec.structs.replace(base, choice=offset + j), state.simulators, knobs), req.stop)
        for j in range(req.n)
    ]


def _knob_models(config: FakeConfig) -> set[str]:
    """The model ids the pipelines' knobs are keyed by (a per-model table, e.g. a skill per model)."""
    return {
        str(model)
        for table in config.pipeline_knobs.values()
        for value in table.values()
        if isinstance(value, dict)
        for model in value
    }


def completion(state: _State, api: str, body: dict[str, Any], offset: int) -> tuple[dict[str, Any], str]:
    """The online endpoint's 200 body for one request body, and the request's wire key (for batches)."""
    req = _parse(api, body)
    key = wire_key(req.model, req.messages, req.temperature, req.max_tokens, req.n, req.stop, req.seed)
    texts = answer_texts(state, req, offset)
    input_tokens = sum(_tokens(c) for _, c in req.messages)
    output_tokens = sum(_tokens(t) for t in texts)
    return _Handler._payload(api, req, texts, input_tokens, output_tokens), key


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], state: _State) -> None:
        self.state = state
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client that gave up (its timeout, a killed worker) is routine here, not worth a traceback
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)


class FakeProviderServer:
    """The fake provider in a background thread; ``with FakeProviderServer(cfg) as srv: srv.url``."""

    def __init__(
        self,
        config: FakeConfig | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        simulators: Sequence[Simulator] | None = None,
    ) -> None:
        """``simulators``: the pipelines whose answers it gives (default: those ``config.simulators`` names, then
        every installed pipeline's, found through the entry points); a bad ``pipeline_knobs`` table is a ValueError
        naming it."""
        config = config or FakeConfig()
        self._state = _State(config, find_simulators(config.simulators) if simulators is None else simulators)
        self._address = (host, port)
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> str:
        if self._httpd is None:
            self._state.stop_event.clear()
            self._httpd = _HTTPServer(self._address, self._state)
            self._thread = threading.Thread(target=self._httpd.serve_forever, name="fake-provider", daemon=True)
            self._thread.start()
        return self.url

    def serve_forever(self, on_ready: Callable[[str], None] | None = None) -> None:
        """Run in the calling thread (the ``fake-provider`` command) until interrupted."""
        self._httpd = _HTTPServer(self._address, self._state)
        if on_ready is not None:
            on_ready(self.url)
        try:
            self._httpd.serve_forever()
        finally:
            self._state.stop_event.set()
            self._httpd.server_close()

    def stop(self) -> None:
        self._state.stop_event.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None
        self._thread = None

    def __enter__(self) -> FakeProviderServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("the fake provider is not running")
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def openai_base_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def anthropic_base_url(self) -> str:
        return self.url

    def provider_settings(self, kind: ProviderKind = "openai", **overrides: Any) -> ProviderSettings:
        """Settings of a provider that talks to this server (``timeout_s`` etc. via ``overrides``)."""
        base_url = self.openai_base_url if kind == "openai" else self.anthropic_base_url
        return ProviderSettings(kind=kind, base_url=base_url, **overrides)

    @property
    def config(self) -> FakeConfig:
        return self._state.config

    def stats(self) -> FakeStats:
        return self._state.stats()

    def batch_stats(self) -> BatchStats:
        """Batches created and requests billed per custom id by the batch endpoints."""
        return self._state.batches.snapshot()

    def reset(self) -> None:
        """Clear the counters, attempt numbers and rate-limit state (not the knobs)."""
        self._state.reset()

    def seed_foreign_batches(self, api: str, count: int, **spec: Any) -> list[str]:
        """Other users' batches on the account (``POST /batch-seed``): see :meth:`BatchBook.seed`."""
        return self._state.batches.seed({"api": api, "count": count, **spec})

    def configure(self, **knobs: Any) -> FakeConfig:
        """Set knobs on top of the defaults given at construction (earlier ``configure`` calls are dropped)."""
        merged = {**msgspec.to_builtins(self._state.defaults), **knobs}
        config = msgspec.convert(merged, FakeConfig)
        self._state.set_config(config)
        return config

    def restore_defaults(self) -> None:
        self._state.set_config(self._state.defaults)


def fetch_stats(url: str, *, timeout_s: float = 5.0, brief: bool = False) -> FakeStats:
    """``GET /stats`` of a fake provider running elsewhere (another process or node); ``brief``: without
    the per-key call counts."""
    query = "?brief=1" if brief else ""
    with urllib.request.urlopen(f"{url.rstrip('/')}/stats{query}", timeout=timeout_s) as resp:
        return msgspec.json.decode(resp.read(), type=FakeStats)


def reset_remote(url: str, *, timeout_s: float = 10.0) -> None:
    """``POST /reset`` of a fake provider running elsewhere: its counters zeroed between two measured runs."""
    req = urllib.request.Request(f"{url.rstrip('/')}/reset", data=b"{}", method="POST")
    with urllib.request.urlopen(req, timeout=timeout_s):
        pass


def fetch_batch_stats(url: str, *, timeout_s: float = 5.0) -> BatchStats:
    """``GET /batch-stats`` of a fake provider running elsewhere."""
    with urllib.request.urlopen(f"{url.rstrip('/')}/batch-stats", timeout=timeout_s) as resp:
        return msgspec.json.decode(resp.read(), type=BatchStats)


def load_knobs(path: str | Path) -> FakeConfig:
    """A ``FakeConfig`` from a TOML file (top-level keys are the knobs)."""
    return msgspec.toml.decode(Path(path).read_bytes(), type=FakeConfig)
