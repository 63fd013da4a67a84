"""The exactly-once submission records of provider batches: intents and batch ids in the store, unit leases in Redis.

Why both: the store survives Redis and is the record of what was *submitted* (a batch is paid for when it is
created, so its id must outlive any process); Redis holds the request leases that keep every other runner
(an online worker, another run's batches) from paying for a unit while a batch owns it.

A batch's identity is its **batch key**, a hash of its sorted request keys (and a generation number, so the
same set submitted again after it failed as a whole gets a new key). The order of writes is the guarantee:

1. the units' request leases are taken for the batch (owner ``batch:<run>:<batch key>``; a resumed driver
   adopts leases of its own batches, anyone else waits);
2. the **intent** ``<run>/batches/<batch key>.json`` (state ``intent``, no batch id) is written;
3. the batch is created at the provider;
4. the provider's batch id is written into the record (state ``submitted``) before anything else.

A record found in state ``intent`` on resume may or may not have a batch behind it (the driver died between
3 and 4): it is reconciled with the provider's listing before anything is submitted again.

**Held parts.** A request the provider answers in ``n`` single calls (its *parts*) can come back partly
answered. The answered parts are written to ``<run>/batches/parts/<request key>.json`` (:class:`HeldParts`)
*before* the batch's record says ``collected``, so a driver killed at any point finds them again; the next
batch holds only the missing parts, and its record names the parts it leaves out (``held_parts``), so its
request count (what an Anthropic batch is reconciled by) is fixed at the intent. Once every part is there the
request's answer goes into the response cache and then the part file is deleted. Why a file per request and
not fields on the records: held parts belong to a request, not to a batch; they are needed by the *next*
batch, which has a record of its own, and a collected record stays as it was (the history ``punchline
batches`` shows). One small file per partly answered request is read back with one listing on resume and
removed once the request is whole. While a request waits for its missing parts, its lease stays with the run
(a later batch of the same run adopts it), so no other run or online worker asks for all ``n`` again.

**Tags.** Every intent draws a random ``tag`` before its create call; the batch carries it (in its custom ids,
and in OpenAI's metadata), so a batch found on the account is this intent's only if it carries the tag: the
batch key alone would not do, as any run of the same requests computes the same key.

**Costs.** The records are the truth of what batches cost: :func:`with_batch_costs` adds every record's tokens
and dollars to a stage's counters and to its per-model rows, whichever driver created or collected it.

**Look-alikes.** An Anthropic batch shows only its request count and creation time until it ends, so an intent
whose create call was cut off (a kill, a timeout) cannot tell its batch from another user's open batch of the same
count created during that call. What it can know: the look-alikes that existed before its call (listed right
before it, ``predates``: never its own), and what the run's user knows (``punchline batches RUN --not-ours ID``
writes ``<run>/batches/control/foreign.json``; a live runner reads it at every look).

**Cancels.** ``punchline batches RUN --cancel`` writes ``<run>/batches/control/cancel.json`` (when) before it
cancels anything and marks the records it cancelled; a live runner that sees a cancel newer than its own start
stops resending (:meth:`BatchRecords.cancel_requested`).
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal

import msgspec
import redis
import structlog

from punchline.data.errors import LedgerUnavailable
from punchline.data.requests import ProviderResponse
from punchline.data.storage.response_cache import MARKER_MS
from punchline.data.storage.run_layout import RunLayout
from punchline.data.store import Store
from punchline.schedulers import keys as redis_keys
from punchline.schedulers import lua
from punchline.schedulers.budget import UsageRow
from punchline.schedulers.keys import NAMESPACE
from punchline.schedulers.ledger import StageCounters
from punchline.schedulers.server.redis_client import is_cluster

log = structlog.get_logger("punchline.batches")

BatchState = Literal["intent", "submitted", "collected", "failed"]
Fallback = Literal["", "online"]


class BatchRecord(msgspec.Struct, kw_only=True):
    """One batch of one stage, as the store keeps it (``<run>/batches/<batch key>.json``)."""

    batch_key: str
    run_id: str
    stage: str
    provider: str
    model: str = ""  # one model per batch (OpenAI requires it; records written before grouping have none)
    tag: str = ""  # random, drawn at the intent: carried by the batch (custom ids, metadata), proves it ours
    keys: list[str]  # request keys, sorted
    requests: int  # provider-side requests submitted (a request split into n single calls counts n)
    held_parts: list[str] = []  # custom ids of parts of ``keys`` answered by earlier batches: not submitted
    state: BatchState = "intent"
    batch_id: str = ""
    intent_at: float = 0.0
    # when the last create call was started: 0 = never (nothing to reconcile), -1 = unknown (records written before)
    create_at: float = -1.0
    last_create_at: float = 0.0  # when the latest create call was started (a create tried again after a timeout)
    # batches on the account with this intent's request count, listed right before its create call (for an API
    # without metadata): they existed before the call, so none is this intent's, whatever the clocks say
    predates: list[str] = []
    # open batches with this intent's request count created during its cut-off create call, which only their
    # results can tell from its own (batch id -> when the provider created it, epoch s): the intent waits on them
    # and says so (the log, the progress line, ``status``) until they end or its user says they are not its own
    look_alikes: dict[str, float] = {}
    submitted_at: float = 0.0
    collected_at: float = 0.0
    provider_status: str = ""
    succeeded: int = 0  # provider-side requests answered (and kept), out of ``requests``
    failed: int = 0  # errored, expired, cancelled, missing or rejected by the validator
    billed: int = 0  # provider-side requests the provider answered (and so billed), kept or not
    error: str = ""  # why the provider failed the whole batch (state ``failed``), in its own words
    fallback: Fallback = ""  # "online": its unanswered requests were left to the online path (full price)
    online_requests: int = 0  # how many requests that was
    cancelled_at: float = 0.0  # when ``punchline batches --cancel`` cancelled it
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0  # at the batch price
    online_cost_usd: float = 0.0  # what the same answers would have cost online
    # what the batch may cost at most (at the batch price), priced at the intent: held in the run's budget
    # (``max_cost_usd``) from before the create call until its answers are collected, then settled at cost_usd
    estimate_usd: float = 0.0


def batch_key(keys: Iterable[str], generation: int = 0) -> str:
    """The identity of a batch: a hash of its sorted request keys (and its generation)."""
    h = hashlib.sha256("\n".join(sorted(keys)).encode())
    if generation:
        h.update(f"\n#{generation}".encode())
    return h.hexdigest()[:32]


class HeldParts(msgspec.Struct, kw_only=True):
    """The answered parts of one request still missing others (``<run>/batches/parts/<request key>.json``)."""

    key: str  # the request key
    parts: dict[str, ProviderResponse]  # custom id -> that part's answer


def batches_prefix(run_id: str) -> str:
    return RunLayout(run_id).batches


def record_path(run_id: str, key: str) -> str:
    return f"{batches_prefix(run_id)}{key}.json"


def parts_prefix(run_id: str) -> str:
    return f"{batches_prefix(run_id)}parts/"


def parts_path(run_id: str, request_key: str) -> str:
    return f"{parts_prefix(run_id)}{request_key}.json"


def _record_paths(store: Store, run_id: str) -> list[str]:
    """The batch records of a run (not the part files beside them: the store lists recursively)."""
    prefix = batches_prefix(run_id)
    return [p for p in store.list(prefix) if "/" not in p[len(prefix) :]]


def new_tag() -> str:
    """An intent's tag: 12 random hex digits (a wire id stays within Anthropic's 64 characters)."""
    return secrets.token_hex(6)


def cancel_path(run_id: str) -> str:
    """Where ``punchline batches --cancel`` records a cancel (a subfolder: not a batch record)."""
    return f"{batches_prefix(run_id)}control/cancel.json"


class CancelRequest(msgspec.Struct, kw_only=True):
    at: float  # epoch seconds


def request_cancel(store: Store, run_id: str, at: float) -> None:
    store.put(cancel_path(run_id), msgspec.json.encode(CancelRequest(at=at)))


def cancel_requested(store: Store, run_id: str) -> float:
    """When the run's batches were last cancelled by ``punchline batches --cancel`` (0: never)."""
    raw = store.get(cancel_path(run_id))
    return 0.0 if raw is None else msgspec.json.decode(raw, type=CancelRequest).at


