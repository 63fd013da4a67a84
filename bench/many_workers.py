"""Benchmark: many workers on one ledger: the claim's latency and Redis's cost per unit at K = 2, 8, 32 workers.

    .venv/bin/python bench/many_workers.py [--workers 2,8,32] [--units 20000] [--shard-size 100] [--window 8]
                                           [--call-ms 0] [--rpm 0] [--repeat 1] [--probe-hz 5] [--nice 10]
                                           [--no-slowlog] [--json FILE]

Starts its own ``valkey-server`` (the binary the project ships: ``services/redis_binary.py``; no password, no
persistence), builds one stage's queue the way the coordinator does (``Ledger.init_stage``), then, for each K,
starts K plain worker processes (this script with ``--worker``) that drive the engine's own scheduler code, as
``workers/shard_worker.py`` does, without the rest of a run: the shard scheduler (``schedulers/claims.py``
``claim_shards``, the claim script), each unit's request lease taken in groups (``schedulers/lease_groups.py``;
plain ``SET NX`` commands, or the ``lease_take`` script with ``--rpm``), a "call" (``--call-ms``, no provider),
the answers committed in groups (``Leases.commit_many``: ``SET ... IFEQ``, or ``lease_settle`` with ``--rpm``),
the shard committed (``shard_commit``), a heartbeat renewing what the worker holds every ``lease_ms / 4``. All
workers start together (each waits on stdin once its imports and connection are done) and run until the queue is
drained.

Per K it prints:

* the claim's round trip (``Leases.claim``, one ``shard_claim`` script call) and the group take's round trip
  (``Leases.acquire_many``) as the worker's event loop saw them, p50/p99 (client side: on a machine with fewer
  cores than processes this includes the time the worker waited for a core);
* a probe's claim and lease take round trips, p50/p99: one more process, not niced (the workers run at ``--nice``
  10, so the server and the probe get a core first, as the ledger would on a machine of its own), asking
  ``--probe-hz`` times a second on the same queue (a shard it gets goes straight back), after a ``PING`` (what
  any round trip costs on this machine at that moment, the server doing nothing): the ledger's latency
  as a client sees it (network, the server's queue of others' commands, the script) without a worker's wait for
  a core; its few commands are in the per-unit figures;
* the same calls' execution time on the server, p50/p99, from ``SLOWLOG`` (every command logged:
  ``slowlog-log-slower-than 0``; the logging itself costs the server a little, the same at every K; ``--no-slowlog``
  leaves it off for clean CPU figures), per script by its SHA;
* Redis commands and microseconds per unit (``INFO commandstats``), its reads and writes per unit (``INFO stats``:
  how well the commands come batched) and the server process's CPU per unit (``INFO
  cpu``: user + sys, networking included), all reset before the K's run (``CONFIG RESETSTAT``; the CPU as a
  difference);
* the workers' own CPU per unit (after their start);
* claims per shard (a claim that found every remaining shard held asks again later), wall time, and the
  checks: request leases granted twice, answers committed twice, shards committed twice (each must be 0), and
  every shard and unit committed (the stage's counters).

Then the ratios K = max over K = min; ``--repeat`` runs every K that many times, interleaved, and prints medians
(the machine is shared: a busy spell then falls on every K alike). Issue 42 item 4: 32 workers' claim p50/p99
and Redis CPU per unit within 1.5x of 2 workers', with nothing paid twice.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import redis
import redis.asyncio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scratch_valkey import start_valkey  # noqa: E402  (the bench folder's own)

from punchline.schedulers.claims import claim_shards  # noqa: E402
from punchline.schedulers.keys import StageKeys  # noqa: E402
from punchline.schedulers.lease_groups import LeaseGroups  # noqa: E402
from punchline.schedulers.leases import (  # noqa: E402
    Answered,
    BudgetTerms,
    Claim,
    Grant,
    Leases,
    NoClaim,
    Settle,
    Take,
    Taken,
)
from punchline.schedulers.ledger import Ledger  # noqa: E402
from punchline.schedulers.rate_limit import Limits, RateLimitSettings, RateScope  # noqa: E402
from punchline.schedulers.server.ledger_access import engine_scripts  # noqa: E402

STAGE = "generate"
LEASE_MS = 30_000
LINGER_S = 0.25  # the group commit's linger (workers/group_commit.py)


def request_key(run_id: str, shard: int, i: int) -> str:
    """A unit's request key (a content hash in a run): distinct per unit and per run."""
    return hashlib.sha256(f"{run_id}/{shard}/{i}".encode()).hexdigest()


