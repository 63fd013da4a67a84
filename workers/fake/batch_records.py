"""The records of the fake provider's batch endpoints: what a batch holds and what the endpoints counted.

Why a module of its own: the batch routes (:mod:`punchline.workers.fake.batches`) and the providers' views of a
batch (:mod:`punchline.workers.fake.batch_wire`) both read these, and tests import :class:`BatchStats`.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import msgspec


class BatchStats(msgspec.Struct, kw_only=True):
    """What the batch endpoints saw: ``billed`` and ``submitted`` count requests per custom id."""

    batches_created: int = 0
    batches_by_api: dict[str, int] = {}
    files_uploaded: int = 0
    billed: dict[str, int] = {}
    billed_keys: dict[str, int] = {}  # per wire key, comparable with ``FakeStats.calls``
    submitted: dict[str, int] = {}
    errored: int = 0
    expired: int = 0
    cancelled: int = 0
    results_downloads: int = 0
    hanging: int = 0  # calls held at a crash point right now
    crashes: dict[str, int] = {}
    failed_validation: int = 0  # batches that ended ``failed`` (their input file broke a rule)
    foreign_batches: int = 0  # other users' batches (seeded); never in the counters above
    foreign_cancelled: int = 0  # cancel calls on other users' batches
    foreign_results_downloads: int = 0


class BatchRequest(msgspec.Struct):
    custom_id: str
    body: dict[str, Any]


class Batch:
    """One batch, ours or another user's (``foreign``); its outcomes are decided once, when it settles."""

    def __init__(
        self,
        api: str,
        requests: list[BatchRequest],
        metadata: dict[str, str],
        input_file_id: str,
        *,
        foreign: bool = False,
        created_at: float | None = None,
        delay_s: float | None = None,
    ) -> None:
        self.id = ("batch_" if api == "openai" else "msgbatch_") + uuid.uuid4().hex[:24]
        self.api = api
        self.requests = requests
        self.metadata = metadata
        self.input_file_id = input_file_id
        self.foreign = foreign  # another user's batch on the same account
        self.delay_s = delay_s  # its own processing delay (else the knob's)
        self.errors: list[dict[str, Any]] = []  # why validation failed (OpenAI): the batch ends ``failed``
        self.created_at = time.time() if created_at is None else created_at
        self.cancel_at: float | None = None
        self.ended_at: float | None = None
        self.status = "in_progress"  # in_progress | ended (anthropic) ; completed | expired | cancelled (openai)
        self.outcomes: dict[str, tuple[str, Any]] = {}  # custom_id -> (kind, payload)
        self.output_file_id: str | None = None
        self.error_file_id: str | None = None
