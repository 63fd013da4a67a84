"""The fake provider's mutable state: counters, attempt numbers, rate limit, knobs, and the answers it gives.

Why a module of its own: the HTTP handler (:mod:`punchline.workers.fake.handler`) and the batch endpoints
(:mod:`punchline.workers.fake.batches`) both answer from this state, and the determinism rules of
:mod:`punchline.workers.fake.server` (faults decided by a hash, :func:`punchline.workers.fake.draws.unit`;
attempts counted per key and offset) live here, behind one lock.

**Memory.** A server made for tests counts every key's calls and attempts for its whole life (``stats().calls``
says how often each request was made). A run's simulator (``per_key=False``) serves a run of any size in the
driver, so it keeps neither for a key it need not (issue 42: 0.4 KB a unit): no per-key call counts, and attempt
numbers only while a knob reads them (:func:`attempts_matter`: ``fail_first_attempts``, a fault rate, a latency
range). Without those knobs every attempt is answered as the first, so the answers are the same.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from typing import Any

import msgspec

from punchline.data.answer_format import StageAnswers
from punchline.data.simulator import FakeConfig, SimRequest
from punchline.schedulers.budget import messages_tokens_bound
from punchline.workers.fake.answers import answer
from punchline.workers.fake.batches import BatchBook
from punchline.workers.fake.kind_wires import KindWires
from punchline.workers.fake.simulators import Simulator, decode_knobs
from punchline.workers.fake.stage_answers import StageBook
from punchline.workers.fake.wire import WireRequest, apply_stop, tokens, wire_key

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
    # model id -> [input, output] tokens billed by the online endpoints (what a test prices the provider's bill by)
    tokens_by_model: dict[str, list[int]] = {}
    models_calls: int = 0  # GET /v1/models (free: not in total_calls)
    peak_in_flight: int = 0  # the most completion calls it held at once (a client's in-flight bound, seen from here)


class ServerState:
    """Mutable server state, guarded by one lock."""

    def __init__(
        self,
        config: FakeConfig,
        simulators: Sequence[Simulator],
        wires: KindWires,
        stages: Sequence[StageAnswers] = (),
        *,
        per_key: bool = True,
    ) -> None:
        self.lock = threading.Lock()
        self.per_key = per_key  # count calls and attempts of every key (see the module doc)
        self.stop_event = threading.Event()
        self.defaults = config
        self.config = config
        self.simulators = list(simulators)
        self.wires = wires  # the APIs it speaks (the installed kinds' simulated wires)
        self.knobs = decode_knobs(self.simulators, config.pipeline_knobs)  # each pipeline's, decoded once
        self.stage_answers = list(stages)  # the run's generic stages' (the driver asked them): not a knob
        self.stages = stage_book(config, self.stage_answers)  # compiled once
        self.batches = BatchBook(lambda api, body, offset: completion(self, api, body, offset))
        self.window: deque[float] = deque()  # admitted calls' times, with rate_limit_window_s
        self.in_flight = 0  # completion calls since the last reset being answered (holding)
        self.generation = 0  # counts resets: a call that came before the last one is no longer counted in flight
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
            self.tokens_by_model: dict[str, list[int]] = {}
            self.models_calls = 0
            # calls being answered now (a hung call of an earlier test) end unseen: the peak is this test's own
            self.generation += 1
            self.in_flight = 0
            self.peak_in_flight = 0
            self.tat = 0.0
            self.window.clear()
        self.batches.reset()

    def set_config(self, config: FakeConfig) -> None:
        """New knobs (a ValueError, before anything changes, when a pipeline's knobs are wrong)."""
        knobs = decode_knobs(self.simulators, config.pipeline_knobs)
        stages = stage_book(config, self.stage_answers)
        with self.lock:
            self.config = config
            self.knobs = knobs
            self.stages = stages
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
                tokens_by_model={m: list(t) for m, t in self.tokens_by_model.items()},
                models_calls=self.models_calls,
                peak_in_flight=self.peak_in_flight,
            )

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """Count a completion call in flight while it is answered."""
        with self.lock:
            generation = self.generation
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            yield
        finally:
            with self.lock:
                if generation == self.generation:
                    self.in_flight -= 1

    def admit(self, key: str, offset: int, model: str) -> tuple[int, float | None]:
        """Count the call; returns (attempt number, retry-after seconds if rate limited)."""
        cfg = self.config
        with self.lock:
            self.total += 1
            if self.per_key:
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
            if not self.per_key and not attempts_matter(cfg):
                return 0, None
            attempt = self.attempts[(key, offset)]
            self.attempts[(key, offset)] += 1
            return attempt, None

    def count(self, fault: str) -> None:
        with self.lock:
            self.faults[fault] += 1

    def success(self, model: str, input_tokens: int, output_tokens: int) -> None:
        with self.lock:
            self.ok += 1
            self.input_tokens += input_tokens
            self.output_tokens += output_tokens
            billed = self.tokens_by_model.setdefault(model, [0, 0])
            billed[0] += input_tokens
            billed[1] += output_tokens


