"""What a simulated wire is: the fake provider's side of one API's request and answer shapes, and the request key.

Why an interface of its own: the fake provider answers every API the installed provider kinds speak, without
naming one. A :class:`~punchline.workers.provider.ProviderKind` says which wire it speaks offline
(``simulated_wire``: a ``"module:attr"`` of a :class:`SimulatedWire`, or another kind's name when it reuses that
kind's wire, as ``litellm`` reuses ``openai``'s); the server finds them all through the kinds registry
(:mod:`punchline.workers.fake.kind_wires`). A wire only translates: its ``parse`` turns a request body into the
neutral :class:`WireRequest` the answers, faults and counters are computed from, and ``answer``/``error`` write
them back in its shape, so each API spells its fields in one place (its module; OpenAI's and Anthropic's are in
:mod:`punchline.workers.fake.wires`) and the HTTP plumbing (:mod:`punchline.workers.fake.handler`) none.

The request key (:func:`wire_key`) is what tests look calls up by; see :mod:`punchline.workers.fake.server`.
"""

from __future__ import annotations

import abc
import hashlib
import json
import math
from typing import Any, ClassVar

import msgspec

from punchline.data.requests import ProviderRequest


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


def tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / 4)) if text else 0


class WireRequest(msgspec.Struct):
    """A completion request as the fake provider sees it, whatever the API: the messages in order (a system
    prompt the API carries apart is a leading ``system`` message), ``n`` choices, and what else shapes the
    answer."""

    model: str
    messages: list[tuple[str, str]]
    temperature: float
    max_tokens: int | None
    n: int
    stop: list[str]
    seed: int | None

    def key(self) -> str:
        """The request's wire key (see the module doc of :mod:`punchline.workers.fake.server`)."""
        return wire_key(self.model, self.messages, self.temperature, self.max_tokens, self.n, self.stop, self.seed)


def content_text(content: Any) -> str:
    """A message's text: a string, or the ``text`` of a list of content blocks (both SDKs send either)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict))
    return ""


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def error_type(status: int) -> str:
    """The error ``type`` both OpenAI and Anthropic name a status by (``api_error`` for any other)."""
    return _ERROR_TYPES.get(status, "api_error")


def apply_stop(text: str, stop: list[str]) -> str:
    cut = len(text)
    for s in stop:
        if s and s in text:
            cut = min(cut, text.index(s))
    return text[:cut]


class SimulatedWire(abc.ABC):
    """One API's shapes, as the fake provider serves them. Subclass it in the kind's module and name the instance
    in the kind's ``simulated_wire``.

    - ``name``: the API's name (the fake's batch endpoints and its stats say it; unique among the wires).
    - ``base_path``: what a provider of the kind adds to the server's URL as its ``base_url`` (``"/v1"``).
    - ``paths``: the POST paths, from the server's root, it answers completions on.
    - ``key_headers``: request headers only its SDK sends (the free ``GET /v1/models`` answers a refused key
      in the shape of the first wire whose header is there; a wire without any is the fallback).
    """

    name: ClassVar[str]
    base_path: ClassVar[str] = ""
    paths: ClassVar[tuple[str, ...]]
    key_headers: ClassVar[tuple[str, ...]] = ()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, paths={self.paths})"

    @abc.abstractmethod
    def parse(self, body: dict[str, Any]) -> WireRequest:
        """The request a body asks; a ValueError (its text is the 400's message, not counted as a call) when the
        body lacks what the API requires."""

    @abc.abstractmethod
    def answer(self, request: WireRequest, texts: list[str], input_tokens: int, output_tokens: int) -> dict[str, Any]:
        """A 200 body: ``texts`` (one per choice; none for a malformed answer) and the usage billed."""

    @abc.abstractmethod
    def error(self, status: int, message: str) -> dict[str, Any]:
        """An error response body."""

    def sent(self, request: ProviderRequest, supports_n: bool = True) -> WireRequest:
        """What the kind's provider sends for ``request``, as :meth:`parse` will read it (what
        :func:`~punchline.workers.fake.server.request_wire_key` hashes). By default every field as it is, ``n``
        being 1 when the provider splits it (``supports_n`` false); a wire that drops or moves a field says so."""
        messages = [(str(m.role), m.content) for m in request.messages]
        n = request.n if supports_n else 1
        return WireRequest(
            request.model, messages, request.temperature, request.max_tokens, n, list(request.stop), request.seed
        )
