"""How long a run will take: ``plan``'s wall-time estimate, its calls and its fixed costs.

The rate limits only bound a run from below: a run also starts (the driver's preflight, the embedded ledger,
its first worker's fork), plans and reduces each stage, waits out each stage's first and last round trips,
and ends (the report, the services' stop). So the estimate is the stages' calls (each the longer of the rate
limits' and the concurrency's bounds over its uncached requests, ``call_time.py``) plus those fixed costs.

The fixed costs come from the runs folder when it holds finished runs of the same pipeline: their logs
(``runs/<id>/log.jsonl``) time every stage's plan, fork, calls and reduce, and the medians of the latest runs like
the one to come (a rerun that calls nothing, or one that calls) are taken; a stage whose units such a run called
gives its pace per unit too. Without such a run, the defaults below (the demos' on a 2-core machine) say it.
What the log cannot see, Python's start before the driver and the report after it, is :data:`PROCESS_S`.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Protocol

import msgspec

from punchline.cluster.config import RunConfig
from punchline.cluster.estimate.machine_load import slowdown
from punchline.cluster.ray_cluster.shared_store import config_store
from punchline.cluster.records.run_record import readable_records
from punchline.cluster.registry import pipeline_of
from punchline.cluster.run.executors.local_pace import LOCAL_ALONE_S
from punchline.data.requests import ProviderRequest
from punchline.data.settings import STORE
from punchline.data.storage.response_cache import CACHE_PREFIX, ResponseCache
from punchline.data.storage.run_layout import RunLayout
from punchline.data.stores.local import LocalStore

#: what the plan asks of the response cache: whether it holds a request's answer (the request, and its key)
CacheLookup = Callable[[ProviderRequest, str], bool]


class StageEstimate(Protocol):
    """What the estimate reads of a stage's plan (``planner.StageEstimate``; the planner is a floor up)."""

    @property
    def stage(self) -> str: ...
    @property
    def requests(self) -> int: ...
    @property
    def cached_requests(self) -> int: ...
    @property
    def units(self) -> int: ...
    @property
    def min_wall_s(self) -> float: ...
    @property
    def calls_s(self) -> float: ...
    @property
    def providers(self) -> int: ...
    @property
    def timed_by(self) -> list[str]: ...
    @property
    def to_send(self) -> int: ...
    @property
    def sent_bound(self) -> bool: ...


START_S = 0.4  # the driver's start to its first stage's plan: preflight, the embedded ledger, the run's claim
FIRST_WORKER_S = 0.6  # the first stage's worker: a fork that imports its providers' SDK
STAGE_S = 0.8  # a stage with calls: its plan, its worker's fork, its first and last round trips, its reduce
PLAIN_STAGE_S = 0.2  # a stage without calls: its plan and its reduce
PROCESS_S = 1.0  # outside the driver's log: Python and the CLI's imports before it, the report and the stop after
RAY_S = 5.0  # a long stage the driver's worker asks help for: Ray's and its workers' start (assumed, not measured)
CPU_BOUND_PACE = 1.2  # an earlier run's pace this much slower than the limits and latency allow: a busy CPU
CACHED_REDUCE_S = 0.05  # a reduce in a rerun that calls nothing, when no such rerun was measured (figures kept)
WARMUP_S = 2.0  # the first worker's ready to the end of the imports the next stages' forks wait for
WARMUP_WAIT_MIN_S = 0.25  # a fork's wait that measures the warm-up
RUNS_TRIED = 5  # the most recent finished runs looked at for one with a readable log
LOAD_NOTE = 0.05  # a load factor this far from 1 is said in the estimate's line


class MeasuredRun(msgspec.Struct, kw_only=True):
    """The fixed costs and paces finished runs of the same pipeline had in this runs folder."""

    run_id: str  # the latest of the runs whose start and stages' own costs are taken
    runs: int = 1  # how many: the medians of their figures
    start_s: float  # the driver's start to its first stage's plan
    stages_s: dict[str, float]  # each stage's own time: plan, worker's fork (its calls, reduce, warm-up wait apart)
    reduces_s: dict[str, float] = {}  # each stage's reduce (median) in the runs that called: fresh runs
    cached_reduces_s: dict[str, float] = {}  # and in those that called nothing: reruns (their figures copied)
    figure_stages: list[str] = []  # the stages whose reduce wrote figures in the latest fresh run
    paces_s: dict[str, float] = {}  # per stage: seconds of its calls per unit called, from a run that called many
    warmup_s: float | None = None  # the first worker's ready to the warm-up's end, when a fork waited for it
    ray_joined: bool = False
    runnable: float | None = None  # other tasks runnable at their starts (median; machine_load.py), None: unknown


