"""The worker's logic: it pulls shards from the ledger's queue until none is left (the Ray actor around it is
:mod:`~punchline.workers.shard_actor`; what it is given and reports, :mod:`~punchline.workers.worker_config`).

Workers are interchangeable and stateless beyond their connections; the coordinator starts them on every
node, replaces the dead ones, and adds more when nodes join. A shard is processed only under its lease
and committed with its fencing token, so a worker killed at any instant leaves nothing half-done: its
shard becomes claimable again once the lease expires.

There is no barrier between shards: a worker keeps ``max_in_flight`` units running and claims the next
shard as soon as a slot frees up, so the provider never idles while a shard's slowest unit finishes, its
file is written and its commit goes out. One heartbeat per worker renews every lease it holds (shards and
requests) in one round trip.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec
import structlog

from punchline.data.background import stop_tasks
from punchline.data.backoff import retry_async
from punchline.data.errors import BudgetExceeded, LedgerUnavailable, PunchlineError, StoreError
from punchline.data.provider_settings import ProviderSettings
from punchline.data.requests import ProviderRequest, ProviderResponse
from punchline.data.storage.response_cache import ResponseCache
from punchline.data.storage.response_spool import ResponseSpool
from punchline.data.store import Store
from punchline.data.stores import open_store
from punchline.data.units import (
    ShardOutput,
    ShardUsage,
    StagePlan,
    UnitResult,
    UnitSpec,
    shard_key,
)
from punchline.schedulers.budget import estimate_request_cost, usage_field
from punchline.schedulers.claims import LEDGER_PAUSE, ClaimEnd, claim_shards
from punchline.schedulers.inflight import RunWideSlots
from punchline.schedulers.keys import NAMESPACE, StageKeys
from punchline.schedulers.leases import BudgetTerms, Claim, Leases
from punchline.schedulers.rate_limit import RateLimitSettings, RedisRateLimiter
from punchline.schedulers.server.redis_client import connect, connect_async, resolve_url
from punchline.workers.calls.call_stats import CallStats
from punchline.workers.calls.retry import AttemptEvent, RetryPolicy, call_with_retries
from punchline.workers.driver_watch import DriverGone, DriverWatch
from punchline.workers.group_commit import GroupCommit
from punchline.workers.held_leases import HeldLeases, LeaseLost
from punchline.workers.plan_pages import PlanPages
from punchline.workers.provider import Provider
from punchline.workers.providers import make_provider, wire_calls
from punchline.workers.unit_runner import LEDGER_WAIT_S, CallFn, Slot, UnitRunner
from punchline.workers.worker_config import (
    WorkerConfig,
    WorkerReport,
    answers_waiting,
    drain_bound_s,
    lease_ahead,
)

__all__ = [
    "ShardProcessor",
    "WorkerConfig",
    "WorkerReport",
    "answers_waiting",
    "build_processor",
    "drain_bound_s",
    "lease_ahead",
]

ONCE = RetryPolicy(max_retries=0, max_malformed_retries=0)  # a unit that asks for no retries (UnitSpec.retries)
SHARD_COMMIT_ATTEMPTS = 60  # a shard's commit waits out an outage this many LEDGER_PAUSEs, then its lease lapses


_encoder = msgspec.msgpack.Encoder()
_Held = HeldLeases  # the name the worker's tests know it by


class ShardProcessor:
    """The worker's logic without Ray, so it can be tested and reused in-process."""

    def __init__(
        self,
        cfg: WorkerConfig,
        worker_id: str,
        *,
        leases: Leases,
        store: Store,
        providers: dict[str, Provider],
        limiter: Any = None,
        namespace: str = NAMESPACE,
    ) -> None:
        self.cfg = cfg
        self.worker_id = worker_id
        self.leases = leases
        self.store = store
        self.cache = ResponseCache(store)
        self.providers = providers
        self.limiter = limiter
        self.ns = namespace
        self.log = structlog.get_logger("punchline.worker").bind(run_id=cfg.run_id, worker=worker_id)
        self.pages = PlanPages(store)
        self.held = HeldLeases()
        self._executor_set = False
        self.spool = ResponseSpool(cfg.spool_dir) if cfg.spool_dir else None
        self.driver = DriverWatch(leases.r, cfg.run_id, cfg.driver_claim)
        self.ledger_wait_s = LEDGER_WAIT_S  # how long an unreachable ledger is waited for (claims and units)
        self.drain_s = drain_bound_s(cfg.providers)
        # the providers' max_concurrency, run-wide: a place under it is taken right before each call
        self.run_wide = RunWideSlots(leases.r, cfg.providers, owner=worker_id, ttl_ms=cfg.lease_ms, namespace=namespace)
        self.stats = CallStats()  # calls in flight and 429s now, published for the driver's /metrics

    def _runner(self, stage: str = "") -> UnitRunner:
        """The unit runner of one stage: its provider calls counted under the stage's name."""
        limiter = self.limiter
        return UnitRunner(
            leases=self.leases,
            cache=self.cache,
            commits=GroupCommit(
                self.cache,
                self.leases,
                self.held,
                max_waiting=answers_waiting(self.cfg.window()),
                spool=self.spool,
                stopping=self.stopping,
            ),
            providers=self.providers,
            call=self._provider_call(stage),
            book=self.held,
            owner=self.worker_id,
            lease_ms=self.cfg.lease_ms,
            rate_scope=limiter.scope if limiter is not None else (lambda provider, model: None),
            offline=self.cfg.offline,
            estimate_usd=self._estimate_usd if self.cfg.max_cost_usd is not None else None,
            spool=self.spool,
            ledger_wait_s=self.ledger_wait_s,
            stopping=self.stopping,
        )

    def _estimate_usd(self, request: ProviderRequest) -> float:
        """The most a request may cost (what it holds in the run's budget before its call)."""
        settings = self.cfg.providers.get(request.provider)
        return 0.0 if settings is None else estimate_request_cost(settings, request, wire_calls(settings, request))[2]

    def _provider_call(self, stage: str) -> CallFn:
        """The unit runner's provider call: retried by the provider's policy (or once), counted in the shard's
        usage and in this worker's call stats (``/metrics``) under ``(stage, provider, model)``."""
        policies = {name: RetryPolicy.from_settings(p.settings) for name, p in self.providers.items()}
        limiter = self.limiter

        async def call(
            provider: Provider,
            request: Any,
            usage: ShardUsage,
            slot_reserved: bool,
            pause: Callable[[float], Awaitable[None]] | None = None,
            retries: bool = True,
        ) -> Any:
            http_calls = wire_calls(provider.settings, request)
            scope = (stage, provider.name, request.model)

            def on_attempt(event: AttemptEvent) -> None:
                """Every HTTP call is a provider request (an attempt of a split ``n`` makes ``n``);
                failed attempts are also retries. ``status`` shows both."""
                usage.provider_requests += http_calls
                if event.error is not None:
                    usage.provider_retries += 1
                    self.stats.retried(scope)
                if event.status == 429:
                    usage.throttled(request.model)
                    self.stats.throttled(scope)

            async def paused(delay_s: float) -> None:
                with self.stats.pausing(scope):  # a backoff has no call in flight
                    await (pause or asyncio.sleep)(delay_s)

            started = time.monotonic()
            with self.stats.calling(scope):
                answer = await call_with_retries(
                    provider,
                    request,
                    policies[provider.name] if retries else ONCE,
                    rate_limiter=limiter,
                    on_attempt=on_attempt,
                    slot_reserved=slot_reserved,
                    pause=paused,
                    stopping=self.stopping,
                )
            self.stats.answered(scope, time.monotonic() - started)
            return answer

        return call

    def stopping(self) -> bool:
        """The driver is gone (or the worker was told to stop): no new unit, no retry, no wait on the ledger."""
        return self.driver.gone or self.driver.process_gone()

    async def work(self, plan: StagePlan) -> WorkerReport:
        if not self._executor_set:  # store calls run in threads: asyncio's default pool (cpus + 4 threads)
            # would serialise a window of units behind a few blocking reads
            asyncio.get_running_loop().set_default_executor(
                ThreadPoolExecutor(max_workers=max(16, 2 * self.cfg.window()), thread_name_prefix="punchline-io")
            )
            self._executor_set = True
        if self.spool is not None and self.spool.pending():  # answers paid before the store went away
            committed = await asyncio.to_thread(self.spool.commit, self.cache)
            self.log.info("spooled_answers_committed", answers=committed)
        run = _StageRun(self, plan)
        return await run.go()