def attempts_matter(config: FakeConfig) -> bool:
    """Whether an answer may depend on its attempt number: a knob that fails the first attempts, a fault drawn per
    attempt, or a latency drawn per attempt (the handler reads the attempt for these alone)."""
    rates = (
        config.error_500_rate,
        config.error_503_rate,
        config.hang_rate,
        config.truncated_body_rate,
        config.malformed_rate,
    )
    return config.fail_first_attempts > 0 or any(r > 0 for r in rates) or config.latency_ms_max != config.latency_ms_min


def billed_tokens(config: FakeConfig, req: WireRequest, texts: list[str]) -> tuple[int, int]:
    """(input, output) tokens the answer ``texts`` to ``req`` is billed, by the ``billing`` knob: ``chars`` (the
    default) counts characters / 4 of each message and answer; ``worst_case`` bills what a real provider may at
    most, the bound the run's budget holds before a call (every UTF-8 byte of input a token, plus a chat template's
    tokens per message and per request, and ``max_tokens`` per answer, where a provider stops), so a test sees
    whether spend can pass ``max_cost_usd`` when a provider's tokenizer is as costly as any can be."""
    if config.billing == "worst_case":
        per_answer = req.max_tokens if req.max_tokens is not None else max((tokens(t) for t in texts), default=0)
        return messages_tokens_bound([c for _, c in req.messages]), per_answer * len(texts)
    return sum(tokens(c) for _, c in req.messages), sum(tokens(t) for t in texts)


def answer_texts(state: ServerState, req: WireRequest, offset: int) -> list[str]:
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
    knobs, stages = state.knobs, state.stages
    return [
        apply_stop(answer(msgspec.structs.replace(base, choice=offset + j), state.simulators, knobs, stages), req.stop)
        for j in range(req.n)
    ]


def stage_book(config: FakeConfig, stages: Sequence[StageAnswers]) -> StageBook:
    """The run's generic stages' answers, each model right at its ``accuracy``."""
    return StageBook(stages, config.accuracy, config.judge_flip_rate)


def knob_models(config: FakeConfig) -> set[str]:
    """The model ids the pipelines' knobs are keyed by (a per-model table, e.g. a skill per model)."""
    return {
        str(model)
        for table in config.pipeline_knobs.values()
        for value in table.values()
        if isinstance(value, dict)
        for model in value
    }


def completion(state: ServerState, api: str, body: dict[str, Any], offset: int) -> tuple[dict[str, Any], str]:
    """The online endpoint's 200 body for one request body of the wire named ``api``, and the request's wire key
    (for batches); a ValueError when that wire refuses the body."""
    wire = state.wires.by_name[api]
    req = wire.parse(body)
    texts = answer_texts(state, req, offset)
    input_tokens, output_tokens = billed_tokens(state.config, req, texts)
    return wire.answer(req, texts, input_tokens, output_tokens), req.key()
