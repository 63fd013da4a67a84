"""A provider built at its first call (the driver's own worker: :mod:`punchline.workers.local_process`).

Why: building a provider imports its SDK, 0.6-1.5 s of CPU each (openai, anthropic, measured on the 2-core
machine). A worker whose units are all answered from the response cache calls no provider, so it should not
pay that: a fully cached rerun of the demo spent 0.6 s before collect's first unit and 1.7 s before classify's
(the driver importing the SDKs for the worker it was about to fork). The first call builds it, in a thread (the
worker's event loop, and with it the heartbeat of its leases, goes on meanwhile), once for all the calls that
wait for it.

Nothing else changes: a cached unit is answered from the cache as before, and an uncached one takes its lease,
its call slot and its run-wide place as before; only the provider behind the call is built later. A provider
that cannot be built fails the unit that called it (a :class:`FatalProviderError` naming why), as a refused
call would.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from punchline.data.errors import FatalProviderError
from punchline.data.provider_settings import ProviderSettings
from punchline.data.requests import ProviderRequest, ProviderResponse
from punchline.workers.provider import Provider
from punchline.workers.providers import make_provider


class LazyProvider:
    """The provider ``make(name, settings)`` builds, built at the first :meth:`complete`; ``on_build`` is
    called then, once (the worker tells its driver it calls: cluster/run/local_worker.py)."""

    def __init__(
        self,
        name: str,
        settings: ProviderSettings,
        *,
        on_build: Callable[[], None] = lambda: None,
        make: Callable[[str, ProviderSettings], Provider] = make_provider,
    ) -> None:
        self.name = name
        self.settings = settings
        self.on_build = on_build
        self.make = make
        self.built: Provider | None = None
        self._building: asyncio.Lock | None = None

    async def _provider(self) -> Provider:
        if self.built is not None:
            return self.built
        if self._building is None:
            self._building = asyncio.Lock()
        async with self._building:
            if self.built is None:
                self.on_build()
                try:
                    self.built = await asyncio.to_thread(self.make, self.name, self.settings)
                except Exception as exc:
                    raise FatalProviderError(
                        f"provider {self.name} could not be built: {type(exc).__name__}: {exc}"[:500]
                    ) from exc
        return self.built

    async def complete(self, request: ProviderRequest) -> ProviderResponse:
        return await (await self._provider()).complete(request)

    async def aclose(self) -> None:
        if self.built is not None:
            await self.built.aclose()