# --- a worker process -------------------------------------------------------------------------------------------


class TimedLeases(Leases):
    """The engine's lease client, with each claim's and each group take's round trip timed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.claim_ms: list[float] = []
        self.take_ms: list[float] = []
        self.claim_answers: Counter[str] = Counter()

    async def claim(self, keys: StageKeys, owner: str, lease_ms: int) -> Claim | NoClaim | int:
        started = time.perf_counter()
        got = await super().claim(keys, owner, lease_ms)
        self.claim_ms.append((time.perf_counter() - started) * 1000)
        self.claim_answers["shard" if isinstance(got, Claim) else "drained" if got is NoClaim.DRAINED else "wait"] += 1
        return got

    async def acquire_many(self, owner: str, lease_ms: int, takes: Any, *, rate: RateScope | None = None) -> Any:
        started = time.perf_counter()
        got = await super().acquire_many(owner, lease_ms, takes, rate=rate)
        self.take_ms.append((time.perf_counter() - started) * 1000)
        return got


class Worker:
    """One worker's loop, as ``workers/shard_worker.py`` runs it: a window of ``window`` units in flight, the
    claim loop filling it, each shard's units taking their leases in groups, answers committed in groups."""

    def __init__(self, leases: TimedLeases, keys: StageKeys, owner: str, args: argparse.Namespace) -> None:
        self.leases, self.keys, self.owner, self.args = leases, keys, owner, args
        self.takes = LeaseGroups(leases)
        self.rate = rate_scope(args.rpm)
        self.window = args.window
        self.pending_units = 0
        self.room = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()
        self.slots = asyncio.Semaphore(args.window)
        self.held_grants: dict[str, Grant] = {}
        self.held_claims: dict[int, Claim] = {}
        self.waiting: list[tuple[Settle, asyncio.Future[bool]]] = []
        self.full_flush = asyncio.Event()
        self.flusher: asyncio.Task[None] | None = None
        self.granted: list[str] = []
        self.committed: list[str] = []
        self.answered = 0  # takes answered by another's done marker
        self.held_by_other = 0
        self.shards_committed: list[int] = []
        self.shards_lost: list[int] = []
        self.commits_lost = 0

    # the window, as schedulers/claims.py asks about it
    def stopped(self) -> bool:
        return False

    def full(self) -> bool:
        return self.pending_units >= self.window

    def busy(self) -> bool:
        return bool(self.tasks)

    async def wait_for_room(self, timeout_s: float | None = None) -> None:
        self.room.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.room.wait(), timeout_s)

    async def on_claim(self, claim: Claim) -> None:
        self.held_claims[claim.shard] = claim
        self.pending_units += self.args.shard_size
        task = asyncio.create_task(self.shard(claim))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def shard(self, claim: Claim) -> None:
        oks = await asyncio.gather(*(self.unit(claim.shard, i) for i in range(self.args.shard_size)))
        self.held_claims.pop(claim.shard, None)
        done = sum(1 for ok in oks if ok)
        committed = await self.leases.commit_shard(
            self.keys, claim, counters={"units_done": done, "provider_requests": done}, usage={}
        )
        (self.shards_committed if committed else self.shards_lost).append(claim.shard)
        self.room.set()

    async def unit(self, shard: int, i: int) -> bool:
        key = request_key(self.keys.run_id, shard, i)
        async with self.slots:
            try:
                while True:
                    got: Taken = await self.takes.take(key, self.owner, LEASE_MS, rate=self.rate, tokens=1)
                    if isinstance(got, Grant):
                        break
                    if isinstance(got, Answered):  # another's answer: nothing paid here
                        self.answered += 1
                        return True
                    self.held_by_other += 1
                    await asyncio.sleep(min(getattr(got, "wait_ms", 100), 1_000) / 1000)
                self.granted.append(key)
                self.held_grants[key] = got
                if got.wait_s:
                    await asyncio.sleep(got.wait_s)
                await asyncio.sleep(self.args.call_ms / 1000)  # the call (no provider)
            finally:
                self.pending_units -= 1
                self.room.set()
        ok = await self.commit(Settle(got, self.rate, pack=f"{self.owner}-{shard}"))
        self.held_grants.pop(key, None)
        if ok:
            self.committed.append(key)
        else:
            self.commits_lost += 1
        return ok

    async def commit(self, settle: Settle) -> bool:
        """The group commit: answers wait up to ``LINGER_S`` (or until a window of them is in hand) and are
        committed in one ``commit_many``."""
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.waiting.append((settle, done))
        if len(self.waiting) >= self.window:
            self.full_flush.set()
        if self.flusher is None or self.flusher.done():
            self.flusher = asyncio.create_task(self.flush_loop())
        return await done

    async def flush_loop(self) -> None:
        while self.waiting:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.full_flush.wait(), LINGER_S)
            self.full_flush.clear()
            batch, self.waiting = self.waiting, []
            oks = await self.leases.commit_many([s for s, _ in batch])
            for (_, fut), ok in zip(batch, oks, strict=True):
                fut.set_result(ok)

    async def heartbeat(self) -> None:
        while True:
            await asyncio.sleep(LEASE_MS / 4000)
            await self.leases.renew(
                LEASE_MS, requests=list(self.held_grants.values()), shards={self.keys: list(self.held_claims.values())}
            )

    async def run(self) -> None:
        beat = asyncio.create_task(self.heartbeat())
        log = _Log()
        try:
            await claim_shards(
                self.leases, self.keys, self.owner, LEASE_MS, self, self.on_claim,
                ledger_wait_s=60.0, stopping=lambda: False, log=log,
            )  # fmt: skip
            while self.tasks:
                await asyncio.gather(*list(self.tasks))
        finally:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat


class _Log:
    def warning(self, event: str, **kw: Any) -> None:
        print(event, kw, file=sys.stderr)


def rate_scope(rpm: float) -> RateScope | None:
    if not rpm:
        return None
    return RateScope("punchline:rl", "sim", "m", Limits(requests_per_minute=rpm), RateLimitSettings())


async def worker_main(args: argparse.Namespace) -> dict[str, Any]:
    os.nice(args.nice)
    client = redis.asyncio.Redis.from_url(args.url)
    leases = TimedLeases(client, budget=BudgetTerms(run_id=args.run_id))
    keys = StageKeys(leases.ns, args.run_id, STAGE)
    worker = Worker(leases, keys, args.owner, args)
    await client.ping()
    await leases.acquire_many(args.owner, 1, [Take(f"warm-{args.owner}")])  # the connection pool and the token block
    leases.take_ms.clear()
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)  # every worker starts together
    started, cpu_started = time.perf_counter(), time.process_time()
    await worker.run()
    elapsed = time.perf_counter() - started
    await client.aclose()
    return {
        "owner": args.owner,
        "elapsed_s": elapsed,
        "claim_ms": leases.claim_ms,
        "take_ms": leases.take_ms,
        "claim_answers": dict(leases.claim_answers),
        "granted": worker.granted,
        "committed": worker.committed,
        "answered": worker.answered,
        "held_by_other": worker.held_by_other,
        "commits_lost": worker.commits_lost,
        "shards_committed": worker.shards_committed,
        "shards_lost": worker.shards_lost,
        "cpu_s": time.process_time() - cpu_started,
    }


async def probe_main(args: argparse.Namespace) -> dict[str, Any]:
    """A client that is never short of a core (not niced, idle between asks): every ``1 / probe_hz`` s one claim on
    the workers' queue (the shard, if it got one, goes straight back: ``shard_release``) and one request lease
    taken and committed. Its round trips are the ledger's latency as a client sees it (network, the server's
    queue of other clients' commands, the script), without the worker's own wait for a core."""
    client = redis.asyncio.Redis.from_url(args.url)
    leases = TimedLeases(client, budget=BudgetTerms(run_id=args.run_id))
    keys = StageKeys(leases.ns, args.run_id, STAGE)
    await client.ping()
    await leases.acquire_many("probe", 1, [Take("warm-probe")])
    leases.take_ms.clear()
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    n = 0
    ping_ms: list[float] = []
    while True:
        started = time.perf_counter()
        await client.ping()  # the round trip of a command that costs the server nothing: the machine's share
        ping_ms.append((time.perf_counter() - started) * 1000)
        got = await leases.claim(keys, "probe", LEASE_MS)
        if got is NoClaim.DRAINED:
            break
        if isinstance(got, Claim):
            await leases.release_shard(keys, got)
        n += 1
        [grant] = await leases.acquire_many("probe", LEASE_MS, [Take(request_key(args.run_id, -1, n))])
        if isinstance(grant, Grant):
            await leases.commit_many([Settle(grant, pack="probe")])
        await asyncio.sleep(1 / args.probe_hz)
    await client.aclose()
    return {
        "claim_ms": leases.claim_ms,
        "take_ms": leases.take_ms,
        "ping_ms": ping_ms,
        "claim_answers": dict(leases.claim_answers),
    }


