"""Running a stage's units through provider batches (``mode = "batch"``): half price, exactly-once submission.

It runs in the driver before the stage's shards are handed to the workers: it groups the stage's uncached
units of batch-mode providers into batches (``batch_max_requests`` / ``batch_max_bytes``), submits them
through the exactly-once ledger (:mod:`punchline.schedulers.batches`), polls them with backoff, and writes
every answer into the **same response-cache keys** the online path uses. The shards that follow then find
every answer in the cache, so artifacts are byte-identical whichever mode paid for them. Requests that errored,
expired or were cancelled go into a new, smaller batch (succeeded ones are kept); a request that fails
``max_rounds`` batches is left to the online path.

A request the provider answers in ``n`` single calls (Anthropic, ``supports_n = false``) is ``n`` parts in a
batch, and a part is what fails or succeeds: the answered parts of a request still missing others are written
to its part file (:class:`~punchline.schedulers.batches.HeldParts`) before the batch's record says
``collected``, the next batch asks for the missing parts only (its record lists the held ones, so its request
count is known at the intent), and once all parts are there they are merged in choice-offset order, exactly as
the online call joins them, and cached; then the part file goes. So a part is paid for once, whatever fails or
whenever the driver dies.

While a batch is open its units' request leases belong to it and are renewed at every poll, so an online
worker (or another run) that needs one of them waits for the cache instead of calling. A driver killed at
any point resumes from the store's records: an intent without a batch id is reconciled with the provider's
listing before anything is submitted again, and where that cannot be decided (Anthropic batches carry no
metadata) the run stops with :class:`AmbiguousBatch` naming the batch ids to check.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from typing import Any

import msgspec
import structlog

from punchline.data.errors import FatalProviderError, LedgerUnavailable, ProviderError, PunchlineError
from punchline.data.provider_settings import Mode, ProviderSettings
from punchline.data.requests import ProviderResponse
from punchline.data.response_cache import ResponseCache
from punchline.data.units import UnitSpec
from punchline.schedulers.batches import (
    BatchLedger,
    BatchRecord,
    HeldParts,
    batch_owner,
    now_s,
    record_path,
    run_owners,
)
from punchline.workers.batch_provider import BatchInfo, BatchProvider, Part, merge_parts, parts
from punchline.workers.validators import validator

log = structlog.get_logger("punchline.batches")


class AmbiguousBatch(PunchlineError):
    """An intent may or may not have a batch behind it and the listing cannot tell which: a human decides."""


class BatchOptions(msgspec.Struct, kw_only=True):
    lease_ms: int = 600_000  # a batch's hold on its units; renewed at every poll
    poll_min_s: float = 0.2
    poll_max_s: float = 60.0
    reconcile_window_s: float = 900.0  # how long after an intent an Anthropic batch may have been created
    max_rounds: int = 4  # batches a request may go through before it is left to the online path


class BatchTotals(msgspec.Struct, kw_only=True):
    """What a stage's batches did in this driver (answers cached, what they cost at the batch price)."""

    batches: int = 0
    requests_answered: int = 0  # requests (not parts) whose answer a batch of this driver cached
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0

    def counters(self) -> dict[str, float]:
        return {
            "provider_requests": self.requests_answered,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cost_usd": self.cost_usd,
        }


def batch_mode(providers: dict[str, ProviderSettings]) -> bool:
    return any(p.mode == "batch" for p in providers.values())


def stage_providers(providers: dict[str, ProviderSettings], mode: Mode | None) -> dict[str, ProviderSettings]:
    """The providers as one stage sees them: a stage's own ``mode`` (None: none set) overrides theirs."""
    if mode is None:
        return providers
    return {name: msgspec.structs.replace(p, mode=mode) for name, p in providers.items()}