class _StageRun:
    """One ``work`` call: claim shards while there is room in the window, run their units, commit them."""

    def __init__(self, proc: ShardProcessor, plan: StagePlan) -> None:
        self.p = proc
        self.plan = plan
        self.keys = StageKeys(proc.ns, plan.run_id, plan.stage)
        self.report = WorkerReport(worker_id=proc.worker_id)
        self.runner = proc._runner(plan.stage)
        # the calls in flight stay within the configured bound; a few more units take their leases beside them
        self.calls = asyncio.Semaphore(proc.cfg.window())
        self.window = proc.cfg.window() + lease_ahead(proc.cfg.window())
        self.slots = asyncio.Semaphore(self.window)
        self.pending_units = 0  # units of held shards not finished yet
        self.room = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()
        self.stop = False
        self.failed: BaseException | None = None
        self.drain_until: float | None = None  # once the driver is gone: when the remaining units are cancelled
        self.log = proc.log.bind(stage=plan.stage)

    async def go(self) -> WorkerReport:
        self.p.driver.gone = False  # a paused driver that came back has taken its claim again
        if await self.p.driver.check():
            self.report.driver_gone = not self.p.driver.asked_to_stop()
            return self.report
        heartbeat = asyncio.create_task(self._heartbeat(), name="heartbeat")
        watch = asyncio.create_task(self.p.driver.watch(self._driver_gone), name="driver-watch")
        stats = asyncio.create_task(
            self.p.stats.publish_every(self.p.leases.r, self.p.ns, self.plan.run_id, self.p.worker_id),
            name="call-stats",
        )
        try:
            await self._claim_loop()
            await self._finish()
            await self.p.run_wide.flushed()  # the last places given back reach Redis before the work call ends
        finally:
            await stop_tasks((heartbeat, watch, stats))
        if self.failed is not None:
            raise self.failed
        return self.report

    async def _finish(self) -> None:
        """Wait for the held shards; once the driver is gone, for ``drain_s`` at most: then the units still
        running are cancelled (their leases lapse, the resume asks again), so the worker ends whatever the
        ledger or the provider does."""
        while self.tasks:
            if self.drain_until is None and self.p.stopping():
                self.drain_until = time.monotonic() + self.p.drain_s
            left_s = None if self.drain_until is None else self.drain_until - time.monotonic()
            if left_s is not None and left_s <= 0:
                self.log.error("drain_given_up", shards=len(self.tasks), drain_s=self.p.drain_s)
                for task in self.tasks:
                    task.cancel()
                await asyncio.wait(set(self.tasks), timeout=5.0)
                return
            await asyncio.wait(set(self.tasks), timeout=1.0 if left_s is None else min(left_s, 1.0))

    def _shard_ended(self, task: asyncio.Task[None]) -> None:
        """A shard that raised (the store down past its bound, the ledger unreachable past its) ends this work
        call with its error: the coordinator sees the worker fail instead of a worker that holds the shard's
        lease forever."""
        self.tasks.discard(task)
        error = None if task.cancelled() else task.exception()
        if isinstance(error, (StoreError, LedgerUnavailable)) and self.failed is None:
            self.failed = error
            self.stop = True
            self.room.set()

    def _driver_gone(self) -> None:
        """No new unit from now on: calls in flight finish, the rest wait for the next driver. A stop the driver
        asked for (its stage is over) is a normal end: logged as such, not as a gone driver."""
        if self.p.driver.asked_to_stop():
            self.log.info("worker_stop_asked", pending_units=self.pending_units)
        else:
            self.log.warning("driver_gone", pending_units=self.pending_units)
            self.report.driver_gone = True
        self.stop = True
        self.room.set()

    def _unit_done(self) -> None:
        self.pending_units -= 1
        self.room.set()

    async def wait_for_room(self, timeout_s: float | None = None) -> None:
        self.room.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.room.wait(), timeout_s)

    async def _claim_loop(self) -> None:
        """Claim shards while the window has room (the scheduler is ``schedulers/claims.py``); each claimed shard
        runs as a task of its own. How the claims ended goes into the report (or fails the work call)."""
        end, error = await claim_shards(
            self.p.leases,
            self.keys,
            self.p.worker_id,
            self.p.cfg.lease_ms,
            self,
            self._start_shard,
            ledger_wait_s=self.p.ledger_wait_s,
            stopping=self.p.stopping,
            log=self.log,
        )
        if end is ClaimEnd.LEDGER_LOST:
            if self.p.stopping():
                self.report.driver_gone = True
            elif not self.stop and self.failed is None:  # past its bound: the work call fails
                self.failed = error
            self.stop = True
        elif end is ClaimEnd.STAGE_RESET:  # Redis lost the stage: the coordinator rebuilds it from the store
            self.report.stage_reset = True
        # DRAINED: what we hold finishes in go(); STOPPED: told to stop

    # the window, as schedulers/claims.py asks about it
    def stopped(self) -> bool:
        return self.stop

    def full(self) -> bool:
        return self.pending_units >= self.window

    def busy(self) -> bool:
        return bool(self.tasks)

    async def _start_shard(self, claim: Claim) -> None:
        """A claimed shard: its units from the plan page, then a task that runs them (its lease is given back
        if the page cannot be read)."""
        self.p.held.shards[claim.shard] = claim
        try:
            units = await self.p.pages.shard(self.plan, claim.shard)
        except BaseException:
            self.p.held.close_shard(claim)
            self.p.held.drop_shard(claim)
            with contextlib.suppress(LedgerUnavailable):
                await self.p.leases.release_shard(self.keys, claim)
            raise
        self.pending_units += len(units)
        task = asyncio.create_task(self._shard(claim, units))
        self.tasks.add(task)
        task.add_done_callback(self._shard_ended)

    async def _unit(self, unit: UnitSpec, usage: ShardUsage, cached: ProviderResponse | None) -> UnitResult:
        """A unit counts against the window until its call is done (not until its answer is committed:
        the group commit that follows needs no call slot)."""
        slot = Slot(self.slots, self._unit_done, calls=self.calls, run_wide=self.p.run_wide)
        try:
            if cached is None:
                await slot.take()
                # the pid too (one syscall): no unit starts in the watch's 0.2 s after a kill -9 on this machine
                if self.p.driver.gone or self.p.driver.process_gone():
                    raise DriverGone(f"the driver of run {self.plan.run_id} is gone")
        except BaseException:
            slot.free()
            raise
        return await self.runner.run(unit, usage, cached, slot=slot)

    def _lookup(self, units: list[UnitSpec]) -> list[ProviderResponse | None]:
        """The cached answers of a shard's units, in one thread hop for the whole shard."""
        out: list[ProviderResponse | None] = []
        for u in units:
            hit = self.p.cache.get(u.request.key())
            out.append(hit.response if hit else None)
        return out

    async def _shard(self, claim: Claim, units: list[UnitSpec]) -> None:
        key = shard_key(self.plan.run_id, self.plan.stage, claim.shard)
        started = time.monotonic()
        usage = ShardUsage()
        finished = 0
        try:
            if await asyncio.to_thread(self.p.store.exists, key):
                cached: list[ProviderResponse | None] = []
            else:
                cached = await asyncio.to_thread(self._lookup, units)
            if cached:
                outcomes = await asyncio.gather(
                    *(self._unit(u, usage, c) for u, c in zip(units, cached, strict=True)), return_exceptions=True
                )
                finished = len(units)
                stopped = self._unwritten(claim, outcomes)
                if stopped is not None:  # the shard goes back: its paid answers are in the cache already
                    if isinstance(stopped, BudgetExceeded):
                        self.log.warning("budget_exhausted", error=str(stopped))
                        self.report.budget_exhausted = True
                    else:
                        self.log.info("shard_unwritten", shard=claim.shard, reason=str(stopped))
                    if isinstance(stopped, LeaseLost):  # the worker goes on: only this shard is someone else's
                        self.report.shards_lost += 1
                    else:
                        self.stop = True
                    self.p.held.close_shard(claim)
                    with contextlib.suppress(LedgerUnavailable):
                        await self.p.leases.release_shard(self.keys, claim)
                    return
                for outcome in outcomes:
                    if isinstance(outcome, BaseException):
                        raise outcome
                results = [o for o in outcomes if isinstance(o, UnitResult)]
                output = ShardOutput(stage=self.plan.stage, shard=claim.shard, results=results, usage=usage)
                await asyncio.to_thread(self.p.store.put, key, _encoder.encode(output), if_absent=True)
                failures = {r.unit_id: str(r.error)[:500] for r in results if r.error is not None}
                if failures:
                    with contextlib.suppress(LedgerUnavailable):
                        await self.p.leases.record_failures(self.keys, failures)
            self.p.held.close_shard(claim)
            committed = await self._commit(claim, usage)
        finally:
            for _ in range(len(units) - finished):
                self._unit_done()
            self.p.held.drop_shard(claim)
        if committed:
            self.report.shards_committed += 1
        else:
            self.report.shards_lost += 1
        self.log.info(
            "shard_done", shard=claim.shard, committed=committed, elapsed_s=round(time.monotonic() - started, 3)
        )

    def _unwritten(self, claim: Claim, outcomes: list[UnitResult | BaseException]) -> PunchlineError | None:
        """Why the shard must go back unwritten (no shard file, no failure recorded), or None: the cap stopped a
        unit, or what ran under it may be only what the end of its lease or driver did to it. A worker whose
        driver is gone retries nothing and whose lease is lost is no longer the one to answer: a failure it saw
        would be recorded in place of the answer the next holder gets (a plain resume then calls nothing for
        it, as the shard file exists). Its paid answers are in the response cache: the next claim is free."""
        for kind in (BudgetExceeded, DriverGone, LeaseLost):  # what stops the worker first: the cap, its driver
            stopped = next((o for o in outcomes if isinstance(o, kind)), None)
            if stopped is not None:
                return stopped
        if self.p.stopping():
            return DriverGone(f"the driver is gone: shard {claim.shard} is left to the next driver")
        if self.p.held.shard_lost(claim):
            return LeaseLost(f"shard {claim.shard}'s lease was lost while its units ran")
        return None

    async def _commit(self, claim: Claim, usage: ShardUsage) -> bool:
        rows: dict[str, float] = {}
        for model, m in usage.models.items():
            rows[usage_field(self.plan.stage, model, "in")] = m.input_tokens
            rows[usage_field(self.plan.stage, model, "out")] = m.output_tokens
            rows[usage_field(self.plan.stage, model, "usd")] = m.cost_usd
        try:
            return await retry_async(
                lambda: self.p.leases.commit_shard(self.keys, claim, counters=usage.counters(), usage=rows),
                retry_on=(LedgerUnavailable,),
                backoff=LEDGER_PAUSE,
                attempts=SHARD_COMMIT_ATTEMPTS,
                # the shard's file is in the store: once the driver is gone the next driver finds it there
                when=lambda _exc: not self.p.stopping(),
            )
        except LedgerUnavailable:
            return False

    async def _heartbeat(self) -> None:
        """Renew every lease this worker holds, in one round trip; it must never die quietly, or the
        leases would lapse under running calls and others would pay for them again."""
        period_s = self.p.cfg.lease_ms / 4000
        while True:
            await asyncio.sleep(period_s)
            requests = list(self.p.held.requests.values())
            shards = list(self.p.held.shards.values())
            try:
                lost_requests, lost_shards = await self.p.leases.renew(
                    self.p.cfg.lease_ms, requests=requests, shards={self.keys: shards}
                )
            except LedgerUnavailable:
                continue
            except Exception as exc:  # a bug here must not stop the heartbeat
                self.log.error("heartbeat_failed", error=f"{type(exc).__name__}: {exc}")
                continue
            lost_requests, lost_shards = self.p.held.really_lost(lost_requests, lost_shards)
            self.p.held.lose(lost_requests, lost_shards)  # what ran under them is not recorded
            try:  # the run-wide places of the calls in flight (they lapse after lease_ms without it)
                lost_places = await self.p.run_wide.renew()
            except LedgerUnavailable:
                lost_places = 0
            except Exception as exc:  # a bug here must not stop the heartbeat either
                self.log.error("heartbeat_failed", error=f"{type(exc).__name__}: {exc}")
                lost_places = 0
            if lost_places:
                self.log.warning("inflight_places_lost", places=lost_places)
            for g in lost_requests:
                self.log.warning("lease_lost", key=g.key)
            for c in lost_shards:
                self.log.warning("shard_lease_lost", shard=c.shard)


def build_processor(
    cfg: WorkerConfig, worker_id: str, *, make: Callable[[str, ProviderSettings], Provider] = make_provider
) -> ShardProcessor:
    """``make``: how each provider is built (the driver's own worker builds them at their first call)."""
    providers = {name: make(name, s) for name, s in cfg.providers.items()}
    url = resolve_url(cfg.redis_url, cfg.redis_password_file)
    budget = BudgetTerms(run_id=cfg.run_id, cap_usd=cfg.max_cost_usd, holder=uuid.uuid4().hex)
    limiter = RedisRateLimiter(connect(url), cfg.providers, RateLimitSettings.from_env())
    return ShardProcessor(
        cfg,
        worker_id,
        leases=Leases(connect_async(url), budget=budget),
        store=open_store(cfg.store_url),
        providers=providers,
        limiter=limiter,
    )
