"""The batches executor: a stage's units through provider batches (``mode = "batch"``): half price, exactly-once
submission.

It runs in the driver (which waits anyway) before the stage's shards are worked by the shards executor
(:class:`BatchExecutor`): it groups the stage's uncached units of batch-mode providers into batches
(``batch_max_requests`` / ``batch_max_bytes``), submits them through the exactly-once ledger
(:mod:`punchline.schedulers.batches`), polls them with backoff, and writes every answer into the **same
response-cache keys** the online path uses. The shards that follow then find every answer in the cache, so
artifacts are byte-identical whichever mode paid for them. Requests that errored, expired or were cancelled go
into a new, smaller batch (succeeded ones are kept); a request that fails ``max_rounds`` batches is left to the
online path.

A request the provider answers in ``n`` single calls (Anthropic, ``supports_n = false``) is ``n`` parts in a
batch, and a part is what fails or succeeds: the answered parts of a request still missing others are written
to its part file (:class:`~punchline.schedulers.batches.HeldParts`) before the batch's record says
``collected``, the next batch asks for the missing parts only (its record lists the held ones, so its request
count is known at the intent), and once all parts are there they are merged in choice-offset order, exactly as
the online call joins them, and cached; then the part file goes. So a part is paid for once, whatever fails or
whenever the driver dies.

While a batch is open its units' request leases belong to it, for the run's ``lease_ms`` like every other
lease, and a thread of the runner renews them every ``lease_ms / 4`` whatever the runner is doing (a create
call that takes minutes, a poll backing off to a minute), so an online worker (or another run) that needs one
of them waits for the cache instead of calling. A driver killed at
any point resumes from the store's records: an intent without a batch id is reconciled with the provider's
listing before anything is submitted again. The listing is paged back to the intent's time, however many
batches the account holds, and a batch is taken only when it carries what only this intent could have
written, its random tag: OpenAI's metadata, Anthropic's custom ids (checked in the batch's results; while a
candidate with the right count, created during the intent's own create call, is still open nothing is adopted and
nothing is created: the intent waits until the results say whose it is; a batch created at any other time is
never a candidate, so it never holds a run back). A batch not provably ours is never adopted, polled as ours or
cancelled.

Batches hold **one model** each (OpenAI requires one model per input file). A batch the provider refuses as a
whole (validation) is recorded ``failed`` with the provider's reason; its requests, like requests that failed
``max_rounds`` batches, are not paid for online unless the provider says ``batch_fallback = "online"`` (and the
record then says so): by default the stage stops with :class:`BatchFailed`, one line naming the reason.
A cancel recorded by ``punchline batches --cancel`` after this runner started stops it from sending anything
more (:class:`BatchesCancelled`), after collecting what came back.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable

import msgspec
import structlog

from punchline.cluster.executor import ExecutorName, StageExecutor, stage_providers
from punchline.cluster.pipeline import Stage, StageContext, pipeline_code
from punchline.data.errors import BudgetExceeded, FatalProviderError, LedgerUnavailable, ProviderError, PunchlineError
from punchline.data.provider_settings import ProviderSettings
from punchline.data.requests import ProviderResponse
from punchline.data.response_cache import ResponseCache
from punchline.data.units import ShardResults, StagePlan, UnitSpec
from punchline.schedulers.batches import (
    BatchLedger,
    BatchRecord,
    HeldLeases,
    HeldParts,
    batch_owner,
    new_tag,
    now_s,
    run_owners,
)
from punchline.schedulers.budget import Budget, estimate_request_cost
from punchline.schedulers.ledger import Ledger
from punchline.workers.batch_provider import (
    BatchInfo,
    BatchProvider,
    Part,
    PartOutcome,
    merge_parts,
    part_id,
    parts,
    wire_ids,
)
from punchline.workers.providers import make_batch_provider
from punchline.workers.shard_worker import WorkerConfig
from punchline.workers.validators import validator

log = structlog.get_logger("punchline.batches")
# a batch's hold on the run's budget outlives the provider's longest batch (24 h) with a margin: it is
# settled when the batch is collected, and a resumed driver holds the same batch again (never twice)
BATCH_HOLD_S = 26 * 3600.0


class BatchFailed(PunchlineError):
    """Requests no batch could answer (the provider refused their batch, or they failed ``max_rounds`` batches)
    that the config does not let go online (``batch_fallback = "fail"``): the stage stops, naming why."""


class BatchesCancelled(PunchlineError):
    """``punchline batches --cancel`` cancelled the run's batches while this runner was live: it sent nothing
    more, kept what came back, and stops the stage (a resume submits the rest)."""


class BatchOptions(msgspec.Struct, kw_only=True):
    lease_ms: int = 30_000  # a batch's hold on its units (the run's lease_ms); renewed every lease_ms / 4
    poll_min_s: float = 0.2
    poll_max_s: float = 60.0
    reconcile_window_s: float = 900.0  # how long after an intent an Anthropic batch may have been created
    clock_skew_s: float = 120.0  # how far the provider's clock may be behind ours (the listing goes back so far)
    # after a create whose outcome is unknown (a timeout), how long the listing must show nothing before the
    # batch is created again: a provider may finish creating it after the client gave up
    create_grace_s: float = 120.0
    max_rounds: int = 4  # batches a request may go through before it is given up (``batch_fallback`` says what then)


class BatchTotals(msgspec.Struct, kw_only=True):
    """What a stage's batches did in this driver (answers cached, what they cost at the batch price). The
    run's figures come from the records (:func:`~punchline.schedulers.batches.with_batch_costs`), not these."""

    batches: int = 0
    requests_answered: int = 0  # requests (not parts) whose answer a batch of this driver cached
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    online_fallback: int = 0  # requests left to the online path (``batch_fallback = "online"``)


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
        max_cost_usd: float | None = None,
    ) -> None:
        self.ledger = ledger
        self.max_cost_usd = max_cost_usd  # the run's cap: a batch is priced and held in it before it is created
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
        self.started_at = now_s()
        self.cancelled_at = 0.0  # a cancel seen while live: nothing more is sent
        self.foreign: set[str] = set()  # batch ids proven not this run's (their results carry other ids)
        self.refused: list[BatchRecord] = []  # batches the provider refused whose requests may not go online
        self.exhausted: dict[str, str] = {}  # request key -> last reason, after max_rounds batches (may not go online)
        self.over_budget: list[BatchRecord] = []  # batches not created: they would have taken the run past its cap
        self.unsure: dict[str, float] = {}  # batch key -> when a create of unknown outcome failed (monotonic)
        self.leases = HeldLeases(ledger, self.opt.lease_ms)  # the batches' request leases, renewed meanwhile

    # --- the loop ------------------------------------------------------------------------------------

    def run(self, units: Iterable[UnitSpec]) -> BatchTotals:
        self.leases = HeldLeases(self.ledger, self.opt.lease_ms)
        with self.leases.keep():  # renewed every lease_ms / 4, whatever the loop is waiting for
            return self._run(units)

    def _run(self, units: Iterable[UnitSpec]) -> BatchTotals:
        self.started_at = now_s()
        for unit in units:
            s = self.settings.get(unit.request.provider)
            if s is not None and s.mode == "batch":
                self.specs.setdefault(unit.request.key(), unit)
        self.answered = {k for k in self.specs if self.cache.contains(k)}
        self._load_held()
        active: list[BatchRecord] = []
        for rec in self.ledger.records(self.stage):  # resume: every unfinished batch first
            if rec.state in ("intent", "submitted"):
                self._hold(rec)
                active.append(rec)
        delay = self.opt.poll_min_s
        while True:
            self._check_cancel(active)
            busy = {k for r in active for k in r.keys}
            pending = [
                k
                for k in self.specs
                if k not in self.answered and k not in busy and self.rounds.get(k, 0) < self.opt.max_rounds
            ]
            pending = [k for k in pending if not self._cached(k) and self._todo(k)]
            if not active and (not pending or self.cancelled_at or self.over_budget):  # answered, given up, stopped
                break
            submitted = False
            for provider, model, keys in [] if self.cancelled_at or self.over_budget else self._groups(pending):
                new = self._intent(provider, model, keys)
                if new is not None:
                    active.append(new)
                    submitted = True
            progressed = submitted
            for rec in list(active):
                if rec.state == "intent":
                    self._create(rec)
                    progressed |= rec.state != "intent"
                    if rec.state == "failed" or (self.cancelled_at and rec.state == "intent"):
                        active.remove(rec)  # refused; or cancelled before it was created (a resume creates it)
                    continue
                if self._poll(rec):
                    active.remove(rec)
                    progressed = True
            delay = self.opt.poll_min_s if progressed else min(delay * 1.5, self.opt.poll_max_s)
            self.sleep(delay)
        self._finish()
        return self.totals

    def _cached(self, key: str) -> bool:
        if key in self.answered:
            return True
        if self.cache.contains(key):
            self.answered.add(key)
            return True
        return False

    def _finish(self) -> None:
        """Stop the stage where requests are left that may not go online (or the batches were cancelled)."""
        unanswered = [k for k in self.specs if not self._cached(k)]
        if self.over_budget:
            rec = self.over_budget[0]
            raise BudgetExceeded(
                f"stage {self.stage}: {rec.error}; {len(unanswered)} requests are unanswered and were not sent; "
                "everything collected so far is kept (resume with a higher --max-cost-usd)"
            )
        if self.cancelled_at:
            when = time.strftime("%H:%M:%S", time.gmtime(self.cancelled_at))
            raise BatchesCancelled(
                f"stage {self.stage}: the run's batches were cancelled (punchline batches --cancel at {when} UTC); "
                f"{len(unanswered)} requests are unanswered and were not sent again, in batches or online; what "
                "came back is kept: resume the run to submit the rest"
            )
        if self.refused:
            rec = self.refused[0]
            more = f" (and {len(self.refused) - 1} more batches)" if len(self.refused) > 1 else ""
            raise BatchFailed(
                f"stage {self.stage}: {rec.provider} refused batch {rec.batch_id or rec.batch_key} "
                f"({rec.requests} requests to {rec.model or rec.provider}){more}: {rec.error}; its requests were "
                f'not sent online (set batch_fallback = "online" in [providers.{rec.provider}] to pay the online '
                "price for them)"
            )
        left = [k for k in self.exhausted if k in unanswered]
        if left:
            provider = self.specs[left[0]].request.provider
            raise BatchFailed(
                f"stage {self.stage}: {len(left)} requests to {provider} failed in {self.opt.max_rounds} batches "
                f"each (last: {self.exhausted[left[0]]}); they were not sent online (resume to try them in batches "
                f'again, or set batch_fallback = "online" in [providers.{provider}] to pay the online price)'
            )

    # --- cancels -------------------------------------------------------------------------------------

    def _check_cancel(self, active: list[BatchRecord]) -> None:
        """A cancel recorded after this runner started: cancel what is open (the command may have missed a
        batch created meanwhile; every one here is provably ours) and send nothing more."""
        at = self.ledger.cancel_requested()
        if at < self.started_at or at <= self.cancelled_at:
            return
        self.cancelled_at = at
        log.warning("batches_cancelled", stage=self.stage, open=len(active))
        for rec in active:
            if rec.batch_id:
                self._cancel(rec)

    def _cancel(self, rec: BatchRecord) -> None:
        try:
            info = self.clients[rec.provider].cancel(rec.batch_id)
            rec.provider_status = info.provider_status
        except ProviderError as exc:  # ended meanwhile, or unreachable: the poll tells
            log.warning("batch_cancel_failed", batch_id=rec.batch_id, error=str(exc))
        rec.cancelled_at = rec.cancelled_at or self.cancelled_at
        self.ledger.write(rec)

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

    def _groups(self, keys: list[str]) -> Iterable[tuple[str, str, list[str]]]:
        """Batches of one provider and one model each (OpenAI requires one model per input file; the endpoint
        is one per provider kind), within the provider's request and byte limits, in key order (deterministic)."""
        by_model: dict[tuple[str, str], list[str]] = {}
        for k in sorted(keys):
            request = self.specs[k].request
            by_model.setdefault((request.provider, request.model), []).append(k)
        for (provider, model), ks in sorted(by_model.items()):
            s = self.settings[provider]
            group: list[str] = []
            n = size = 0
            for k in ks:
                req = self.specs[k].request
                cost = len(self._todo(k))
                # every part carries the whole body (an input-file line each)
                nbytes = (len(json.dumps([m.content for m in req.messages])) + 200) * cost
                if group and (n + cost > s.batch_max_requests or size + nbytes > s.batch_max_bytes):
                    yield provider, model, group
                    group, n, size = [], 0, 0
                group.append(k)
                n += cost
                size += nbytes
            if group:
                yield provider, model, group

    # --- submission: intent, create, record the id ----------------------------------------------------

    def _intent(self, provider: str, model: str, keys: list[str]) -> BatchRecord | None:
        # a partly answered request's lease stayed with this run's earlier batch: this one adopts it
        adopt = run_owners(self.ledger.run_id)
        key = self.ledger.new_key(keys)
        owner = batch_owner(self.ledger.run_id, key)
        held = set(self.leases.take(owner, keys, adopt=adopt))
        if len(held) < len(keys):  # some are someone else's right now: they wait for the cache
            self.leases.release(owner, list(held))
            keys = [k for k in keys if k in held]
            if not keys:
                return None
            key = self.ledger.new_key(keys)
            owner = batch_owner(self.ledger.run_id, key)
            if set(self.leases.take(owner, keys, adopt=adopt)) != set(keys):
                self.leases.release(owner, keys)
                return None
        rec = BatchRecord(
            batch_key=key,
            run_id=self.ledger.run_id,
            stage=self.stage,
            provider=provider,
            model=model,
            tag=new_tag(),
            keys=sorted(keys),
            # what is submitted is fixed here, so a batch created again after a kill is the same batch
            requests=sum(len(self._todo(k)) for k in keys),
            held_parts=sorted(cid for k in keys for cid in self.held.get(k, {})),
            intent_at=now_s(),
            create_at=0.0,  # no create call yet: a driver killed before it leaves nothing to look for
        )
        rec.estimate_usd = self._price(rec)
        for k in keys:
            self.rounds[k] = self.rounds.get(k, 0) + 1
        self.ledger.write(rec)
        log.info(
            "batch_intent",
            stage=self.stage,
            batch_key=key,
            provider=provider,
            model=model,
            requests=rec.requests,
            held_parts=len(rec.held_parts),
        )
        return rec

    def _price(self, rec: BatchRecord) -> float:
        """The most the batch may cost at the batch price: each request's upper bound (input chars / 4, output
        ``max_tokens`` per choice), for the parts it asks for (the held ones are not submitted again)."""
        s = self.settings[rec.provider]
        total = 0.0
        for k in rec.keys:
            request = self.specs[k].request
            asked, whole = len(self._todo(k)), len(parts(s, request))
            total += estimate_request_cost(s, request)[2] * s.batch_price_factor * (asked / whole if whole else 1.0)
        return total

    def _budget(self, rec: BatchRecord) -> Budget | None:
        """The run's budget as this batch holds it (None: no cap)."""
        if self.max_cost_usd is None:
            return None
        holder = batch_owner(rec.run_id, rec.batch_key)
        return Budget(self.ledger.r, rec.run_id, self.max_cost_usd, holder=holder, reservation_ttl_s=BATCH_HOLD_S)

    def _hold_budget(self, rec: BatchRecord, *, exists: bool) -> bool:
        """Hold the batch's price in the run's budget (once; a batch that ``exists`` already is held whatever
        the cap: it is paid for anyway). False: creating it would take the run past its cap."""
        budget = self._budget(rec)
        return budget is None or budget.hold_once(rec.estimate_usd or self._price(rec), force=exists)

    def _settle_budget(self, rec: BatchRecord, actual_usd: float) -> None:
        """The batch's hold becomes what it cost (before its record says collected: a kill in between counts it
        twice at worst, never not at all)."""
        budget = self._budget(rec)
        if budget is not None:
            budget.settle(rec.estimate_usd, actual_usd)

    def _over_budget(self, rec: BatchRecord) -> None:
        """Not created: it would take the run past its cap. Its requests stay unanswered (and unpaid)."""
        budget = self._budget(rec)
        spent = budget.spent_usd() + budget.reserved_usd() if budget is not None else 0.0
        rec.state = "failed"
        rec.error = (
            f"batch of {rec.requests} requests to {rec.model or rec.provider} not created: at up to "
            f"${rec.estimate_usd:.6g} (batch price) it would take the run past max_cost_usd ${self.max_cost_usd:g} "
            f"(${spent:.6g} spent or held)"
        )
        rec.collected_at = now_s()
        self.ledger.write(rec)
        self.leases.release(batch_owner(rec.run_id, rec.batch_key), rec.keys)
        self.over_budget.append(rec)
        log.warning("batch_over_budget", stage=self.stage, batch_key=rec.batch_key, error=rec.error)

    def _hold(self, rec: BatchRecord) -> None:
        """A resumed batch takes its units' leases back (a lease that lapsed meanwhile is simply re-taken)."""
        keys = [k for k in rec.keys if k in self.specs]
        self.leases.take(batch_owner(rec.run_id, rec.batch_key), keys)
        if rec.state == "submitted":  # it exists: its price is held whatever the cap
            self._hold_budget(rec, exists=True)
        for k in keys:
            self.rounds[k] = self.rounds.get(k, 0) + 1

    def _create(self, rec: BatchRecord) -> None:
        found = self._reconcile(rec)
        if found == "absent" and time.monotonic() - self.unsure.get(rec.batch_key, -1e18) < self.opt.create_grace_s:
            found = "unresolved"  # the last create may still land: the listing has to show nothing for a while
        if found != "absent" or self.cancelled_at:  # adopted, still unresolved, or nothing may be sent now
            if rec.state == "intent":  # still waiting: its units stay this intent's meanwhile
                keys = [k for k in rec.keys if k in self.specs]
                self.leases.take(batch_owner(rec.run_id, rec.batch_key), keys)
            elif self.cancelled_at and rec.batch_id:
                self._cancel(rec)
            return
        if not self._hold_budget(rec, exists=False):  # priced and held before it is created, or not created
            self._over_budget(rec)
            return
        client = self.clients[rec.provider]
        requests = [self.specs[k].request for k in rec.keys]
        if rec.create_at <= 0:  # from now on a batch may exist: a resumed driver has to look for it
            if not client.has_metadata:  # what is on the account already is not this intent's, whatever its count
                rec.predates = self._look_alikes(rec)
            rec.create_at = now_s()
        rec.last_create_at = now_s()  # a create tried again (after a timeout) widens the window to its own call
        self.ledger.write(rec)
        try:
            info = client.create(rec.batch_key, requests, skip=set(rec.held_parts), tag=rec.tag)
        except FatalProviderError as exc:  # refused at create (Anthropic validates there): never created
            self._refused(rec, str(exc))
            return
        except ProviderError as exc:  # did it get created? only the provider knows: ask before anything else
            log.warning("batch_create_unknown", batch_key=rec.batch_key, error=str(exc))
            self.unsure[rec.batch_key] = time.monotonic()
            self._reconcile(rec)
            return
        self._submitted(rec, info)

    def _look_alikes(self, rec: BatchRecord) -> list[str]:
        """The batches with the intent's request count that the account holds right before its first create
        call, as far back as its window reaches (none if the listing fails: then nothing is ruled out)."""
        since = now_s() - self.opt.clock_skew_s
        try:
            listed = self.clients[rec.provider].listing(since=since)
            return sorted(b.batch_id for b in listed if b.total == rec.requests)
        except ProviderError as exc:
            log.warning("batch_listing_failed", batch_key=rec.batch_key, error=str(exc))
            return []

    def _submitted(self, rec: BatchRecord, info: BatchInfo) -> None:
        self._hold_budget(rec, exists=True)  # held already when this driver created it; a dead driver's: now
        rec.batch_id = info.batch_id
        rec.state = "submitted"
        rec.submitted_at = now_s()
        rec.provider_status = info.provider_status
        self.ledger.write(rec)  # the id reaches the store before anything else happens
        self.totals.batches += 1
        log.info("batch_submitted", stage=self.stage, batch_key=rec.batch_key, batch_id=info.batch_id)

    def _reconcile(self, rec: BatchRecord) -> str:
        """Find the batch an intent may have created (the driver died between create and recording its id):
        ``adopted`` (now recorded), ``absent`` (provably none: it may be created) or ``unresolved`` (a candidate
        is still open and only its results can tell whose it is: nothing is created or adopted meanwhile)."""
        if rec.state != "intent":
            return "adopted"
        if rec.create_at == 0.0:  # the create call was never started: there is nothing to find
            return "absent"
        client = self.clients[rec.provider]
        known = {r.batch_id for r in self.ledger.records() if r.batch_id}
        listed = client.listing(since=rec.intent_at - self.opt.clock_skew_s)  # every page back to the intent
        if client.has_metadata:  # the batch key and the intent's tag are in the batch's metadata
            hits = sorted(
                (b for b in listed if b.batch_key == rec.batch_key and b.tag == rec.tag and b.batch_id not in known),
                key=lambda b: b.created_at,
            )
            if len(hits) > 1:
                log.warning("batch_duplicates", batch_key=rec.batch_key, ids=[b.batch_id for b in hits])
            return self._adopt(rec, hits[0]) if hits else "absent"
        # no metadata (Anthropic): count and time narrow it down; only the custom ids in the results prove it
        earliest, latest = self._create_window(rec)
        ruled_out = known | self.foreign | set(rec.predates) | self.ledger.declared_foreign()
        candidates = [
            b
            for b in listed
            if b.batch_id not in ruled_out and b.total == rec.requests and earliest <= b.created_at <= latest
        ]
        if not candidates:
            return "absent"
        expected = self._wire_ids(rec)
        still_open = []
        for b in candidates:
            if b.status != "ended":
                still_open.append(b.batch_id)
            elif expected is not None and set(client.results(b.batch_id)) == expected:
                return self._adopt(rec, b)
            else:
                self.foreign.add(b.batch_id)  # someone else's: never looked at again
        if not still_open:
            return "absent"
        status = f"checking {', '.join(still_open)}"
        if rec.provider_status != status:
            rec.provider_status = status
            self.ledger.write(rec)
            log.warning(
                "batch_unresolved",
                batch_key=rec.batch_key,
                candidates=still_open,
                reason="open batches with this count created during this intent's cut-off create call: their "
                "results will tell whose they are (a user who knows one is not this run's: punchline batches "
                f"{rec.run_id} --not-ours ID)",
            )
        return "unresolved"

    def _create_window(self, rec: BatchRecord) -> tuple[float, float]:
        """When the intent's batch can have been created, by what only the intent knows: its create call started
        at ``create_at`` and lasted at most the provider's ``timeout_s``, and a provider may finish a create up to
        ``create_grace_s`` after its client gave up; both ends widened by the clock skew allowed. A batch created
        outside it (before the call, or minutes after) is not the intent's, whatever its count, and never holds
        it back. A record written before ``create_at`` existed (-1) keeps the old window (intent + 15 min)."""
        if rec.create_at <= 0:
            return float("-inf"), rec.intent_at + self.opt.reconcile_window_s
        call_s = self.settings[rec.provider].timeout_s + self.opt.create_grace_s
        last = max(rec.create_at, rec.last_create_at)
        return rec.create_at - self.opt.clock_skew_s, last + call_s + self.opt.clock_skew_s

    def _adopt(self, rec: BatchRecord, info: BatchInfo) -> str:
        log.info("batch_reconciled", batch_key=rec.batch_key, batch_id=info.batch_id)
        self._submitted(rec, info)
        return "adopted"

    def _wire_ids(self, rec: BatchRecord) -> set[str] | None:
        """The custom ids a batch of this intent carries (None: its requests are not all known here)."""
        if any(k not in self.specs for k in rec.keys):
            return None
        requests = [self.specs[k].request for k in rec.keys]
        return wire_ids(self.settings[rec.provider], requests, rec.tag, set(rec.held_parts))

    def _refused(self, rec: BatchRecord, reason: str) -> None:
        """The provider refused the whole batch: recorded with its reason; its requests go online only where
        the provider's ``batch_fallback`` says so, else the stage stops at the end (:meth:`_finish`)."""
        self._settle_budget(rec, 0.0)  # refused as a whole: nothing ran, nothing was billed
        rec.state = "failed"
        rec.error = " ".join(reason.split())[:300]
        rec.collected_at = now_s()
        keys = [k for k in rec.keys if k in self.specs and not self._cached(k)]
        for k in keys:
            self.rounds[k] = self.opt.max_rounds  # never in a batch again in this driver
        if self.settings[rec.provider].batch_fallback == "online":
            rec.fallback, rec.online_requests = "online", len(keys)
            self.totals.online_fallback += len(keys)
        else:
            self.refused.append(rec)
        self.ledger.write(rec)
        self.leases.release(batch_owner(rec.run_id, rec.batch_key), rec.keys)
        log.warning(
            "batch_refused",
            stage=self.stage,
            batch_key=rec.batch_key,
            batch_id=rec.batch_id,
            error=rec.error,
            fallback=rec.fallback or "fail",
            requests=len(keys),
        )

    # --- polling and collecting -------------------------------------------------------------------------

    def _poll(self, rec: BatchRecord) -> bool:
        """True once the batch is collected (its answers are in the cache, its record says so)."""
        client = self.clients[rec.provider]
        owner = batch_owner(rec.run_id, rec.batch_key)
        try:
            self.leases.take(owner, [k for k in rec.keys if k not in self.answered])
        except LedgerUnavailable as exc:  # the leases lapse later; the batch is paid for either way
            log.warning("ledger_unavailable", error=str(exc))
        try:
            info = client.retrieve(rec.batch_id)
        except FatalProviderError as exc:
            if exc.status != 404:
                raise
            # the provider no longer knows it (e.g. the simulator of a killed driver): its units go again
            log.warning("batch_gone", batch_id=rec.batch_id, error=str(exc))
            self._settle_budget(rec, 0.0)
            rec.state, rec.failed, rec.provider_status, rec.collected_at = "collected", rec.requests, "gone", now_s()
            self.ledger.write(rec)
            self._release(rec, owner)
            return True
        except ProviderError as exc:
            log.warning("batch_poll_failed", batch_id=rec.batch_id, error=str(exc))
            return False
        log.info(  # every poll says where the batch is: a stage waiting on batches is never a silent gap
            "batch_poll",
            stage=self.stage,
            batch_id=rec.batch_id,
            status=info.provider_status,
            total=info.total,
            succeeded=info.succeeded,
            failed=info.failed,
        )
        if info.status != "ended":
            if info.provider_status != rec.provider_status:
                rec.provider_status = info.provider_status
                self.ledger.write(rec)
            return False
        rec.provider_status = info.provider_status
        if info.error:  # refused as a whole (validation): nothing ran, nothing was billed
            self._refused(rec, f"{info.provider_status}: {info.error}")
            return True
        try:
            got = own_parts(client.results(rec.batch_id), rec.tag)
        except FatalProviderError:
            raise
        except ProviderError as exc:
            log.warning("batch_results_failed", batch_id=rec.batch_id, error=str(exc))
            return False
        self._collect(rec, got)
        self._settle_budget(rec, rec.cost_usd)
        self.ledger.write(rec)
        self._release(rec, owner)
        log.info(
            "batch_collected",
            batch_id=rec.batch_id,
            status=info.provider_status,
            succeeded=rec.succeeded,
            failed=rec.failed,
        )
        return True

    def _collect(self, rec: BatchRecord, got: dict[str, PartOutcome]) -> None:
        """Keep every answered part (cached once its request is whole) and count what the batch did."""
        s = self.settings[rec.provider]
        skip = set(rec.held_parts)
        succeeded = failed = answered = billed = 0
        rec.input_tokens = rec.output_tokens = 0  # counted afresh from the results (a collect may be repeated)
        rec.cost_usd = rec.online_cost_usd = 0.0
        rec.online_requests = 0
        for key in rec.keys:
            unit = self.specs[key]
            fresh: dict[str, ProviderResponse] = {}
            reason = ""
            for part in parts(s, unit.request, skip):
                value = got.get(part.custom_id, "missing")
                if isinstance(value, str):
                    failed += 1
                    reason = value
                    continue
                fresh[part.custom_id] = value
                billed += 1
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
                reason = "the answer failed its check"
            if not self._cached(key) and self.rounds.get(key, 0) >= self.opt.max_rounds:
                self._give_up(rec, key, reason or "missing")
        rec.succeeded, rec.failed, rec.billed = succeeded, failed, billed
        rec.state = "collected"
        rec.collected_at = now_s()
        self.totals.requests_answered += answered
        self.totals.input_tokens += rec.input_tokens
        self.totals.output_tokens += rec.output_tokens
        self.totals.cost_usd += rec.cost_usd

    def _give_up(self, rec: BatchRecord, key: str, reason: str) -> None:
        """A request that failed ``max_rounds`` batches: online only where the config says so (and the
        record says it went), else it stops the stage at the end."""
        if self.settings[rec.provider].batch_fallback == "online":
            rec.fallback = "online"
            rec.online_requests += 1
            self.totals.online_fallback += 1
            log.warning("batch_request_online", batch_key=rec.batch_key, key=key, reason=reason)
        else:
            self.exhausted[key] = reason

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
        done = [k for k in rec.keys if k not in keep]
        self.leases.release(owner, done, packs={k: self.cache.pack_of(k) for k in done if k in self.answered})