class BatchRunner:
    def __init__(
        self,
        *,
        ledger: BatchLedger,
        cache: ResponseCache,
        settings: dict[str, ProviderSettings],
        clients: dict[str, BatchProvider],
        stage: str,
        options: BatchOptions | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.ledger = ledger
        self.cache = cache
        self.settings = settings
        self.clients = clients
        self.stage = stage
        self.opt = options or BatchOptions()
        self.sleep = sleep
        self.specs: dict[str, UnitSpec] = {}
        self.answered: set[str] = set()
        self.rounds: dict[str, int] = {}
        self.held: dict[str, dict[str, ProviderResponse]] = {}  # request key -> answered parts (its part file)
        self.totals = BatchTotals()

    # --- the loop ------------------------------------------------------------------------------------

    def run(self, units: Iterable[UnitSpec]) -> BatchTotals:
        for unit in units:
            s = self.settings.get(unit.request.provider)
            if s is not None and s.mode == "batch":
                self.specs.setdefault(unit.request.key(), unit)
        self.answered = {k for k in self.specs if self.cache.contains(k)}
        self._load_held()
        active: list[BatchRecord] = []
        for rec in self.ledger.records(self.stage):  # resume: every unfinished batch first
            if rec.state != "collected":
                self._hold(rec)
                active.append(rec)
        delay = self.opt.poll_min_s
        while True:
            busy = {k for r in active for k in r.keys}
            pending = [
                k
                for k in self.specs
                if k not in self.answered and k not in busy and self.rounds.get(k, 0) < self.opt.max_rounds
            ]
            pending = [k for k in pending if not self._cached(k) and self._todo(k)]
            if not active and not pending:  # all answered, or left to the online path (max_rounds)
                break
            submitted = False
            for provider, keys in self._groups(pending):
                new = self._intent(provider, keys)
                if new is not None:
                    active.append(new)
                    submitted = True
            progressed = submitted
            for rec in list(active):
                if rec.state == "intent":
                    self._create(rec)
                    progressed |= rec.state == "submitted"
                    continue
                if self._poll(rec):
                    active.remove(rec)
                    progressed = True
            delay = self.opt.poll_min_s if progressed else min(delay * 1.5, self.opt.poll_max_s)
            self.sleep(delay)
        return self.totals

    def _cached(self, key: str) -> bool:
        if key in self.answered:
            return True
        if self.cache.contains(key):
            self.answered.add(key)
            return True
        return False

    # --- held parts ---------------------------------------------------------------------------------

    def _todo(self, key: str) -> list[Part]:
        """The parts of a request still to be asked for (all of them unless some are held)."""
        request = self.specs[key].request
        return parts(self.settings[request.provider], request, self.held.get(key, {}))

    def _load_held(self) -> None:
        """Read back the part files of this stage's requests (one listing): answered parts are never asked
        for again. A file whose request is cached meanwhile is stale and goes."""
        for key, file in self.ledger.held_parts().items():
            unit = self.specs.get(key)
            if unit is None:  # another stage's request: that stage's runner reads it
                continue
            if key in self.answered:
                self.ledger.drop_parts(key)
                continue
            ids = {p.custom_id for p in parts(self.settings[unit.request.provider], unit.request) if p.n == 1}
            held = {cid: r for cid, r in file.parts.items() if cid in ids}  # (settings may have changed since)
            if held:
                self.held[key] = held
            if not self._todo(key):  # whole but never cached (cannot happen in order; cheap to mend)
                self._complete(unit, held)

    def _complete(self, unit: UnitSpec, have: dict[str, ProviderResponse]) -> bool | None:
        """Cache the request's answer if ``have`` holds all its parts and it passes the unit's validator.
        None: parts are missing; False: the validator rejected it (the held parts go, the request is asked
        for whole again, as the online path retries all ``n``); True: cached, the part file is gone."""
        key = unit.request.key()
        outcome = merge_parts(unit.request, have, self.settings[unit.request.provider])
        if outcome.response is None:
            return None
        ok = True
        try:
            validator(unit.check)(outcome.response)
        except ProviderError:
            ok = False
        if ok:
            if not self.cache.put(unit.request, outcome.response):
                log.info("batch_answer_already_cached", key=key)
            self.answered.add(key)
        if self.held.pop(key, None) is not None:  # only after the cache put: a kill before it loses nothing
            self.ledger.drop_parts(key)
        return ok

    def _groups(self, keys: list[str]) -> Iterable[tuple[str, list[str]]]:
        """Batches within each provider's request and byte limits, in key order (deterministic)."""
        by_provider: dict[str, list[str]] = {}
        for k in sorted(keys):
            by_provider.setdefault(self.specs[k].request.provider, []).append(k)
        for provider, ks in by_provider.items():
            s = self.settings[provider]
            group: list[str] = []
            n = size = 0
            for k in ks:
                req = self.specs[k].request
                cost = len(self._todo(k))
                # every part carries the whole body (an input-file line each)
                nbytes = (len(json.dumps([m.content for m in req.messages])) + 200) * cost
                if group and (n + cost > s.batch_max_requests or size + nbytes > s.batch_max_bytes):
                    yield provider, group
                    group, n, size = [], 0, 0
                group.append(k)
                n += cost
                size += nbytes
            if group:
                yield provider, group

    # --- submission: intent, create, record the id ----------------------------------------------------

    def _intent(self, provider: str, keys: list[str]) -> BatchRecord | None:
        # a partly answered request's lease stayed with this run's earlier batch: this one adopts it
        adopt = run_owners(self.ledger.run_id)
        key = self.ledger.new_key(keys)
        owner = batch_owner(self.ledger.run_id, key)
        held = set(self.ledger.take(owner, keys, self.opt.lease_ms, adopt=adopt))
        if len(held) < len(keys):  # some are someone else's right now: they wait for the cache
            self.ledger.release(owner, list(held))
            keys = [k for k in keys if k in held]
            if not keys:
                return None
            key = self.ledger.new_key(keys)
            owner = batch_owner(self.ledger.run_id, key)
            if set(self.ledger.take(owner, keys, self.opt.lease_ms, adopt=adopt)) != set(keys):
                self.ledger.release(owner, keys)
                return None
        rec = BatchRecord(
            batch_key=key,
            run_id=self.ledger.run_id,
            stage=self.stage,
            provider=provider,
            keys=sorted(keys),
            # what is submitted is fixed here, so a batch created again after a kill is the same batch
            requests=sum(len(self._todo(k)) for k in keys),
            held_parts=sorted(cid for k in keys for cid in self.held.get(k, {})),
            intent_at=now_s(),
        )
        for k in keys:
            self.rounds[k] = self.rounds.get(k, 0) + 1
        self.ledger.write(rec)
        log.info(
            "batch_intent",
            stage=self.stage,
            batch_key=key,
            provider=provider,
            requests=rec.requests,
            held_parts=len(rec.held_parts),
        )
        return rec

    def _hold(self, rec: BatchRecord) -> None:
        """A resumed batch takes its units' leases back (a lease that lapsed meanwhile is simply re-taken)."""
        keys = [k for k in rec.keys if k in self.specs]
        self.ledger.take(batch_owner(rec.run_id, rec.batch_key), keys, self.opt.lease_ms)
        for k in keys:
            self.rounds[k] = self.rounds.get(k, 0) + 1

    def _create(self, rec: BatchRecord) -> None:
        if self._reconcile(rec) is not None:
            return
        client = self.clients[rec.provider]
        requests = [self.specs[k].request for k in rec.keys]
        try:
            info = client.create(rec.batch_key, requests, skip=set(rec.held_parts))
        except FatalProviderError:
            raise
        except ProviderError as exc:  # did it get created? only the provider knows: ask before anything else
            log.warning("batch_create_unknown", batch_key=rec.batch_key, error=str(exc))
            self._reconcile(rec)
            return
        self._submitted(rec, info)

    def _submitted(self, rec: BatchRecord, info: BatchInfo) -> None:
        rec.batch_id = info.batch_id
        rec.state = "submitted"
        rec.submitted_at = now_s()
        rec.provider_status = info.provider_status
        self.ledger.write(rec)  # the id reaches the store before anything else happens
        self.totals.batches += 1
        log.info("batch_submitted", stage=self.stage, batch_key=rec.batch_key, batch_id=info.batch_id)

    def _reconcile(self, rec: BatchRecord) -> BatchInfo | None:
        """Find the batch an intent may have created (the driver died between create and recording its id)."""
        if rec.state != "intent":
            return None
        client = self.clients[rec.provider]
        recent = client.recent(limit=100)
        if client.has_metadata:
            hits = [b for b in recent if b.batch_key == rec.batch_key]
            hits.sort(key=lambda b: b.created_at)
            if len(hits) > 1:
                log.warning("batch_duplicates", batch_key=rec.batch_key, ids=[b.batch_id for b in hits])
        else:
            known = {r.batch_id for r in self.ledger.records() if r.batch_id}
            lo, hi = rec.intent_at - 120.0, rec.intent_at + self.opt.reconcile_window_s
            hits = [
                b for b in recent if b.batch_id not in known and b.total == rec.requests and lo <= b.created_at <= hi
            ]
            if len(hits) > 1:
                ids = ", ".join(b.batch_id for b in hits)
                raise AmbiguousBatch(
                    f"batch {rec.batch_key} of stage {rec.stage} ({rec.requests} requests to {rec.provider}) may be "
                    f"any of {ids}: check them, cancel the extra ones, and put the right id into "
                    f"{record_path(rec.run_id, rec.batch_key)} (state submitted) before resuming"
                )
        if not hits:
            return None
        log.info("batch_reconciled", batch_key=rec.batch_key, batch_id=hits[0].batch_id)
        self._submitted(rec, hits[0])
        return hits[0]

    # --- polling and collecting -------------------------------------------------------------------------

    def _poll(self, rec: BatchRecord) -> bool:
        """True once the batch is collected (its answers are in the cache, its record says so)."""
        client = self.clients[rec.provider]
        owner = batch_owner(rec.run_id, rec.batch_key)
        try:
            self.ledger.take(owner, [k for k in rec.keys if k not in self.answered], self.opt.lease_ms)
        except LedgerUnavailable as exc:  # the leases lapse later; the batch is paid for either way
            log.warning("ledger_unavailable", error=str(exc))
        try:
            info = client.retrieve(rec.batch_id)
        except FatalProviderError as exc:
            if exc.status != 404:
                raise
            # the provider no longer knows it (e.g. the simulator of a killed driver): its units go again
            log.warning("batch_gone", batch_id=rec.batch_id, error=str(exc))
            rec.state, rec.failed, rec.provider_status, rec.collected_at = "collected", rec.requests, "gone", now_s()
            self.ledger.write(rec)
            self._release(rec, owner)
            return True
        except ProviderError as exc:
            log.warning("batch_poll_failed", batch_id=rec.batch_id, error=str(exc))
            return False
        if info.status != "ended":
            if info.provider_status != rec.provider_status:
                rec.provider_status = info.provider_status
                self.ledger.write(rec)
            return False
        try:
            got = client.results(rec.batch_id)
        except FatalProviderError:
            raise
        except ProviderError as exc:
            log.warning("batch_results_failed", batch_id=rec.batch_id, error=str(exc))
            return False
        s = self.settings[rec.provider]
        skip = set(rec.held_parts)
        succeeded = failed = answered = 0
        rec.input_tokens = rec.output_tokens = 0  # counted afresh from the results (a collect may be repeated)
        rec.cost_usd = rec.online_cost_usd = 0.0
        for key in rec.keys:
            unit = self.specs[key]
            fresh: dict[str, ProviderResponse] = {}
            for part in parts(s, unit.request, skip):
                value = got.get(part.custom_id, "missing")
                if isinstance(value, str):
                    failed += 1
                    continue
                fresh[part.custom_id] = value
                self._account(rec, s, unit.request.model, value)  # billed, whatever becomes of it
            if key in self.answered:  # cached before a kill (or by someone else): nothing more to keep
                succeeded += len(fresh)
                continue
            have = {**self.held.get(key, {}), **fresh}
            done = self._complete(unit, have)
            if done is None:  # parts still missing: the answered ones are kept before the record moves on
                succeeded += len(fresh)
                if self._cached(key):  # someone else's answer arrived meanwhile: nothing to keep
                    if self.held.pop(key, None) is not None:
                        self.ledger.drop_parts(key)
                elif fresh:
                    self.held[key] = have
                    self.ledger.write_parts(HeldParts(key=key, parts=have))
            elif done:
                succeeded += len(fresh)
                answered += 1
            else:
                failed += len(fresh)
        rec.succeeded = succeeded
        rec.failed = failed
        rec.state = "collected"
        rec.collected_at = now_s()
        rec.provider_status = info.provider_status
        self.ledger.write(rec)
        self._release(rec, owner)
        self.totals.requests_answered += answered
        self.totals.input_tokens += rec.input_tokens
        self.totals.output_tokens += rec.output_tokens
        self.totals.cost_usd += rec.cost_usd
        log.info(
            "batch_collected",
            batch_id=rec.batch_id,
            status=info.provider_status,
            succeeded=rec.succeeded,
            failed=rec.failed,
            answered=answered,
        )
        return True

    @staticmethod
    def _account(rec: BatchRecord, s: ProviderSettings, model: str, response: ProviderResponse) -> None:
        online = s.cost_usd(model, response.input_tokens, response.output_tokens)
        rec.input_tokens += response.input_tokens
        rec.output_tokens += response.output_tokens
        rec.online_cost_usd += online
        rec.cost_usd += online * s.batch_price_factor

    def _release(self, rec: BatchRecord, owner: str) -> None:
        """Release a collected batch's leases, except those of partly answered requests this runner asks
        again for the rest: no one else may ask for all ``n`` parts meanwhile (the next batch adopts them)."""
        keep = {
            k
            for k in rec.keys
            if k in self.held and k not in self.answered and self.rounds.get(k, 0) < self.opt.max_rounds
        }
        self.ledger.release(owner, [k for k in rec.keys if k not in keep])


def run_stage_batches(
    client: Any,
    cache: ResponseCache,
    run_id: str,
    stage: str,
    units: Iterable[UnitSpec],
    settings: dict[str, ProviderSettings],
    *,
    namespace: str = "pl",
    options: BatchOptions | None = None,
) -> BatchTotals:
    """Run a stage's batch-mode units through batches (the coordinator's one entry point)."""
    from punchline.workers.providers import make_batch_provider

    clients = {name: make_batch_provider(name, s) for name, s in settings.items() if s.mode == "batch"}
    try:
        runner = BatchRunner(
            ledger=BatchLedger(client, cache.store, run_id, namespace=namespace),
            cache=cache,
            settings=settings,
            clients=clients,
            stage=stage,
            options=options,
        )
        return runner.run(units)
    finally:
        for c in clients.values():
            c.close()
