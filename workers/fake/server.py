"""A fake LLM provider over real HTTP on 127.0.0.1, spoken to by the providers' own SDKs.

It speaks the simulated wire of every installed provider kind (its offline twin, found through the kinds
registry: :mod:`~punchline.workers.fake.kind_wires`): punchline's own, OpenAI's and Anthropic's, and any a
plug-in's kind brings. Tests and offline runs point a provider's ``base_url`` at it
(``server.base_url_for(kind)``; ``server.openai_base_url`` and ``server.anthropic_base_url`` say the same for
punchline's two). It answers deterministically (see :mod:`punchline.workers.fake.answers`: the installed
pipelines' own answers first, then generic ones) and injects faults on demand.

**Request key.** Calls are counted per *wire key*: the first 40 hex digits of the sha256 of the
canonical JSON array ``[model, [[role, content], ...], temperature, max_tokens, n, stop, seed]``
built from the request as its wire reads it (:class:`~punchline.workers.fake.wire.WireRequest`: Anthropic's
``system`` becomes a leading system message, its ``stop_sequences`` are ``stop``, its ``n`` is 1).
:func:`request_wire_key` computes the same key from a :class:`~punchline.workers.provider.ProviderRequest` sent
by a provider of a given kind, so a test can look up the calls one request caused.

**Determinism.** Every fault is decided by a hash of (seed, wire key, choice offset, attempt number,
fault name), where the attempt number counts the earlier non-rate-limited calls with the same key
and offset. A test that replays the same calls therefore sees the same faults, whatever the timing.
``fail_first_attempts`` fails exactly the first K attempts of every key with ``fail_status``, which
makes retry tests exact. The one timing-dependent fault is the rate limit: a real GCRA check.

**Choice offset.** A provider that splits an ``n``-sample request into single calls (or a unit that
asks for sample slot ``s``) sends the header ``X-Choice-Offset``; choice ``j`` of that call is then
answered as choice ``offset + j``, so a split request gets the same texts as one ``n`` call.

**Layout.** This module is the server's face (start, stop, knobs, remote stats); the HTTP routes are in
:mod:`~punchline.workers.fake.handler`, the counters and answers in :mod:`~punchline.workers.fake.state`, what
a wire is and the key in :mod:`~punchline.workers.fake.wire` (OpenAI's and Anthropic's wires in
:mod:`~punchline.workers.fake.wires`), the batch endpoints in :mod:`~punchline.workers.fake.batches`. The
names other code imports from here are re-exported.
"""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from punchline.data.answer_format import StageAnswers
from punchline.data.provider_settings import ProviderKind, ProviderSettings
from punchline.data.requests import ProviderRequest
from punchline.data.simulator import FakeConfig
from punchline.workers.fake.batches import BatchStats
from punchline.workers.fake.handler import FakeHTTPServer
from punchline.workers.fake.kind_wires import KindWires, find_wires, wire_of
from punchline.workers.fake.simulators import Simulator, find_simulators
from punchline.workers.fake.state import FAULTS, FakeStats, ServerState, answer_texts, completion
from punchline.workers.fake.wire import wire_key
from punchline.workers.providers.base import CHOICE_OFFSET_HEADER

__all__ = [
    "CHOICE_OFFSET_HEADER",
    "FAULTS",
    "FakeConfig",
    "FakeProviderServer",
    "FakeStats",
    "answer_texts",
    "completion",
    "fetch_batch_stats",
    "fetch_stats",
    "request_wire_key",
    "reset_remote",
    "wire_key",
]


class FakeProviderServer:
    """The fake provider in a background thread; ``with FakeProviderServer(cfg) as srv: srv.url``."""

    def __init__(
        self,
        config: FakeConfig | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        simulators: Sequence[Simulator] | None = None,
        wires: KindWires | None = None,
        stages: Sequence[StageAnswers] = (),
        per_key: bool = True,
    ) -> None:
        """``simulators``: the pipelines whose answers it gives (default: those ``config.simulators`` names, then
        every installed pipeline's, found through the entry points); a bad ``pipeline_knobs`` table is a ValueError
        naming it. ``wires``: the APIs it speaks (default: every installed kind's). ``stages``: what a run's generic
        stages' answers parse into (:func:`~punchline.workers.fake.stage_answers.stage_answers`). ``per_key``: count
        every key's calls and attempts (a test's server; a run's keeps only what its knobs read:
        :mod:`~punchline.workers.fake.state`)."""
        config = config or FakeConfig()
        found = find_simulators(config.simulators) if simulators is None else simulators
        self._state = ServerState(config, found, find_wires() if wires is None else wires, stages, per_key=per_key)
        self._address = (host, port)
        self._httpd: FakeHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> str:
        if self._httpd is None:
            self._state.stop_event.clear()
            self._httpd = FakeHTTPServer(self._address, self._state)
            self._thread = threading.Thread(target=self._httpd.serve_forever, name="fake-provider", daemon=True)
            self._thread.start()
        return self.url

    def serve_forever(self, on_ready: Callable[[str], None] | None = None) -> None:
        """Run in the calling thread (the ``fake-provider`` command) until interrupted."""
        self._httpd = FakeHTTPServer(self._address, self._state)
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

    def base_url_for(self, kind: ProviderKind, *, record: str | None = None, file: str | None = None) -> str:
        """The ``base_url`` of a provider of ``kind`` talking to this server (where its wire's paths start); a kind
        it speaks no wire of is a ConfigError naming ``record``."""
        return self.url + self._state.wires.of_kind(kind, record=record, file=file).base_path

    @property
    def openai_base_url(self) -> str:
        """``base_url_for("openai")``, which many tests and benches name."""
        return self.base_url_for("openai")

    @property
    def anthropic_base_url(self) -> str:
        """``base_url_for("anthropic")``."""
        return self.base_url_for("anthropic")

    def provider_settings(self, kind: ProviderKind = "openai", **overrides: Any) -> ProviderSettings:
        """Settings of a provider that talks to this server (``timeout_s`` etc. via ``overrides``)."""
        return ProviderSettings(kind=kind, base_url=self.base_url_for(kind), **overrides)

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


def request_wire_key(request: ProviderRequest, *, kind: ProviderKind = "openai", supports_n: bool = True) -> str:
    """The key the fake counts the calls of a provider of ``kind`` for ``request`` under (see the module doc)."""
    return wire_of(kind).sent(request, supports_n).key()


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
