"""Polling a submitted batch and collecting its results into the response cache (parts held until their request
is whole), with what the batch cost and which requests it gave up on. It exists apart from submission: it
starts where a batch id is recorded.
"""

from __future__ import annotations

import structlog

from punchline.cluster.run.executors.batch_pricing import BatchPricing
from punchline.data.errors import FatalProviderError, LedgerUnavailable, ProviderError
from punchline.data.provider_settings import ProviderSettings
from punchline.data.requests import ProviderResponse
from punchline.schedulers.batches import BatchRecord, HeldParts, batch_owner, now_s
from punchline.workers.batch_provider import PartOutcome, part_id, parts

log = structlog.get_logger("punchline.batches")  # one logger for the batches executor, whatever module logs


class BatchCollection(BatchPricing):
    """From a recorded batch id to cached answers and a collected record."""

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
            self.batches.write(rec)
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
                self.batches.write(rec)
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
        self.batches.write(rec)
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
                        self.batches.drop_parts(key)
                elif fresh:
                    self.held[key] = have
                    self.batches.write_parts(HeldParts(key=key, parts=have))
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
