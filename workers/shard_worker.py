"""The Ray actor that does the work: it pulls shards from the ledger's queue until none is left.

Workers are interchangeable and stateless beyond their connections; the coordinator starts them
on every node, replaces the dead ones, and adds more when nodes join. A shard is processed only
under its lease (renewed by a heartbeat) and committed with its fencing token, so a worker that is
killed at any instant leaves nothing half-done: its shard becomes claimable again once the lease
expires.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec
import structlog

from punchline.data.errors import BudgetExceeded, LedgerUnavailable
from punchline.data.provider_settings import ProviderSettings
from punchline.data.response_cache import ResponseCache
from punchline.data.store import Store
from punchline.data.stores import open_store
from punchline.data.units import ShardOutput, StagePlan, UnitResult
from punchline.schedulers.ledger import Claim, Ledger
from punchline.workers.provider import Provider
from punchline.workers.unit_runner import UnitRunner


class WorkerConfig(msgspec.Struct, kw_only=True):
    """Everything a worker needs, serialisable so it crosses to any node."""

    run_id: str
    redis_url: str
    store_url: str
    providers: dict[str, ProviderSettings]
    lease_ms: int = 30_000
    offline: bool = False
    max_cost_usd: float | None = None
    log_path: str | None = None
    shards_in_flight: int = 1
    # redis_url shows its password as ***: the worker reads it from this 0600 file, else from its own
    # PUNCHLINE_REDIS_URL (credentials never travel in actor arguments)
    redis_password_file: str | None = None


class WorkerReport(msgspec.Struct, kw_only=True):
    worker_id: str
    shards_committed: int = 0
    shards_lost: int = 0
    budget_exhausted: bool = False
    stage_reset: bool = False


def shard_key(run_id: str, stage: str, shard: int) -> str:
    return f"{run_id}/stages/{stage}/shards/{shard:06d}.msgpack"


_encoder = msgspec.msgpack.Encoder()


class ShardProcessor:
    """The worker's logic without Ray, so it can be tested and reused in-process."""

    def __init__(
        self, cfg: WorkerConfig, worker_id: str, *, ledger: Ledger, store: Store, providers: dict[str, Provider]
    ) -> None:
        self.cfg = cfg
        self.worker_id = worker_id
        self.ledger = ledger
        self.store = store
        self.cache = ResponseCache(store)
        self.providers = providers
        self.log = structlog.get_logger("punchline.worker").bind(run_id=cfg.run_id, worker=worker_id)
        self.io_threads = 64
        self._executor_set = False

    def _runner(self, stage: str) -> UnitRunner:
        from punchline.schedulers.budget import make_budget
        from punchline.schedulers.rate_limit import RateLimitSettings, RedisRateLimiter
        from punchline.workers.providers import wire_calls
        from punchline.workers.retry import AttemptEvent, RetryPolicy, call_with_retries

        policies = {name: RetryPolicy.from_settings(p.settings) for name, p in self.providers.items()}
        limiter = RedisRateLimiter(self.ledger.r, self.cfg.providers, RateLimitSettings.from_env())
        run_id = self.cfg.run_id

        def counter(http_calls: int) -> Any:
            def on_attempt(event: AttemptEvent) -> None:
                """Every HTTP call is a provider request (an attempt of a split ``n`` makes ``n``);
                failed attempts are also retries. ``status`` shows both."""
                extra = {"provider_retries": 1} if event.error is not None else {}
                with contextlib.suppress(LedgerUnavailable):
                    self.ledger.count(run_id, stage, provider_requests=http_calls, **extra)

            return on_attempt

        async def call(provider: Provider, request: Any) -> Any:
            on_attempt = counter(wire_calls(provider.settings, request))
            return await call_with_retries(
                provider, request, policies[provider.name], rate_limiter=limiter, on_attempt=on_attempt
            )

        budget, estimate = make_budget(self.ledger.r, self.cfg.run_id, self.cfg.max_cost_usd, self.cfg.providers)
        return UnitRunner(
            ledger=self.ledger,
            cache=self.cache,
            providers=self.providers,
            call=call,
            owner=self.worker_id,
            lease_ms=self.cfg.lease_ms,
            run_id=self.cfg.run_id,
            stage=stage,
            offline=self.cfg.offline,
            budget=budget,
            estimate_usd=estimate,
        )

    async def work(self, stage: str, plan: StagePlan) -> WorkerReport:
        if not self._executor_set:  # every Redis and store call runs in a thread: asyncio's default pool
            # (cpus + 4 threads) would serialise a shard's units behind a few blocking calls
            asyncio.get_running_loop().set_default_executor(
                ThreadPoolExecutor(max_workers=self.io_threads, thread_name_prefix="punchline-io")
            )
            self._executor_set = True
        report = WorkerReport(worker_id=self.worker_id)
        runner = self._runner(stage)
        # several shards in flight per worker: a shard's units wait for its slowest one, and its commit
        # and the next claim are round trips; overlapping shards keeps the provider busy meanwhile
        await asyncio.gather(*(self._loop(stage, plan, runner, report) for _ in range(self.cfg.shards_in_flight)))
        return report

    async def _loop(self, stage: str, plan: StagePlan, runner: UnitRunner, report: WorkerReport) -> None:
        log = self.log.bind(stage=stage)
        while not report.budget_exhausted and not report.stage_reset:
            try:
                claim = await asyncio.to_thread(
                    self.ledger.claim_shard, self.cfg.run_id, stage, self.worker_id, self.cfg.lease_ms
                )
            except LedgerUnavailable as exc:
                log.warning("ledger_unavailable", error=str(exc))
                await asyncio.sleep(1.0)
                continue
            if claim == -1:
                return
            if claim == -2:  # Redis lost the stage (wiped): the coordinator rebuilds it from the store
                report.stage_reset = True
                return
            if isinstance(claim, int):
                await asyncio.sleep(min(claim, 1_000) / 1000)
                continue
            try:
                committed = await self._process(stage, plan, claim, runner)
            except BudgetExceeded as exc:
                log.warning("budget_exhausted", error=str(exc))
                with contextlib.suppress(LedgerUnavailable):
                    self.ledger.release_shard(claim)
                report.budget_exhausted = True
                return
            if committed:
                report.shards_committed += 1
            else:
                report.shards_lost += 1

    async def _process(self, stage: str, plan: StagePlan, claim: Claim, runner: UnitRunner) -> bool:
        log = self.log.bind(stage=stage, shard=claim.shard)
        key = shard_key(self.cfg.run_id, stage, claim.shard)
        started = time.monotonic()
        stop = asyncio.Event()
        heartbeat = asyncio.create_task(self._heartbeat(claim, stop))
        try:
            if not await asyncio.to_thread(self.store.exists, key):
                units = plan.shard(claim.shard)
                # let every unit finish (in-flight calls complete even when the budget stops the rest)
                outcomes = await asyncio.gather(*(runner.run(u) for u in units), return_exceptions=True)
                for outcome in outcomes:
                    if isinstance(outcome, BaseException):
                        raise outcome
                results: list[UnitResult] = [o for o in outcomes if isinstance(o, UnitResult)]
                output = ShardOutput(stage=stage, shard=claim.shard, results=results)
                await asyncio.to_thread(self.store.put, key, _encoder.encode(output), if_absent=True)
                ok = sum(1 for r in results if r.error is None)
                with contextlib.suppress(LedgerUnavailable):  # progress only; the shard file is the truth
                    await asyncio.to_thread(self.ledger.count, self.cfg.run_id, stage, units_done=ok)
        finally:
            stop.set()
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
        committed = False
        for _ in range(60):
            try:
                committed = await asyncio.to_thread(self.ledger.commit_shard, self.cfg.run_id, stage, claim)
                break
            except LedgerUnavailable:
                await asyncio.sleep(1.0)
        log.info("shard_done", committed=committed, elapsed_s=round(time.monotonic() - started, 3))
        return committed

    async def _heartbeat(self, claim: Claim, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.sleep(self.cfg.lease_ms / 3000)
            with contextlib.suppress(LedgerUnavailable):
                if not await asyncio.to_thread(self.ledger.renew_shard, claim.grant, self.cfg.lease_ms):
                    self.log.warning("shard_lease_lost", shard=claim.shard)
                    return


def build_processor(cfg: WorkerConfig, worker_id: str) -> ShardProcessor:
    from punchline.schedulers.redis_client import connect, resolve_url
    from punchline.workers.providers import make_provider

    providers = {name: make_provider(name, s) for name, s in cfg.providers.items()}
    ledger = Ledger(connect(resolve_url(cfg.redis_url, cfg.redis_password_file)))
    return ShardProcessor(cfg, worker_id, ledger=ledger, store=open_store(cfg.store_url), providers=providers)


class ShardWorker:
    """Ray actor wrapper (decorated in :func:`worker_actor_class`). One per slot on a node."""

    def __init__(self, cfg_bytes: bytes, worker_id: str) -> None:
        cfg = msgspec.msgpack.decode(cfg_bytes, type=WorkerConfig)
        if cfg.log_path:
            from punchline.workers.logs import configure_logging

            configure_logging(None, console=False, json_path=cfg.log_path)
        self.worker_id = f"{worker_id}@{socket.gethostname()}:{os.getpid()}"
        self.processor = build_processor(cfg, self.worker_id)

    async def work(self, stage: str, plan_bytes: bytes) -> bytes:
        plan = msgspec.msgpack.decode(plan_bytes, type=StagePlan)
        report = await self.processor.work(stage, plan)
        return msgspec.msgpack.encode(report)

    def ping(self) -> str:
        return self.worker_id


def worker_actor_class(max_concurrency: int = 64) -> Any:
    import ray

    options: dict[str, Any] = {"max_restarts": 0, "max_task_retries": 0, "max_concurrency": max_concurrency}
    return ray.remote(**options)(ShardWorker)