def foreign_path(run_id: str) -> str:
    """Where ``punchline batches --not-ours`` records the batches a user said are not this run's."""
    return f"{batches_prefix(run_id)}control/foreign.json"


class ForeignBatches(msgspec.Struct, kw_only=True):
    ids: list[str]  # provider batch ids, sorted


def declared_foreign(store: Store, run_id: str) -> set[str]:
    """The batch ids the run's user declared not this run's (``punchline batches RUN --not-ours ID``)."""
    raw = store.get(foreign_path(run_id))
    return set() if raw is None else set(msgspec.json.decode(raw, type=ForeignBatches).ids)


def declare_foreign(store: Store, run_id: str, batch_ids: Iterable[str]) -> None:
    ids = sorted(declared_foreign(store, run_id) | set(batch_ids))
    store.put(foreign_path(run_id), msgspec.json.encode(ForeignBatches(ids=ids)))


def not_ours_command(run_id: str, batch_id: str) -> str:
    """The command that tells run ``run_id`` that ``batch_id`` is not its own (what ends an intent's wait on it)."""
    return f"punchline batches {run_id} --not-ours {batch_id}"


def batch_owner(run_id: str, key: str) -> str:
    return f"batch:{run_id}:{key}"


# schedulers/lua/batch_*.lua (their KEYS, ARGV and replies)
_TAKE = lua.script("batch_take")
_RELEASE = lua.script("batch_release")


