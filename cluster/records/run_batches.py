"""What ``punchline batches RUN_ID [--cancel] [--not-ours ID]`` shows and does: a run's provider batches,
cancelling them, and telling a waiting run that a look-alike batch is not its own.

The list comes from the store's batch records (``<run>/batches/*.json``), so it works after a crash and
without Redis; a store that does not hold the run is one line (exit 2), not an empty list. A cancel is
first recorded in the store (``<run>/batches/control/cancel.json``), so a live driver stops sending anything
more (it cancels what it created meanwhile, keeps what came back and stops the stage); then each provider is
asked to cancel the batches still open, and that goes into their records. A later resume reconciles
cancelled batches like any other: answers that came back are kept, the rest is submitted again.

A function returning a struct, so that the command only prints it and a script reads the same.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import msgspec

from punchline.cluster.records.runs import load_run_record
from punchline.cluster.run.driver import RunRecord
from punchline.data.errors import InputError, ProviderError
from punchline.data.provider_settings import ProviderSettings
from punchline.data.storage.run_layout import RunLayout
from punchline.data.store import Store
from punchline.data.stores import open_store
from punchline.schedulers.batches import (
    BatchRecord,
    declare_foreign,
    declared_foreign,
    read_records,
    record_path,
    request_cancel,
)
from punchline.workers.providers import make_batch_provider

NOT_CANCELLED = "not cancelled"  # the start of a status whose cancel the provider refused or never got


class CancelledBatch(msgspec.Struct, kw_only=True):
    """One open batch and what its provider said to the cancel."""

    batch_key: str
    batch_id: str | None  # None: only the intent was recorded, nothing was created at the provider
    provider: str
    status: str  # the provider's status after the cancel, "not created", or "not cancelled: <why>"

    def describe(self) -> str:
        return f"cancelled {self.batch_id or 'intent ' + self.batch_key[:12]} ({self.provider}): {self.status}"


class RunBatches(msgspec.Struct, kw_only=True):
    """A run's batch records (after the cancel, when one was asked for) and what the cancel did."""

    run_id: str
    records: list[BatchRecord]
    cancelled: list[CancelledBatch] | None = None  # None: no cancel was asked for
    not_ours: list[str] = []  # every batch id the run's user has declared not this run's (--not-ours)


def run_batches(runs_dir: str, run_id: str, *, cancel: bool = False, not_ours: Sequence[str] = ()) -> RunBatches:
    """The run's provider batches; with ``cancel``, first every batch still open is cancelled; ``not_ours``:
    batch ids the user says are not this run's (an open look-alike an intent waits on: it stops waiting)."""
    run = load_run_record(runs_dir, run_id)
    store = run_store(run)
    if not_ours:
        declare_not_ours(store, run.run_id, not_ours)
    cancelled = cancel_open_batches(run, store) if cancel else None
    return RunBatches(
        run_id=run.run_id,
        records=read_records(store, run.run_id),
        cancelled=cancelled,
        not_ours=sorted(declared_foreign(store, run.run_id)),
    )


def declare_not_ours(store: Store, run_id: str, batch_ids: Sequence[str]) -> None:
    """Record ``batch_ids`` as not this run's (an Anthropic batch shows no owner until it ends, so an intent whose
    create call was cut off waits on an open look-alike created during that call; its user knows whose it is).
    A batch the run's records name as its own is refused (one line): declaring it would have it paid twice."""
    own = {r.batch_id: r.batch_key for r in read_records(store, run_id) if r.batch_id}
    for batch_id in batch_ids:
        if batch_id in own:
            raise InputError(
                f"batch {batch_id} is run {run_id}'s own (its record {own[batch_id]} names it): not declared foreign",
                file=f"{store.url}/{record_path(run_id, own[batch_id])}",
            )
    declare_foreign(store, run_id, batch_ids)


def run_store(run: RunRecord) -> Store:
    """The store a run's record names, checked to hold the run (moved, deleted or not mounted: one line)."""
    store = open_store(run.services.store_url)
    if not store.exists(RunLayout(run.run_id).record):
        raise InputError(
            f"the store {store.url} does not hold run {run.run_id} (moved, deleted or not mounted?)",
            file=f"{store.url}/{RunLayout(run.run_id).record}",
        )
    return store


def cancel_open_batches(run: RunRecord, store: Store) -> list[CancelledBatch]:
    """Record the cancel (a live driver stops sending), cancel each open batch and mark its record."""
    at = time.time()
    request_cancel(store, run.run_id, at)
    providers = msgspec.toml.decode(run.config_toml.encode()).get("providers", {})
    out = []
    for r in read_records(store, run.run_id):
        if r.state not in ("intent", "submitted"):
            continue
        status = "not created"
        if r.batch_id:
            client = make_batch_provider(r.provider, msgspec.convert(providers[r.provider], ProviderSettings))
            try:
                status = client.cancel(r.batch_id).provider_status
            except ProviderError as exc:  # ended meanwhile, or unreachable: said, and the others go on
                status = f"{NOT_CANCELLED}: {exc}"
            finally:
                client.close()
        _mark_cancelled(store, r, at, status)
        out.append(CancelledBatch(batch_key=r.batch_key, batch_id=r.batch_id, provider=r.provider, status=status))
    return out


def _mark_cancelled(store: Store, rec: BatchRecord, at: float, status: str) -> None:
    """Write the cancel into the record as it is now (a live driver may have moved it on meanwhile)."""
    path = record_path(rec.run_id, rec.batch_key)
    raw = store.get(path)
    fresh = rec if raw is None else msgspec.json.decode(raw, type=BatchRecord)
    fresh.cancelled_at = fresh.cancelled_at or at
    if fresh.state != "collected" and not status.startswith(NOT_CANCELLED):
        fresh.provider_status = status
    store.put(path, msgspec.json.encode(fresh))