class WallEstimate(msgspec.Struct, kw_only=True):
    """A run's expected wall time and its parts (``total_s`` = ``calls_s`` + ``fixed_s``)."""

    total_s: float
    calls_s: float  # the stages' calls, one after the other
    fixed_s: float  # start, plans, reduces, round trips, the report (and Ray's start, ``ray_s``)
    least_s: float  # the rate limits' bound alone (every request called): a lower bound
    ray_s: float = 0.0
    load_factor: float = 1.0  # the fixed costs stretched by the machine's load now against theirs (machine_load.py)
    runnable_now: float | None = None  # other tasks runnable on the machine as the estimate was made
    measured_in: str = ""  # the (latest) run whose fixed costs these are; "" = the defaults
    measured_runs: int = 0  # of how many runs they are the medians
    requests: int = 0
    cached_requests: int = 0  # of ``requests``, answered by the response cache already
    to_send: int = 0  # what the run will send: identical requests once, the cached ones not
    sent_bound: bool = False  # ``to_send`` counts a stage's every unit: an upper bound (no earlier run said)
    stages_calls_s: dict[str, float] = {}  # per stage with calls, the time of its calls (part of ``calls_s``)
    timed_by: list[str] = []  # what timed the calls: "simulator", "measured" (here), "default" (per kind)

    def describe(self) -> str:
        """One line: the estimate with its parts, and the lower bound."""
        where = f"measured in run {self.measured_in}" if self.measured_in else "defaults, no earlier run here"
        if self.measured_runs > 1:
            where = f"medians of {self.measured_runs} runs here, the latest {self.measured_in}"
        ray = f", {_secs(self.ray_s)} Ray's start" if self.ray_s else ""
        load = ""
        if abs(self.load_factor - 1.0) >= LOAD_NOTE and self.runnable_now is not None:
            busy = f"{self.runnable_now:.0f} tasks runnable besides"
            load = f"; x{self.load_factor:.1f} for the machine's load now ({busy})"
        cache = (
            f"; {self.cached_requests} of {self.requests} requests answered by the response cache"
            if self.cached_requests
            else ""
        )
        sent = f"; {self.to_send} requests to send"
        if self.sent_bound:  # a stage whose prompts depend on earlier answers, none of its runs here to go by
            sent += " at most (a stage's units counted as its requests: the time is an upper bound)"
        timing = ""
        if "default" in self.timed_by:
            timing = "; real endpoints' calls at their kind's default latency (none measured here yet)"
        elif "measured" in self.timed_by:
            timing = "; real endpoints' calls at the latencies earlier runs here measured"
        return (
            f"wall time: about {_secs(self.total_s)} ({_secs(self.calls_s)} calls, {_secs(self.fixed_s)} start, "
            f"plans, reduces and report{ray}{load}: {where}); the rate limits alone, every request called: at least "
            f"{_secs(self.least_s)}{cache}{sent}{timing}"
        )


