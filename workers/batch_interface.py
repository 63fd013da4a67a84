"""A provider's batch API as the batch runner sees it: the :class:`BatchProvider` protocol and what it answers with.

Why a module of its own below :mod:`punchline.workers.batch_provider` (the parts a request becomes, merging their
answers): a provider kind (:mod:`punchline.workers.provider`) names the batch client it makes, and the kinds'
registry returns one, while the parts ask the registry how a kind splits ``n``. With the protocol beside the parts,
the kind and the registry imported the parts' module back (a circle closed under ``TYPE_CHECKING``); here, needing
only the shared vocabulary of ``punchline.data``, it sits below all three.
"""

from __future__ import annotations

from collections.abc import Container, Iterator
from typing import Literal, Protocol

import msgspec

from punchline.data.provider_settings import ProviderSettings
from punchline.data.requests import ProviderRequest, ProviderResponse

BatchStatus = Literal["in_progress", "ended"]


class BatchInfo(msgspec.Struct, kw_only=True):
    """A provider's batch as last seen: ``status`` is ``in_progress`` until nothing more will change."""

    batch_id: str
    status: BatchStatus
    provider_status: str  # the provider's own word (completed, expired, cancelled, ended, …)
    created_at: float  # epoch seconds
    total: int
    succeeded: int = 0
    failed: int = 0  # errored, expired or cancelled
    batch_key: str = ""  # from the batch's metadata, where the API has it (OpenAI)
    tag: str = ""  # the intent's tag from the batch's metadata (OpenAI)
    error: str = ""  # why the provider refused the whole batch (validation), one line


PartOutcome = ProviderResponse | str
"""One part's outcome inside a batch: its answer, or why there is none ("errored: …", "expired", "canceled")."""


class BatchProvider(Protocol):
    """A provider's batch API. Every method is one or a few HTTP calls and none is retried internally;
    SDK errors become :class:`~punchline.data.errors.RetryableProviderError` or
    :class:`~punchline.data.errors.FatalProviderError`."""

    name: str
    settings: ProviderSettings
    has_metadata: bool  # whether a batch carries our batch key (then reconciling is exact)

    def create(
        self, batch_key: str, requests: list[ProviderRequest], skip: Container[str] = (), tag: str = ""
    ) -> BatchInfo:
        """One batch of the parts of ``requests`` except those whose custom id is in ``skip``; each part goes
        under its wire id (``tag``), and where the API has metadata the batch carries ``batch_key`` and ``tag``."""
        ...

    def retrieve(self, batch_id: str) -> BatchInfo: ...

    def listing(self, since: float = 0.0) -> Iterator[BatchInfo]:
        """Every batch of the account created at or after ``since`` (epoch seconds), newest first, page by
        page at the API's largest page size: as far back as asked, however many batches the account holds."""
        ...

    def results(self, batch_id: str) -> dict[str, PartOutcome]:
        """Each part's outcome by *wire* id (a part the provider did not report is simply absent)."""
        ...

    def cancel(self, batch_id: str) -> BatchInfo: ...

    def close(self) -> None: ...
