"""The provider interface: an LLM endpoint as the workers see it, and a *kind* of endpoint (the API it speaks).

Requests, responses and settings are shared vocabulary (``punchline.data.requests`` and
``punchline.data.provider_settings``); implementations live in ``punchline.workers.providers``.

A provider **kind** (``[providers.<name>] kind``) is a :class:`ProviderKind` registered under the entry-point
group ``punchline.providers`` (name = the kind): punchline's own ``openai``, ``anthropic`` and ``litellm``
register there as a third party's would. Why one object per kind: everything that differs between APIs (which
class answers, whether it has a batch API, where its SDK looks for a base URL, how preflight checks a key for
free, whether one call can return ``n`` choices) is read from it, so a new kind is one module and no edit
elsewhere. The object is light: it names its implementation as ``"module:Class"`` strings, imported only by
:meth:`ProviderKind.make` (the SDKs take seconds to import; ``punchline --help`` and the planner never pay it).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from typing import Protocol

from punchline.data.errors import ProviderError
from punchline.data.plugins import PROVIDER_KINDS
from punchline.data.provider_settings import ProviderSettings
from punchline.data.requests import ProviderRequest, ProviderResponse
from punchline.workers.batch_interface import BatchProvider

# the entry-point group a package declares its provider kinds in (punchline's own too): data/plugins.py
KIND_GROUP = PROVIDER_KINDS.name


class Provider(Protocol):
    """An LLM endpoint. Implementations convert SDK exceptions into ``punchline.data.errors`` at the boundary:
    :class:`~punchline.data.errors.RetryableProviderError` or :class:`~punchline.data.errors.FatalProviderError`."""

    name: str
    settings: ProviderSettings

    async def complete(self, request: ProviderRequest) -> ProviderResponse: ...

    async def aclose(self) -> None: ...


class ProviderKind:
    """One kind of provider. Instantiate it with the ``"module:Class"`` of the implementation (a class taking
    ``(name, settings)`` that is a :class:`Provider`), or subclass it and override :meth:`make`.

    - ``batches``: the ``"module:Class"`` of its :class:`~punchline.workers.batch_interface.BatchProvider`;
      None when the kind has no batch API (then ``mode = "batch"`` is refused when the config is read).
    - ``base_url_env`` / ``default_base_url``: where its SDK looks when ``base_url`` is not set (preflight
      checks that endpoint); ``key_env``: the variable its SDK reads a key from by default (documentation).
    - ``models_path`` / ``call_path``: relative to the base URL, the free authenticated GET preflight lists
      models at, and the path every unit POSTs to (probed with an empty body); None: preflight checks only
      that the key can be read (a kind that routes by model, such as ``litellm``, has no single endpoint).
    - ``key_header``: how the key travels (``"bearer"``: ``Authorization: Bearer``; else that header's
      name), plus ``extra_headers``, plus ``env_headers`` (variable -> header) of the variables that are set.
    - ``splits_n``: one call never returns ``n`` choices (a request with ``n > 1`` is ``n`` calls, whatever
      ``supports_n`` says); ``simulated_wire``: what the simulated provider speaks to it when ``base_url =
      "simulated"``: the ``"module:attr"`` of its :class:`~punchline.workers.fake.wire.SimulatedWire` (its
      offline twin, in its own module), or the name of the kind whose wire it reuses (by default ``openai``'s);
      ``preload``: modules a worker process is worth having imported before it forks children (besides the
      implementation's own module: the SDK an implementation imports lazily).
    - ``retryable``: which of its errors a call retries (with backoff, up to ``max_retries``); None: the
      error's own class says, :class:`~punchline.data.errors.RetryableProviderError` (a 429, 408, 409, 425, 5xx, a
      timeout, a dropped connection, a malformed body) or not
      (:func:`punchline.workers.calls.retry.retried_by_default`).
    """

    def __init__(
        self,
        name: str,
        implementation: str,
        *,
        batches: str | None = None,
        base_url_env: str | None = None,
        default_base_url: str | None = None,
        key_env: str | None = None,
        models_path: str | None = None,
        call_path: str | None = None,
        key_header: str = "bearer",
        extra_headers: Mapping[str, str] | None = None,
        env_headers: Mapping[str, str] | None = None,
        splits_n: bool = False,
        simulated_wire: str = "openai",
        retryable: Callable[[ProviderError], bool] | None = None,
        preload: tuple[str, ...] = (),
        summary: str = "",
    ) -> None:
        self.name = name
        self.implementation = implementation
        self.batches = batches
        self.base_url_env = base_url_env
        self.default_base_url = default_base_url
        self.key_env = key_env
        self.models_path = models_path
        self.call_path = call_path
        self.key_header = key_header
        self.extra_headers = dict(extra_headers or {})
        self.env_headers = dict(env_headers or {})
        self.splits_n = splits_n
        self.simulated_wire = simulated_wire
        self.retryable = retryable
        self.preload = preload
        self.summary = summary

    def __repr__(self) -> str:
        return f"ProviderKind({self.name!r}, {self.implementation!r})"

    @property
    def has_batches(self) -> bool:
        return self.batches is not None

    def make(self, name: str, settings: ProviderSettings) -> Provider:
        """The provider named ``name`` (the ``[providers.<name>]`` table); imports the implementation now."""
        provider: Provider = load_ref(self.implementation)(name, settings)
        return provider

    def make_batches(self, name: str, settings: ProviderSettings) -> BatchProvider | None:
        """The kind's batch API client, or None when it has none; imports the implementation now."""
        if self.batches is None:
            return None
        client: BatchProvider = load_ref(self.batches)(name, settings)
        return client

    def warm_modules(self) -> list[str]:
        """What a driver imports ahead so the workers it forks start with the kind's SDK loaded."""
        return [self.implementation.partition(":")[0], *self.preload]

    def headers(self, key: str) -> dict[str, str]:
        """The authentication headers its SDK sends with ``key`` (preflight's own plain HTTP calls)."""
        auth = {"Authorization": f"Bearer {key}"} if self.key_header == "bearer" else {self.key_header: key}
        from_env = {header: os.environ[env] for env, header in self.env_headers.items() if os.environ.get(env)}
        return {**auth, **self.extra_headers, **from_env}

    def wire_calls(self, settings: ProviderSettings, n: int) -> int:
        """How many HTTP calls a request of ``n`` choices makes."""
        return n if n > 1 and (self.splits_n or not settings.supports_n) else 1


def load_ref(ref: str) -> type:
    """The class a ``"module:Class"`` string names, imported now."""
    module_name, _, attr = ref.partition(":")
    value: type = getattr(importlib.import_module(module_name), attr)
    return value