def _secs(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"


def estimate_wall(
    cfg: RunConfig, estimates: Sequence[StageEstimate], runs_dir: str | Path, runnable_now: float | None = None
) -> WallEstimate:
    """The run's wall time: its stages' calls (``estimates``, from ``plan_run``) and its fixed costs, from the
    runs folder's latest finished runs of the pipeline if there are any, else the defaults (a quiet machine's).
    ``runnable_now``: other tasks runnable on the machine now (``machine_load.sample_runnable``); the fixed costs,
    CPU time, are stretched by its slowdown against the one their runs had (None: as measured)."""
    by_stage = {e.stage: e for e in estimates}
    rerun = all(not e.to_send for e in estimates)  # every answer cached: nothing is called
    measured = measure(runs_dir, cfg.run.pipeline, rerun=rerun)
    fixed = measured.start_s if measured is not None else START_S
    calls_s = 0.0
    stages_calls_s: dict[str, float] = {}
    since_first_worker: float | None = None  # the time from the first worker's start to the next fork
    long_stage = False
    for name in [s.name for s in pipeline_of(cfg).stages(cfg)]:
        e = by_stage.get(name)
        if e is not None and not e.requests:  # an upper bound of no calls: a stage that only reduces
            e = None
        calls = _calls_s(e, measured.paces_s.get(name) if measured is not None else None)
        own = _own_s(measured, name, rerun)
        if own is None:
            own = PLAIN_STAGE_S if e is None else STAGE_S + (FIRST_WORKER_S if since_first_worker is None else 0.0)
        if e is not None and since_first_worker is not None:  # its fork waits for the warm-up's imports
            warmup_s = measured.warmup_s if measured is not None and measured.warmup_s is not None else WARMUP_S
            fixed += max(0.0, warmup_s - since_first_worker)
            since_first_worker = float("inf")
        elif since_first_worker is not None:
            since_first_worker += own
        if e is not None and since_first_worker is None:  # the warm-up starts once its worker calls
            since_first_worker = calls if calls > 0 else float("inf")
        fixed += own
        calls_s += calls
        if e is not None:
            stages_calls_s[name] = calls
        long_stage = long_stage or (e is not None and _needs_ray(e, calls))
    ray_s = RAY_S if long_stage and not (measured is not None and measured.ray_joined) else 0.0
    then = measured.runnable if measured is not None else None
    factor = slowdown(runnable_now) / slowdown(then if then is not None else 0.0) if runnable_now is not None else 1.0
    fixed = (fixed + PROCESS_S + ray_s) * factor
    return WallEstimate(
        total_s=calls_s + fixed,
        calls_s=calls_s,
        fixed_s=fixed,
        least_s=sum(e.min_wall_s for e in estimates),
        ray_s=ray_s * factor,
        load_factor=factor,
        runnable_now=runnable_now,
        measured_in=measured.run_id if measured is not None else "",
        measured_runs=measured.runs if measured is not None else 0,
        requests=sum(e.requests for e in estimates),
        cached_requests=sum(e.cached_requests for e in estimates),
        to_send=sum(e.to_send for e in estimates),
        sent_bound=any(e.sent_bound and e.to_send for e in estimates),
        stages_calls_s=stages_calls_s,
        timed_by=sorted({source for e in estimates for source in e.timed_by}),
    )


def _own_s(measured: MeasuredRun | None, stage: str, rerun: bool) -> float | None:
    """A stage's own time besides its calls, from the runs measured: its plan and fork, and its reduce as a run
    like this one had it; a rerun that calls nothing, not measured yet, copies the figures a fresh run drew
    (``_cache/figures/``) and redoes the rest of a reduce. None: not measured."""
    if measured is None or stage not in measured.stages_s:
        return None
    fresh, cached = measured.reduces_s.get(stage), measured.cached_reduces_s.get(stage)
    if rerun and cached is None and stage in measured.figure_stages:
        reduce_s = min(fresh or 0.0, CACHED_REDUCE_S)
    elif rerun:
        reduce_s = cached if cached is not None else (fresh or 0.0)
    else:
        reduce_s = fresh if fresh is not None else (cached or 0.0)
    return measured.stages_s[stage] + reduce_s


def _needs_ray(estimate: StageEstimate, calls_s: float) -> bool:
    """Whether the driver's own worker would call for Ray's workers (``executors/local_pace.py``): a stage long
    for it alone whose calls need more places than its window holds (more than one provider), or that keeps the
    worker busy on its CPU (an earlier run's pace well past what the limits and the latency allow). A stage held
    by its rate limits or by its provider's latency starts no Ray: more workers would wait with it."""
    return calls_s >= LOCAL_ALONE_S and (estimate.providers > 1 or calls_s > CPU_BOUND_PACE * estimate.calls_s)


def _calls_s(estimate: StageEstimate | None, pace_s: float | None) -> float:
    """A stage's calls: the rate limits' and the concurrency's bound, or the pace an earlier run of it kept
    per unit it sent (the worker's own time per call included), over the units whose requests it sends."""
    if estimate is None:
        return 0.0
    if pace_s is None or not estimate.requests:
        return estimate.calls_s
    sent_units = estimate.units * estimate.to_send / estimate.requests
    return max(estimate.calls_s, pace_s * sent_units)


def store_of(cfg: RunConfig, runs_dir: str) -> str:
    """The store a run of ``cfg`` would use (the driver's order: ``PUNCHLINE_STORE``, ``[run] store``, the runs
    folder), where its response cache is."""
    return STORE.get() or config_store(cfg) or runs_dir


def cache_lookup(store_url: str) -> CacheLookup | None:
    """Whether the response cache of a local store holds a request's answer (its packs indexed once, then a
    look-up per request); None for a remote store (listing its packs costs requests: none taken as cached)
    or a store without a cache."""
    if "://" in store_url or not (Path(store_url) / CACHE_PREFIX).is_dir():
        return None
    cache = ResponseCache(LocalStore(store_url))
    cache.refresh()

    def cached(request: ProviderRequest, key: str) -> bool:
        return cache.pack_of(key) is not None or (Path(store_url) / cache.path(key)).is_file()

    return cached


# --- a finished run's fixed costs, from its log --------------------------------------------------------


class _Event(msgspec.Struct, kw_only=True):
    """The fields of a log line the estimate reads (the others are skipped unread)."""

    event: str = ""
    timestamp: str = ""
    stage: str = ""
    state: str = ""
    driver_start: float | None = None
    ray_up: float | None = None
    runnable_others: float | None = None  # in start_phases: other tasks runnable as the driver started


_decode_event = msgspec.json.Decoder(_Event)
_STAGE_EVENTS = ("plan_start", "stage_start", "reduce_start", "reduce_done")
_WORKER_EVENTS = ("fork_warmup_settling", "local_worker_starting", "local_worker_ready")
_READ = tuple(f'"{e}"'.encode() for e in ("run_start", "run_end", "start_phases", *_STAGE_EVENTS, *_WORKER_EVENTS))
PACE_MIN_UNITS = 20  # a stage's pace is taken from a run that called at least this many of its units
PACE_MIN_SHARE = 0.25  # and at least this share of them (identical requests are one: a judge calls fewer)


class _Stage(msgspec.Struct, kw_only=True):
    own_s: float  # its plan, its fork, and the gaps after its reduce (its calls, reduce and warm-up wait apart)
    reduce_s: float
    calls_span_s: float
    units: int  # its units in that run
    called: int  # of them, called (not found cached)


class _Session(msgspec.Struct, kw_only=True):
    start_s: float
    stages: dict[str, _Stage]
    warmup_s: float | None
    ray_joined: bool
    runnable: float | None = None

    @property
    def called_none(self) -> bool:
        """A rerun: every answer was in the cache."""
        return not any(st.called for st in self.stages.values())


def measure(runs_dir: str | Path, pipeline: str, *, rerun: bool = False) -> MeasuredRun | None:
    """The fixed costs of the latest finished runs of ``pipeline`` under ``runs_dir`` (at most
    :data:`RUNS_TRIED`, each with its log's last session whole): the median of those like the run to come (a rerun
    that calls nothing, or a run that calls), else of all of them; each stage's pace and the warm-up from the
    latest that shows them. None: no such run."""
    sessions: list[tuple[str, _Session, str]] = []
    for run_id, counters, store_url in _finished_runs(Path(runs_dir), pipeline):
        with contextlib.suppress(OSError, ValueError, msgspec.DecodeError):
            session = _measure_log(RunLayout(run_id).local(runs_dir).log, counters)
            if session is not None:
                sessions.append((run_id, session, store_url))
    if not sessions:
        return None
    fresh = [x for x in sessions if not x[1].called_none]
    alike = [x for x in sessions if x[1].called_none == rerun] or sessions
    paces: dict[str, float] = {}
    for _, session, _ in sessions:
        for name, st in session.stages.items():
            if _paced(st):
                paces.setdefault(name, st.calls_span_s / st.called)
    latest_fresh = fresh[0] if fresh else None
    return MeasuredRun(
        run_id=alike[0][0],
        runs=len(alike),
        start_s=statistics.median(session.start_s for _, session, _ in alike),
        stages_s=_medians(
            {name: st.own_s + (0.0 if _paced(st) else st.calls_span_s) for name, st in session.stages.items()}
            for _, session, _ in alike
        ),
        reduces_s=_medians({n: st.reduce_s for n, st in session.stages.items()} for _, session, _ in fresh),
        cached_reduces_s=_medians(
            {n: st.reduce_s for n, st in session.stages.items()} for _, session, _ in sessions if session.called_none
        ),
        figure_stages=[]
        if latest_fresh is None
        else [n for n in latest_fresh[1].stages if _drew_figures(latest_fresh[2], latest_fresh[0], n)],
        paces_s=paces,
        warmup_s=next((session.warmup_s for _, session, _ in sessions if session.warmup_s is not None), None),
        ray_joined=alike[0][1].ray_joined,
        runnable=_median_known(session.runnable for _, session, _ in alike),
    )


def _median_known(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _medians(runs: Iterable[dict[str, float]]) -> dict[str, float]:
    """Per stage, the median of the runs that measured it."""
    seen: dict[str, list[float]] = {}
    for run in runs:
        for name, seconds in run.items():
            seen.setdefault(name, []).append(seconds)
    return {name: statistics.median(values) for name, values in seen.items()}


def _paced(stage: _Stage) -> bool:
    """Whether the run called enough of the stage's units for its calls' span to say their pace."""
    return stage.called >= max(PACE_MIN_UNITS, stage.units * PACE_MIN_SHARE)


FIGURES = (".png", ".svg", ".pdf")  # a reduce's artifacts that are figures (kept for a rerun: _cache/figures/)


class _Manifest(msgspec.Struct):
    artifacts: list[str] = []


def _drew_figures(store_url: str, run_id: str, stage: str) -> bool:
    """Whether the stage's artifacts in a local store (its manifest) hold figures."""
    if "://" in store_url:
        return False
    try:
        manifest = msgspec.json.decode(
            (Path(store_url) / RunLayout(run_id).manifest(stage)).read_bytes(), type=_Manifest
        )
    except (OSError, msgspec.DecodeError):
        return False
    return any(name.endswith(FIGURES) for name in manifest.artifacts)


def _finished_runs(root: Path, pipeline: str) -> Iterator[tuple[str, dict[str, tuple[int, int]], str]]:
    """Finished runs of the pipeline, latest first, with each stage's units and how many it called, and their
    store."""
    found: list[tuple[float, str, dict[str, tuple[int, int]], str]] = []
    for rec in readable_records(root):
        if rec.state == "finished" and rec.pipeline == pipeline and rec.finished_at:
            units = {s: (c.units_total, max(0, c.units_total - c.cache_hits)) for s, c in rec.counters.items()}
            found.append((rec.finished_at, rec.run_id, units, rec.services.store_url))
    for _, run_id, units, store_url in sorted(found, reverse=True)[:RUNS_TRIED]:
        yield run_id, units, store_url


def _at(event: _Event) -> float:
    return datetime.fromisoformat(event.timestamp).timestamp()


def _events(log: Path) -> list[_Event]:
    """The events of the log's last session (from its last ``run_start``) the estimate reads."""
    events: list[_Event] = []
    with log.open("rb") as lines:
        for line in lines:
            if not any(word in line for word in _READ):  # the shards' lines, most of a log: not decoded
                continue
            event = _decode_event.decode(line)
            if event.event == "run_start":
                events = []
            events.append(event)
    return events


def _measure_log(log: Path, units: dict[str, tuple[int, int]]) -> _Session | None:
    """A finished session's start, each stage's own time (its plan, fork and reduce: the time outside its
    calls, less any wait for the warm-up) and its calls' span, and the warm-up's length."""
    events = _events(log)
    ends = [e for e in events if e.event == "run_end" and e.state == "finished"]
    if not events or events[0].event != "run_start" or not ends:
        return None
    driver = next((e.driver_start for e in events if e.event == "start_phases" and e.driver_start), None)
    marks: dict[str, dict[str, float]] = {}  # stage -> its events' first times, in the order the stages ran
    for e in events:
        if e.stage and e.event in (*_STAGE_EVENTS, *_WORKER_EVENTS):
            marks.setdefault(e.stage, {}).setdefault(e.event, _at(e))
    order = [name for name, m in marks.items() if "plan_start" in m]
    if not order:
        return None
    stages: dict[str, _Stage] = {}
    warmup_s = None
    first_ready = next((marks[n]["local_worker_ready"] for n in order if "local_worker_ready" in marks[n]), None)
    for i, name in enumerate(order):
        m = marks[name]
        if not all(k in m for k in _STAGE_EVENTS):
            continue
        until = marks[order[i + 1]]["plan_start"] if i + 1 < len(order) else _at(ends[-1])
        waited = 0.0
        if "fork_warmup_settling" in m and "local_worker_starting" in m:
            waited = max(0.0, m["local_worker_starting"] - m["fork_warmup_settling"])
            # a fork that hardly waited shows the end of imports that shared the CPU with the calls (slower
            # than a rerun's, which waits for them alone): only a real wait measures the warm-up
            if warmup_s is None and first_ready is not None and waited >= WARMUP_WAIT_MIN_S:
                warmup_s = max(0.0, m["local_worker_starting"] - first_ready)
        total, called = units.get(name, (0, 0))
        reduce_s = max(0.0, m["reduce_done"] - m["reduce_start"])
        stages[name] = _Stage(
            own_s=max(0.0, (m["stage_start"] - m["plan_start"]) + (until - m["reduce_start"]) - waited - reduce_s),
            reduce_s=reduce_s,
            calls_span_s=max(0.0, m["reduce_start"] - m["stage_start"]),
            units=total,
            called=called,
        )
    return _Session(
        start_s=max(0.0, marks[order[0]]["plan_start"] - (driver if driver is not None else _at(events[0]))),
        stages=stages,
        warmup_s=warmup_s,
        ray_joined=any(e.event == "start_phases" and e.ray_up for e in events),
        runnable=next(
            (e.runnable_others for e in events if e.event == "start_phases" and e.runnable_others is not None), None
        ),
    )