def run_owners(run_id: str) -> str:
    """The owner prefix of every batch of a run (a later batch adopts the leases of partly answered requests)."""
    return f"batch:{run_id}:"


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(BatchRecord)


def _by_group(keys: Sequence[str], cluster: bool) -> list[tuple[str | None, list[str]]]:
    """The request keys of one script call each: all of them with the one fence on a single Redis; on a Redis
    Cluster (a script's keys in one slot) each request group's with that group's fence."""
    if not cluster:
        return [(None, list(keys))]
    groups: dict[str, list[str]] = {}
    for k in keys:
        groups.setdefault(redis_keys.request_group(k), []).append(k)
    return list(groups.items())


_parts_decoder = msgspec.json.Decoder(HeldParts)


class BatchRecords:
    """Batch records of one run in the store, and the request leases its batches hold in Redis."""

    def __init__(self, client: redis.Redis, store: Store, run_id: str, *, namespace: str = NAMESPACE) -> None:
        self.r = client
        self.store = store
        self.run_id = run_id
        self.ns = namespace
        self._take = client.register_script(_TAKE)
        self._release = client.register_script(_RELEASE)
        self.cluster = is_cluster(client)

    def _redis(self, fn: Any, **kwargs: Any) -> Any:
        try:
            return fn(**kwargs)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
            raise LedgerUnavailable(f"Redis is unreachable: {exc}") from None

    # --- leases ------------------------------------------------------------------------------------

    def take(self, owner: str, keys: Sequence[str], lease_ms: int, *, adopt: str = "") -> list[str]:
        """Lease ``keys`` to ``owner`` (or extend its own leases); returns the keys it holds now. A key held
        by anyone else (an online worker, another run) is left alone: its answer will appear in the cache.
        A lease whose owner starts with ``adopt`` (this run's other batches) is taken over."""
        held: list[str] = []
        for group, part in _by_group(keys, self.cluster):
            for i in range(0, len(part), 500):
                chunk = list(part[i : i + 500])
                res = self._redis(
                    self._take,
                    keys=[*[redis_keys.request(self.ns, k) for k in chunk], redis_keys.fence(self.ns, group)],
                    args=[owner, lease_ms, adopt],
                )
                held += [k for k, ok in zip(chunk, res, strict=True) if ok]
        return held

    def release(self, owner: str, keys: Sequence[str], packs: Mapping[str, str | None] | None = None) -> None:
        """Release the batch's leases; a key whose answer is in a pack (``packs``) leaves a done marker."""
        for _, whole in _by_group(keys, self.cluster):
            for i in range(0, len(whole), 500):
                part = whole[i : i + 500]
                chunk = [redis_keys.request(self.ns, k) for k in part]
                marks = [(packs or {}).get(k) or "" for k in part]
                self._redis(self._release, keys=chunk, args=[owner, MARKER_MS, *marks])

    # --- records -----------------------------------------------------------------------------------

    def write(self, record: BatchRecord) -> None:
        """Write a record, keeping a cancel that ``punchline batches --cancel`` wrote into it meanwhile."""
        if not record.cancelled_at:
            stored = self.read(record.batch_key)
            if stored is not None and stored.cancelled_at:
                record.cancelled_at = stored.cancelled_at
        self.store.put(record_path(self.run_id, record.batch_key), _encoder.encode(record))

    def cancel_requested(self) -> float:
        return cancel_requested(self.store, self.run_id)

    def declared_foreign(self) -> set[str]:
        return declared_foreign(self.store, self.run_id)

    def read(self, key: str) -> BatchRecord | None:
        raw = self.store.get(record_path(self.run_id, key))
        return None if raw is None else _decoder.decode(raw)

    def records(self, stage: str | None = None) -> list[BatchRecord]:
        out = []
        for path in _record_paths(self.store, self.run_id):
            raw = self.store.get(path)
            if raw is not None:
                rec = _decoder.decode(raw)
                if stage is None or rec.stage == stage:
                    out.append(rec)
        return sorted(out, key=lambda r: (r.intent_at, r.batch_key))

    # --- held parts ---------------------------------------------------------------------------------

    def write_parts(self, held: HeldParts) -> None:
        self.store.put(parts_path(self.run_id, held.key), _encoder.encode(held))

    def held_parts(self) -> dict[str, HeldParts]:
        """Every part file of the run, by request key (one listing)."""
        out: dict[str, HeldParts] = {}
        for path in self.store.list(parts_prefix(self.run_id)):
            raw = self.store.get(path)
            if raw is not None:
                held = _parts_decoder.decode(raw)
                out[held.key] = held
        return out

    def drop_parts(self, request_key: str) -> None:
        self.store.delete(parts_path(self.run_id, request_key))

    def new_key(self, keys: Sequence[str]) -> str:
        """The batch key for these units: a later generation when this exact set was submitted before."""
        generation = 0
        while self.store.exists(record_path(self.run_id, batch_key(keys, generation))):
            generation += 1
        return batch_key(keys, generation)