# --- the benchmark ------------------------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def server_cpu_s(client: redis.Redis) -> float:
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def slowlog_by_name(client: redis.Redis) -> dict[str, list[float]]:
    """Every logged command's execution time (us), by command, each script by its name."""
    names = {hashlib.sha1(t.encode()).hexdigest(): n for n, t in engine_scripts().items()}
    out: dict[str, list[float]] = {}
    for entry in client.execute_command("SLOWLOG", "GET", "-1"):
        duration, argv = int(entry[2]), entry[3]
        cmd = argv[0].decode().lower()
        if cmd == "evalsha":
            cmd = names.get(argv[1].decode(), "evalsha ?")
        elif cmd == "set":
            cmd = "set ifeq" if b"IFEQ" in argv else "set nx"
        out.setdefault(cmd, []).append(float(duration))
    return out


def run_k(port: int, k: int, args: argparse.Namespace) -> dict[str, Any]:
    client = redis.Redis(port=port)
    run_id = f"many-{k}-{int(time.time())}"
    shards = args.units // args.shard_size
    Ledger(client).init_stage(
        run_id, STAGE, pending=range(shards), shards_total=shards, units_total=shards * args.shard_size, shards_done=0
    )
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", "--url", f"redis://127.0.0.1:{port}/0",
            "--run-id", run_id, "--shard-size", str(args.shard_size), "--window", str(args.window),
            "--call-ms", str(args.call_ms), "--rpm", str(args.rpm), "--nice", str(args.nice)]  # fmt: skip
    procs = [
        subprocess.Popen(
            [*argv, "--owner", f"w{i}"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )
        for i in range(k)
    ]
    if args.probe_hz:
        probe_argv = [*argv, "--probe", "--probe-hz", str(args.probe_hz), "--nice", "0"]
        procs.append(subprocess.Popen(probe_argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1))
    for p in procs:
        assert p.stdout is not None
        line = p.stdout.readline()
        if line.strip() != "ready":
            raise SystemExit(f"a worker did not start: {line!r}")
    # statistics from here: the queue is built and every worker connected
    client.config_resetstat()
    client.execute_command("SLOWLOG", "RESET")
    if args.slowlog:
        client.config_set("slowlog-max-len", 2_000_000)
        client.config_set("slowlog-log-slower-than", 0)
    cpu_before = server_cpu_s(client)
    started = time.monotonic()
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    reports = []
    for p in procs:
        out, _ = p.communicate(timeout=3_600)
        if p.returncode != 0:
            raise SystemExit(f"a worker failed (exit {p.returncode})")
        reports.append(json.loads(out))
    probe = reports.pop() if args.probe_hz else {"claim_ms": [], "take_ms": [], "ping_ms": [], "claim_answers": {}}
    wall_s = time.monotonic() - started
    client.config_set("slowlog-log-slower-than", -1)
    cpu_s = server_cpu_s(client) - cpu_before
    stats = client.info("commandstats")
    net = client.info("stats")  # reset with the rest: the server's reads and writes (each a syscall) since
    slow = slowlog_by_name(client) if args.slowlog else {}
    client.execute_command("SLOWLOG", "RESET")
    counters = Ledger(client).counters(run_id, STAGE)
    pending = Ledger(client).pending_shards(run_id, STAGE)
    client.close()

    units = shards * args.shard_size
    granted = Counter(key for r in reports for key in r["granted"])
    committed = Counter(key for r in reports for key in r["committed"])
    shard_commits = Counter(s for r in reports for s in r["shards_committed"])
    claim_ms = [ms for r in reports for ms in r["claim_ms"]]
    take_ms = [ms for r in reports for ms in r["take_ms"]]
    answers: Counter[str] = Counter()
    for r in reports:
        answers.update(r["claim_answers"])
    calls = sum(int(s["calls"]) for s in stats.values())
    usec = sum(int(s["usec"]) for s in stats.values())
    return {
        "k": k,
        "units": units,
        "wall_s": wall_s,
        "claim_p50_ms": pct(claim_ms, 0.5),
        "claim_p99_ms": pct(claim_ms, 0.99),
        "take_p50_ms": pct(take_ms, 0.5),
        "take_p99_ms": pct(take_ms, 0.99),
        "probe_claim_p50_ms": pct(probe["claim_ms"], 0.5),
        "probe_claim_p99_ms": pct(probe["claim_ms"], 0.99),
        "probe_take_p50_ms": pct(probe["take_ms"], 0.5),
        "probe_take_p99_ms": pct(probe["take_ms"], 0.99),
        "probe_ping_p50_ms": pct(probe["ping_ms"], 0.5),
        "probe_ping_p99_ms": pct(probe["ping_ms"], 0.99),
        "probe_claims": len(probe["claim_ms"]),
        "srv_claim_p50_us": pct(slow.get("shard_claim", []), 0.5),
        "srv_claim_p99_us": pct(slow.get("shard_claim", []), 0.99),
        "srv_take": "lease_take" if args.rpm else "set nx",
        "srv_take_p50_us": pct(slow.get("lease_take" if args.rpm else "set nx", []), 0.5),
        "srv_take_p99_us": pct(slow.get("lease_take" if args.rpm else "set nx", []), 0.99),
        "claims": answers,
        "claims_per_shard": sum(answers.values()) / shards,
        "takes_per_unit": len(take_ms) / units,
        "cmds_per_unit": calls / units,
        "usec_per_unit": usec / units,
        "cpu_us_per_unit": cpu_s * 1e6 / units,
        "redis_busy": cpu_s / wall_s,
        "reads_per_unit": int(net.get("total_reads_processed", 0)) / units,
        "writes_per_unit": int(net.get("total_writes_processed", 0)) / units,
        "by_command": {n.removeprefix("cmdstat_"): (int(s["calls"]), int(s["usec"])) for n, s in stats.items()},
        "slowlog": {n: (len(v), pct(v, 0.5), pct(v, 0.99)) for n, v in slow.items()},
        "granted_twice": sum(1 for n in granted.values() if n > 1),
        "committed_twice": sum(1 for n in committed.values() if n > 1),
        "shards_committed_twice": sum(1 for n in shard_commits.values() if n > 1),
        "units_granted": len(granted),
        "units_committed": len(committed),
        "shards_committed": len(shard_commits),
        "counters_units_done": counters.units_done,
        "counters_shards_done": counters.shards_done,
        "queue_left": pending,
        "workers_cpu_us_per_unit": sum(r["cpu_s"] for r in reports) * 1e6 / units,
    }


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One K's repetitions: each figure's median, each check's worst; the commands of the median-CPU run."""
    out = dict(sorted(runs, key=lambda r: r["cpu_us_per_unit"])[len(runs) // 2])
    for field, value in runs[0].items():
        if isinstance(value, float):
            out[field] = statistics.median(r[field] for r in runs)
        elif field.endswith("twice") or field == "queue_left":
            out[field] = max(r[field] for r in runs)
        elif field in ("units_committed", "counters_shards_done"):
            out[field] = min(r[field] for r in runs)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", default="2,8,32", help="the Ks, comma-separated")
    ap.add_argument("--units", type=int, default=20_000)
    ap.add_argument("--shard-size", type=int, default=100)
    ap.add_argument("--window", type=int, default=8, help="units in flight per worker (the default window)")
    ap.add_argument("--call-ms", type=float, default=0.0, help="each call's time (no provider)")
    ap.add_argument("--rpm", type=float, default=0.0, help="a rate limit (the lease_take/lease_settle scripts)")
    ap.add_argument("--probe-hz", type=float, default=5.0, help="the probe's asks per second (0: no probe)")
    ap.add_argument("--nice", type=int, default=10, help="the workers' niceness (0: as the server's)")
    ap.add_argument("--no-slowlog", dest="slowlog", action="store_false", help="no server-side latencies")
    ap.add_argument("--repeat", type=int, default=1, help="runs per K (interleaved); figures are medians")
    ap.add_argument("--json", help="also write the figures here")
    # a worker process
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--run-id", help=argparse.SUPPRESS)
    ap.add_argument("--owner", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.probe:
        print(json.dumps(asyncio.run(probe_main(args))))
        return 0
    if args.worker:
        print(json.dumps(asyncio.run(worker_main(args))))
        return 0

    ks = [int(k) for k in args.workers.split(",")]
    runs: dict[int, list[dict[str, Any]]] = {k: [] for k in ks}
    with tempfile.TemporaryDirectory(prefix="many-workers-") as tmp:
        proc, port = start_valkey(Path(tmp), "--maxclients", "10000")
        try:
            for rep in range(args.repeat):  # interleaved: a busy spell of the machine falls on every K alike
                for k in ks:
                    res = run_k(port, k, args)
                    runs[k].append(res)
                    print(f"K={k} (#{rep + 1}): {res['wall_s']:.1f} s", file=sys.stderr, flush=True)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    results = [summary(runs[k]) for k in ks]

    mode = f"rpm {args.rpm:g} (lease_take/lease_settle scripts)" if args.rpm else "no rate limit (plain SET NX / IFEQ)"
    print(
        f"{args.units} units, shard_size {args.shard_size}, window {args.window}, call {args.call_ms:g} ms, {mode},"
        f" slowlog {'on' if args.slowlog else 'off'}, {args.repeat} run(s) per K (medians),"
        f" workers at nice {args.nice}, {os.cpu_count()} cores"
    )
    rows: list[tuple[str, str, Any]] = [
        ("wall s", ".1f", "wall_s"),
        ("claim p50 ms (client)", ".2f", "claim_p50_ms"),
        ("claim p99 ms (client)", ".2f", "claim_p99_ms"),
        ("take p50 ms (client)", ".2f", "take_p50_ms"),
        ("take p99 ms (client)", ".2f", "take_p99_ms"),
        ("PING p50 ms (probe)", ".2f", "probe_ping_p50_ms"),
        ("PING p99 ms (probe)", ".2f", "probe_ping_p99_ms"),
        ("claim p50 ms (probe)", ".2f", "probe_claim_p50_ms"),
        ("claim p99 ms (probe)", ".2f", "probe_claim_p99_ms"),
        ("take p50 ms (probe)", ".2f", "probe_take_p50_ms"),
        ("take p99 ms (probe)", ".2f", "probe_take_p99_ms"),
        ("claim p50 us (server)", ".1f", "srv_claim_p50_us"),
        ("claim p99 us (server)", ".1f", "srv_claim_p99_us"),
        ("take p50 us (server)", ".1f", "srv_take_p50_us"),
        ("take p99 us (server)", ".1f", "srv_take_p99_us"),
        ("claims per shard", ".2f", "claims_per_shard"),
        ("group takes per unit", ".3f", "takes_per_unit"),
        ("Redis commands/unit", ".3f", "cmds_per_unit"),
        ("Redis cmd us/unit", ".2f", "usec_per_unit"),
        ("Redis CPU us/unit", ".2f", "cpu_us_per_unit"),
        ("Redis busy (CPU/wall)", ".2f", "redis_busy"),
        ("Redis reads/unit", ".3f", "reads_per_unit"),
        ("Redis writes/unit", ".3f", "writes_per_unit"),
        ("workers' CPU us/unit", ".1f", "workers_cpu_us_per_unit"),
        ("leases granted twice", "d", "granted_twice"),
        ("answers committed twice", "d", "committed_twice"),
        ("shards committed twice", "d", "shards_committed_twice"),
        ("units committed", "d", "units_committed"),
        ("shards done (counters)", "d", "counters_shards_done"),
        ("shards left in queue", "d", "queue_left"),
    ]
    head = f"{'K':<26}" + "".join(f"{r['k']:>10}" for r in results)
    if len(results) > 1:
        head += f"{'ratio':>9}"
    print(head)
    for label, fmt, field in rows:
        line = f"{label:<26}" + "".join(f"{r[field]:>10{fmt}}" for r in results)
        if len(results) > 1 and fmt != "d":
            lo, hi = results[0][field], results[-1][field]
            line += f"{hi / lo:>9.2f}" if lo else f"{'-':>9}"
        print(line)
    for r in results:
        print(f"K={r['k']} commands (calls per unit, us per call):", end="")
        for name, (calls, usec) in sorted(r["by_command"].items(), key=lambda kv: -kv[1][0]):
            print(f"  {name} {calls / r['units']:.3f} @ {usec / max(calls, 1):.1f}", end="")
        print()
        if r["slowlog"]:
            print(f"K={r['k']} server-side (n, p50 us, p99 us):", end="")
            for name, (n, p50, p99) in sorted(r["slowlog"].items(), key=lambda kv: -kv[1][0]):
                print(f"  {name} {n} {p50:.0f}/{p99:.0f}", end="")
            print()
    bad = [r["k"] for r in results if r["granted_twice"] or r["committed_twice"] or r["shards_committed_twice"]]
    bad += [r["k"] for r in results if r["counters_shards_done"] != r["units"] // args.shard_size or r["queue_left"]]
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": results, "runs": runs}, indent=1, default=str))
    if bad:
        print(f"FAILED checks at K = {sorted(set(bad))}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
