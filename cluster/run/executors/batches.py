"""The batches executor: a stage's units through provider batches (``mode = "batch"``): half price, exactly-once
submission.

It runs in the driver (which waits anyway) before the stage's shards are worked by the shards executor
(:class:`BatchExecutor`): it groups the stage's uncached units of batch-mode providers into batches
(``batch_max_requests`` / ``batch_max_bytes``), submits them through the exactly-once batch records
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
from collections.abc import Iterable

import structlog

from punchline.cluster.pipeline import Stage, StageContext, pipeline_code
from punchline.cluster.run.executor import ExecutorName, StageExecutor, stage_providers
from punchline.cluster.run.executors.batch_collection import BatchCollection
from punchline.cluster.run.executors.batch_state import BatchesCancelled, BatchFailed, BatchOptions, BatchTotals
from punchline.cluster.run.executors.batch_submission import BatchSubmission
from punchline.data.errors import BudgetExceeded
from punchline.data.provider_settings import ProviderSettings
from punchline.data.storage.response_cache import ResponseCache
from punchline.data.units import ShardResults, StagePlan, UnitSpec
from punchline.schedulers.batches import BatchRecord, BatchRecords, HeldLeases, now_s
from punchline.schedulers.ledger import Ledger
from punchline.workers.providers import make_batch_provider
from punchline.workers.shard_worker import WorkerConfig

__all__ = ["BatchExecutor", "BatchFailed", "BatchOptions", "BatchRunner", "BatchTotals", "BatchesCancelled"]

log = structlog.get_logger("punchline.batches")  # one logger for the batches executor, whatever module logs


class BatchRunner(BatchSubmission, BatchCollection):
    """A stage's batch-mode units through batches: the loop over intents, creates and polls, and how it ends
    (the steps are in :mod:`~punchline.cluster.run.executors.batch_submission` and
    :mod:`~punchline.cluster.run.executors.batch_collection`)."""

    # --- the loop ------------------------------------------------------------------------------------

    def run(self, units: Iterable[UnitSpec]) -> BatchTotals:
        self.leases = HeldLeases(self.batches, self.opt.lease_ms)
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
        for rec in self.batches.records(self.stage):  # resume: every unfinished batch first
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
            self._pause(delay, active)
        self._finish()
        return self.totals

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
            by_model: dict[tuple[str, str], list[str]] = {}
            for k in left:
                request = self.specs[k].request
                by_model.setdefault((request.provider, request.model), []).append(k)
            counts = ", ".join(
                f"{len(keys)} to {provider}/{model} (last: {self.exhausted[keys[0]]})"
                for (provider, model), keys in sorted(by_model.items())
            )
            tables = " and ".join(f"[providers.{p}]" for p in sorted({p for p, _ in by_model}))
            raise BatchFailed(
                f"stage {self.stage}: {len(left)} requests failed in {self.opt.max_rounds} batches each: {counts}; "
                "they were not sent online (resume to try them in batches again, or set "
                f'batch_fallback = "online" in {tables} to pay the online price)'
            )

    def _pause(self, delay_s: float, active: list[BatchRecord]) -> None:
        """Wait ``delay_s`` until the next look. While an intent waits on a look-alike, in steps of
        ``not_ours_poll_s``, each reading the store's not-ours record (one small read; a look lists the account):
        a ``punchline batches RUN --not-ours ID`` naming one of them ends the pause, so the intent is looked at
        again within seconds, not after a poll backed off to ``poll_max_s``."""
        waited_on = {b for r in active if r.state == "intent" for b in r.look_alikes}
        left = delay_s
        while True:
            step = min(left, self.opt.not_ours_poll_s) if waited_on else left
            self.sleep(step)
            left -= step
            if left <= 1e-9 or waited_on & self.batches.declared_foreign():
                return

    # --- cancels -------------------------------------------------------------------------------------

    def _check_cancel(self, active: list[BatchRecord]) -> None:
        """A cancel recorded after this runner started: cancel what is open (the command may have missed a
        batch created meanwhile; every one here is provably ours) and send nothing more."""
        at = self.batches.cancel_requested()
        if at < self.started_at or at <= self.cancelled_at:
            return
        self.cancelled_at = at
        log.warning("batches_cancelled", stage=self.stage, open=len(active))
        for rec in active:
            if rec.batch_id:
                self._cancel(rec)

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
                batches=BatchRecords(self.ledger.r, self.ctx.store, self.ctx.run_id, namespace=self.ledger.ns),
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