class HeldLeases:
    """The request leases one runner's batches hold, for ``lease_ms`` like every other lease, renewed every
    ``lease_ms / 4`` by a thread of their own (:meth:`keep`, a context manager): a batch's create call may take
    minutes and its polls back off to a minute, and a lease that lapsed meanwhile would let an online worker
    pay for a unit its batch pays for too. Takes and releases go through here so that the thread renews what
    is held and nothing else (one lock: a lease released is never renewed after its release)."""

    def __init__(self, batches: BatchRecords, lease_ms: int) -> None:
        self.batches = batches
        self.lease_ms = lease_ms
        self._held: dict[str, set[str]] = {}  # owner -> request keys
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def take(self, owner: str, keys: Sequence[str], *, adopt: str = "") -> list[str]:
        """:meth:`BatchRecords.take`; what it took (adopted from this run's other batches included) is renewed."""
        with self._lock:
            got = self.batches.take(owner, keys, self.lease_ms, adopt=adopt)
            if got:
                for other, held in self._held.items():
                    if other != owner:
                        held.difference_update(got)
                self._held.setdefault(owner, set()).update(got)
            return got

    def release(self, owner: str, keys: Sequence[str], packs: Mapping[str, str | None] | None = None) -> None:
        """:meth:`BatchRecords.release`; no longer renewed."""
        with self._lock:
            held = self._held.get(owner)
            if held is not None:
                held.difference_update(keys)
                if not held:
                    del self._held[owner]
            self.batches.release(owner, keys, packs)

    def renew(self) -> None:
        with self._lock:
            for owner, held in list(self._held.items()):
                self._held[owner] = set(self.batches.take(owner, sorted(held), self.lease_ms))

    def held(self, owner: str) -> set[str]:
        with self._lock:
            return set(self._held.get(owner, ()))

    def _renewing(self) -> None:
        while not self._stop.wait(self.lease_ms / 4000):
            try:
                self.renew()
            except LedgerUnavailable as exc:  # the runner's own calls say so too; the next round tries again
                log.warning("ledger_unavailable", error=str(exc), during="batch lease renewal")

    @contextlib.contextmanager
    def keep(self) -> Iterator[HeldLeases]:
        """Renew the held leases until the block ends (then they lapse after ``lease_ms``, unless released)."""
        self._stop.clear()
        thread = threading.Thread(target=self._renewing, name="batch-leases", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join(timeout=10)


def read_records(store: Store, run_id: str) -> list[BatchRecord]:
    """A run's batch records (for ``status`` and ``punchline batches``), oldest first."""
    out = []
    for path in _record_paths(store, run_id):
        raw = store.get(path)
        if raw is not None:
            out.append(_decoder.decode(raw))
    return sorted(out, key=lambda r: (r.intent_at, r.batch_key))


def now_s() -> float:
    return time.time()


def with_batch_costs(
    counters: dict[str, StageCounters], usage: list[UsageRow], records: Iterable[BatchRecord]
) -> tuple[dict[str, StageCounters], list[UsageRow]]:
    """The stage counters and per-(stage, model) rows with every batch record's requests, tokens and dollars
    added: the records, not a driver's counters, say what batches cost, however many drivers ran them. The
    inputs (what the workers paid online) are left as they are."""
    out = {stage: msgspec.structs.replace(c) for stage, c in counters.items()}
    rows = {(r.stage, r.model): msgspec.structs.replace(r) for r in usage}
    for rec in records:
        c = out.setdefault(rec.stage, StageCounters())
        c.provider_requests += rec.billed
        c.input_tokens += rec.input_tokens
        c.output_tokens += rec.output_tokens
        c.cost_usd += rec.cost_usd
        model = rec.model or f"{rec.provider} (batch)"
        row = rows.setdefault((rec.stage, model), UsageRow(stage=rec.stage, model=model))
        row.input_tokens += rec.input_tokens
        row.output_tokens += rec.output_tokens
        row.usd += rec.cost_usd
    return out, [rows[k] for k in sorted(rows)]