def own_parts(raw: dict[str, PartOutcome], tag: str) -> dict[str, PartOutcome]:
    """A batch's results by part id, keeping only wire ids under the intent's tag (all of them for a record
    written before tags)."""
    if not tag:
        return raw
    prefix = f"{tag}-"
    return {part_id(w): v for w, v in raw.items() if w.startswith(prefix)}


class BatchExecutor:
    """The stage's batch-mode units through provider batches, then its shards through the shards executor, which
    finds every answer a batch gave in the response cache (and calls online only what no batch may answer)."""

    name: ExecutorName = "batches"

    def __init__(self, *, ctx: StageContext, ledger: Ledger, worker_cfg: WorkerConfig, shards: StageExecutor) -> None:
        self.ctx = ctx
        self.ledger = ledger
        self.worker_cfg = worker_cfg
        self.shards = shards

    def execute(self, stage: Stage, plan: StagePlan, first_ids: list[str], *, queued: bool = False) -> ShardResults:
        if plan.units_total:
            # What the batches cost is in their records (status adds them up), not in the stage's counters.
            providers = stage_providers(self.worker_cfg.providers, self.ctx.cfg.stage_mode(stage.name))
            with pipeline_code(self.ctx.cfg.run.pipeline, stage, "plan"):
                self.run_batches(stage.name, stage.plan(self.ctx), providers)
        return self.shards.execute(stage, plan, first_ids, queued=queued)

    def run_batches(self, stage: str, units: Iterable[UnitSpec], settings: dict[str, ProviderSettings]) -> BatchTotals:
        """Run a stage's batch-mode units through batches. Each batch is priced and held in the run's cap
        (``max_cost_usd``) before it is created; its leases last the run's ``lease_ms``."""
        clients = {name: make_batch_provider(name, s) for name, s in settings.items() if s.mode == "batch"}
        try:
            runner = BatchRunner(
                ledger=BatchLedger(self.ledger.r, self.ctx.store, self.ctx.run_id, namespace=self.ledger.ns),
                cache=ResponseCache(self.ctx.store),
                settings=settings,
                clients=clients,
                stage=stage,
                options=BatchOptions(lease_ms=self.worker_cfg.lease_ms),
                max_cost_usd=self.worker_cfg.max_cost_usd,
            )
            return runner.run(units)
        finally:
            for c in clients.values():
                c.close()

    def close(self) -> None:
        self.shards.close()
