"""The offline simulated provider: a real HTTP server that the OpenAI and Anthropic SDKs accept."""

from punchline.data.humor.judge import JUDGE_MARKER
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
    "JUDGE_MARKER",
    "FakeConfig",
    "FakeProviderServer",
    "FakeStats",
    "fetch_stats",
    "load_knobs",
    "request_wire_key",
    "reset_remote",
]
