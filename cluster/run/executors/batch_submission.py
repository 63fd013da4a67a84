"""Submitting a batch exactly once: the intent, the create call, recording the id, and reconciling an intent a
killed driver left with the provider's listing (a batch is adopted only when it is provably the intent's).
"""

from __future__ import annotations

import time

import structlog

from punchline.cluster.run.executors.batch_pricing import BatchPricing
from punchline.data.errors import FatalProviderError, ProviderError
from punchline.schedulers.batches import BatchRecord, batch_owner, new_tag, not_ours_command, now_s, run_owners
from punchline.workers.batch_provider import BatchInfo, wire_ids

log = structlog.get_logger("punchline.batches")  # one logger for the batches executor, whatever module logs


class BatchSubmission(BatchPricing):
    """From a group of keys to a recorded batch id (or a recorded reason why there is none)."""

    def _intent(self, provider: str, model: str, keys: list[str]) -> BatchRecord | None:
        # a partly answered request's lease stayed with this run's earlier batch: this one adopts it
        adopt = run_owners(self.batches.run_id)
        key = self.batches.new_key(keys)
        owner = batch_owner(self.batches.run_id, key)
        held = set(self.leases.take(owner, keys, adopt=adopt))
        if len(held) < len(keys):  # some are someone else's right now: they wait for the cache
            self.leases.release(owner, list(held))
            keys = [k for k in keys if k in held]
            if not keys:
                return None
            key = self.batches.new_key(keys)
            owner = batch_owner(self.batches.run_id, key)
            if set(self.leases.take(owner, keys, adopt=adopt)) != set(keys):
                self.leases.release(owner, keys)
                return None
        rec = BatchRecord(
            batch_key=key,
            run_id=self.batches.run_id,
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
        self.batches.write(rec)
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
        if found != "unresolved" and rec.look_alikes:
            self._wait_over(rec, found)
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
        self.batches.write(rec)
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
        self.batches.write(rec)  # the id reaches the store before anything else happens
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
        known = {r.batch_id for r in self.batches.records() if r.batch_id}
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
        ruled_out = known | self.foreign | set(rec.predates) | self.batches.declared_foreign()
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
        self._waiting(rec, {b.batch_id: b.created_at for b in candidates if b.batch_id in still_open})
        return "unresolved"

    def _waiting(self, rec: BatchRecord, look_alikes: dict[str, float]) -> None:
        """Say (in the record, so ``status`` shows it, and in the log, which the progress line reads) which open
        batches the intent waits on, how old they are, and the command that ends the wait; once per change."""
        status = f"checking {', '.join(sorted(look_alikes))}"
        if rec.provider_status == status and rec.look_alikes == look_alikes:
            return
        rec.provider_status = status
        rec.look_alikes = look_alikes
        self.batches.write(rec)
        self.waiting_since.setdefault(rec.batch_key, time.monotonic())
        oldest = min(look_alikes, key=lambda b: look_alikes[b])
        log.warning(
            "batch_unresolved",
            stage=self.stage,
            batch_key=rec.batch_key,
            requests=rec.requests,
            batch_id=oldest,
            candidates=sorted(look_alikes),
            age_s=max(0, round(now_s() - look_alikes[oldest])),  # (a provider clock ahead of ours: 0)
            release=not_ours_command(rec.run_id, oldest),
            reason="an open batch with this intent's request count, created during its cut-off create call: "
            "nothing is created until its results tell whether it is this run's; if it is not (what only the "
            "account's user knows), the release command ends the wait within seconds",
        )

    def _wait_over(self, rec: BatchRecord, found: str) -> None:
        """The intent no longer waits on a look-alike: adopted (it was its own), or every one it waited on ended
        as someone else's or was declared not its own (``--not-ours``); said in the log and the record."""
        declared = sorted(set(rec.look_alikes) & self.batches.declared_foreign())
        waited_s = time.monotonic() - self.waiting_since.pop(rec.batch_key, time.monotonic())
        rec.look_alikes = {}
        if rec.provider_status.startswith("checking "):
            rec.provider_status = ""
        self.batches.write(rec)
        log.info(
            "batch_wait_over",
            stage=self.stage,
            batch_key=rec.batch_key,
            outcome=found,
            declared_not_ours=declared,
            waited_s=round(waited_s, 1),
        )

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

    def _cancel(self, rec: BatchRecord) -> None:
        try:
            info = self.clients[rec.provider].cancel(rec.batch_id)
            rec.provider_status = info.provider_status
        except ProviderError as exc:  # ended meanwhile, or unreachable: the poll tells
            log.warning("batch_cancel_failed", batch_id=rec.batch_id, error=str(exc))
        rec.cancelled_at = rec.cancelled_at or self.cancelled_at
        self.batches.write(rec)
