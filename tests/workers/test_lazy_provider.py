"""The driver's own worker builds a provider at its first call (workers/calls/lazy_provider.py): a worker whose units
are all cached imports no SDK; the first call builds it once for every call that waits for it, says so once, and
a provider that cannot be built fails the call as a refused call would."""

from __future__ import annotations

import asyncio

import pytest

from punchline.data.errors import FatalProviderError
from punchline.data.provider_settings import ProviderSettings
from punchline.data.requests import Message, ProviderRequest, ProviderResponse
from punchline.workers.calls.lazy_provider import LazyProvider

SETTINGS = ProviderSettings(kind="openai", base_url="http://127.0.0.1:1")
REQUEST = ProviderRequest(provider="p", model="m", messages=(Message("user", "hi"),), max_tokens=1)


class Echo:
    def __init__(self, name: str, settings: ProviderSettings) -> None:
        self.name = name
        self.settings = settings
        self.closed = False

    async def complete(self, request: ProviderRequest) -> ProviderResponse:
        await asyncio.sleep(0)
        return ProviderResponse(texts=[request.messages[0].content])

    async def aclose(self) -> None:
        self.closed = True


def test_built_once_at_the_first_call_for_all_the_calls_waiting() -> None:
    built: list[str] = []
    said: list[str] = []

    def make(name: str, settings: ProviderSettings) -> Echo:
        built.append(name)
        return Echo(name, settings)

    lazy = LazyProvider("p", SETTINGS, on_build=lambda: said.append("calling"), make=make)
    assert lazy.name == "p" and lazy.settings is SETTINGS and built == []  # nothing built before a call

    async def calls() -> list[ProviderResponse]:
        return await asyncio.gather(*(lazy.complete(REQUEST) for _ in range(5)))

    answers = asyncio.run(calls())
    assert [a.texts for a in answers] == [["hi"]] * 5
    assert built == ["p"] and said == ["calling"]
    asyncio.run(lazy.aclose())
    assert isinstance(lazy.built, Echo) and lazy.built.closed


def test_a_provider_that_cannot_be_built_fails_the_call() -> None:
    def make(name: str, settings: ProviderSettings) -> Echo:
        raise ImportError("No module named 'some_sdk'")

    lazy = LazyProvider("p", SETTINGS, make=make)
    with pytest.raises(FatalProviderError, match="provider p could not be built: ImportError: No module named"):
        asyncio.run(lazy.complete(REQUEST))
    asyncio.run(lazy.aclose())  # nothing built: nothing to close
