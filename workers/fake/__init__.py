"""The offline simulated provider: a real HTTP server speaking every installed provider kind's simulated wire
(OpenAI's and Anthropic's among them, a plug-in kind's too); the installed pipelines answer their own requests
(their ``simulate`` hooks), the rest is answered generically.

The names below are the server's, loaded when first asked for (PEP 562): a run against real endpoints imports
this package for its config checks (``checks``) and never starts the server, whose modules (its HTTP stack, the
formats' JSON Schema validator) would be some 20 MB in the driver and in every worker forked from it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from punchline.workers.fake.checks import load_knobs
    from punchline.workers.fake.server import (
        CHOICE_OFFSET_HEADER,
        FakeConfig,
        FakeProviderServer,
        FakeStats,
        fetch_stats,
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


def __getattr__(name: str) -> Any:
    if name in __all__:
        module = "checks" if name == "load_knobs" else "server"
        return getattr(importlib.import_module(f"punchline.workers.fake.{module}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
