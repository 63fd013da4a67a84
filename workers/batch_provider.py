"""The batch interface: a provider's batch API (half price, answers within 24 h) as the batch runner sees it (the
protocol and its answers are :mod:`punchline.workers.batch_interface`, below the kinds that name it; here, the parts).

Why an interface of its own beside :mod:`punchline.workers.provider`: a batch is created once and then only
looked at, so its client must never retry a create on its own (that is how a batch gets paid twice); the
runner decides, after reconciling with the provider. Implementations live in
``punchline.workers.providers.batch_openai`` and ``batch_anthropic`` (named by their kinds' ``batches``)
and use the official SDKs, synchronously
(the runner lives in the driver, which waits anyway).

A :class:`ProviderRequest` becomes one batch request per wire call (``wire_calls``: ``n`` single calls where
the provider cannot return ``n`` choices), its **parts**; each carries the custom id
``<request key>-o<choice offset>``. A client submits the parts it is given (``skip`` leaves out parts answered
by an earlier batch) and reports each part's outcome by custom id; :func:`merge_parts` joins a request's
parts, once all are answered, into the same :class:`ProviderResponse` the online call gives (texts in choice
offset order). Why per part and not per request: when one of ``n`` parts fails, only that part is paid for
again; the runner keeps the others (see :mod:`punchline.cluster.run.executors.batches`).

**Wire ids.** On the wire a part's custom id is prefixed with its batch intent's random *tag*
(``<tag>-<request key>-o<offset>``, at most 64 characters of ``[A-Za-z0-9_-]`` as Anthropic requires): only the
intent that drew the tag can have written it, so a batch whose results carry exactly the intent's wire ids is
provably that intent's batch, whoever else on the account submits the same requests (:func:`wire_ids`).
OpenAI batches carry the tag in their metadata as well. Every batch is **one model**: OpenAI requires one model
(and one endpoint) per input file, and the runner groups so for both APIs.
"""

from __future__ import annotations

import re
from collections.abc import Container, Mapping

import msgspec

from punchline.data.provider_settings import ProviderSettings
from punchline.data.requests import ProviderRequest, ProviderResponse, joined
from punchline.workers.batch_interface import BatchInfo, BatchProvider, BatchStatus, PartOutcome
from punchline.workers.providers.registry import kind_of

# with the interface's own types (workers/batch_interface.py), which the implementations and the runner import here
__all__ = [
    "BatchInfo",
    "BatchProvider",
    "BatchStatus",
    "Part",
    "PartOutcome",
    "RequestOutcome",
    "merge_parts",
    "part_id",
    "parts",
    "wire_id",
    "wire_ids",
]


class RequestOutcome(msgspec.Struct, kw_only=True):
    """One request's outcome from its parts: an answer, or why there is none yet (resubmitted later)."""

    key: str
    response: ProviderResponse | None = None
    error: str = ""  # "errored: …", "expired", "canceled", "missing"


class Part(msgspec.Struct, frozen=True):
    custom_id: str
    offset: int  # the choice offset (sample_slot * n + i)
    n: int  # choices asked for in this part


def parts(settings: ProviderSettings, request: ProviderRequest, skip: Container[str] = ()) -> list[Part]:
    """The batch requests ``request`` becomes, in choice offset order: one, or ``n`` single-choice ones (as the
    online call splits); parts whose custom id is in ``skip`` (answered already) are left out."""
    key = request.key()
    first = request.sample_slot * request.n
    if kind_of(settings.kind).wire_calls(settings, request.n) > 1:
        split = [Part(f"{key}-o{first + i}", first + i, 1) for i in range(request.n)]
    else:
        split = [Part(f"{key}-o{first}", first, request.n)]
    return [p for p in split if p.custom_id not in skip]


_TAG = re.compile(r"^([0-9a-f]{12})-(.+)$")


def wire_id(tag: str, custom_id: str) -> str:
    """A part's custom id as submitted: prefixed with the intent's tag (none for records without one)."""
    return f"{tag}-{custom_id}" if tag else custom_id


def part_id(wire: str) -> str:
    """The part's own custom id (``<request key>-o<offset>``) from a wire id."""
    m = _TAG.match(wire)
    return m.group(2) if m else wire


def wire_ids(
    settings: ProviderSettings, requests: list[ProviderRequest], tag: str, skip: Container[str] = ()
) -> set[str]:
    """Every wire id a batch of ``requests`` (minus the parts in ``skip``) carries under ``tag``."""
    return {wire_id(tag, p.custom_id) for r in requests for p in parts(settings, r, skip)}


def merge_parts(request: ProviderRequest, got: Mapping[str, PartOutcome], settings: ProviderSettings) -> RequestOutcome:
    """The request's outcome from its parts' outcomes (answers in offset order, as the online call joins them);
    a part missing or failed leaves the request without an answer (its error says why)."""
    key = request.key()
    answers: list[ProviderResponse] = []
    for part in parts(settings, request):
        value = got.get(part.custom_id, "missing")
        if isinstance(value, str):
            return RequestOutcome(key=key, error=value)
        answers.append(value)
    return RequestOutcome(
        key=key,
        response=joined(answers),
    )
