"""The offline simulated provider: a real HTTP server speaking every installed provider kind's simulated wire
(OpenAI's and Anthropic's among them, a plug-in kind's too); the installed pipelines answer their own requests
(their ``simulate`` hooks), the rest is answered generically."""

from punchline.workers.fake.server import (
    CHOICE_OFFSET_HEADER,
    FakeConfig,
    FakeProviderServer,
    FakeStats,
    fetch_stats,
    load_knobs,
    request_wire_key,
    reset_remote,
)

__all__ = [
    "CHOICE_OFFSET_HEADER",
    "FakeConfig",
    "FakeProviderServer",
    "FakeStats",
    "fetch_stats",
    "load_knobs",
    "request_wire_key",
    "reset_remote",
]
