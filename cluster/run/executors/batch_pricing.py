"""A batch's price in the run's cost cap: priced at the intent, held before it is created, settled when it is
collected (or refused). It exists apart from submission and collection because both of them settle a batch.
"""

from __future__ import annotations

import structlog

from punchline.cluster.run.executors.batch_state import BatchRunnerState
from punchline.schedulers.batches import BatchRecord, batch_owner, now_s
from punchline.schedulers.budget import Budget, estimate_request_cost
from punchline.workers.batch_provider import parts
from punchline.workers.providers import wire_calls

log = structlog.get_logger("punchline.batches")  # one logger for the batches executor, whatever module logs
# a batch's hold on the run's budget outlives the provider's longest batch (24 h) with a margin: it is
# settled when the batch is collected, and a resumed driver holds the same batch again (never twice)
BATCH_HOLD_S = 26 * 3600.0


class BatchPricing(BatchRunnerState):
    """Pricing, the run's budget as a batch holds it, and the refusals that settle a batch at nothing."""

    def _price(self, rec: BatchRecord) -> float:
        """The most the batch may cost at the batch price: each request's upper bound (``estimate_request_cost``:
        input every UTF-8 byte a token plus the chat template's, output ``max_tokens`` per choice), for the parts
        it asks for (the held ones are not submitted again)."""
        s = self.settings[rec.provider]
        total = 0.0
        for k in rec.keys:
            request = self.specs[k].request
            asked, whole = len(self._todo(k)), len(parts(s, request))
            usd = estimate_request_cost(s, request, wire_calls(s, request))[2]
            total += usd * s.batch_price_factor * (asked / whole if whole else 1.0)
        return total

    def _budget(self, rec: BatchRecord) -> Budget | None:
        """The run's budget as this batch holds it (None: no cap)."""
        if self.max_cost_usd is None:
            return None
        holder = batch_owner(rec.run_id, rec.batch_key)
        return Budget(self.batches.r, rec.run_id, self.max_cost_usd, holder=holder, reservation_ttl_s=BATCH_HOLD_S)

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
        self.batches.write(rec)
        self.leases.release(batch_owner(rec.run_id, rec.batch_key), rec.keys)
        self.over_budget.append(rec)
        log.warning("batch_over_budget", stage=self.stage, batch_key=rec.batch_key, error=rec.error)

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
        self.batches.write(rec)
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
