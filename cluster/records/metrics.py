"""A run's counters as Prometheus text, served by ``punchline view`` (any run) and by the driver during a run.

Everything comes from what a run already counts: the ledger's stage counters (calls, cache hits, retries,
tokens, dollars, units, shards), the budget's tokens and dollars per (stage, model), the shards leased right now
(in flight), the provider batches' records and states, and the run log's events that say something went wrong
(``lease_lost``, ``shard_lease_lost``, ``unit_failed``, ``invalid_answer_retry``, ...), counted by reading the
log from where the last scrape stopped, and the workers' own figures of the moment
(:mod:`punchline.workers.calls.call_stats`: calls in flight, 429s, retries and the calls' latency per stage, provider
and model, published once a second). A finished run's shard files give the same per model (answered units'
latency, retries, 429s) on ``punchline view``'s ``/run/<id>/metrics``. Nothing here imports the driver, so the
driver can serve it.

Names follow Prometheus' conventions: the unit in the name (``_seconds``, ``_usd``, ``_tokens``), ``_total``
on counters and on nothing else, one label set per family.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Protocol

import msgspec
import structlog

from punchline.data.errors import InputError
from punchline.data.units import LATENCY_BUCKETS_S, ModelUsage
from punchline.schedulers.batches import BatchRecord
from punchline.schedulers.budget import Budget, UsageRow
from punchline.schedulers.ledger import Ledger, StageCounters
from punchline.workers.calls import call_stats
from punchline.workers.calls.call_stats import CallRow

log = structlog.get_logger("punchline.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: the log events counted (each a ``punchline_log_events_total{event=...}`` series)
EVENTS = (
    "lease_lost",
    "shard_lease_lost",
    "lease_lost_at_commit",
    "unit_failed",
    "invalid_answer_retry",
    "ledger_unavailable",
    "worker_died",
    "budget_exhausted",
    "answers_spooled",
    "batch_poll_failed",
)

_STAGE_COUNTERS = {
    "calls": ("provider_requests", "provider HTTP calls"),
    "cache_hits": ("cache_hits", "units answered from the response cache"),
    "retries": ("provider_retries", "failed provider calls that were retried (429s, 5xx, timeouts, malformed)"),
    "input_tokens": ("input_tokens", "input tokens billed"),
    "output_tokens": ("output_tokens", "output tokens billed"),
    "cost_usd": ("cost_usd", "dollars billed"),
    "units_done": ("units_done", "units answered"),
    "units_failed": ("units_failed", "units failed for good"),
}


class RunMetrics(msgspec.Struct, kw_only=True):
    run_id: str
    pipeline: str = ""
    state: str = ""
    live: bool = False
    counters: dict[str, StageCounters] = {}
    usage: list[UsageRow] = []
    leased: dict[str, int] | None = None
    batches: list[BatchRecord] = []
    models: dict[str, dict[str, ModelUsage]] = {}  # stage -> model -> calls and usage, from the shard files
    events: dict[str, int] = {}
    calls: list[CallRow] = []  # the workers' figures of the moment (a running run's)


class LogEvents:
    """Counts of :data:`EVENTS` in a run log, read on from where the last call stopped (lines are appended)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def read(self) -> dict[str, int]:
        with self._lock:
            try:
                with open(self.path, "rb") as fh:
                    fh.seek(self.offset)
                    chunk = fh.read(64 << 20)
            except OSError:
                return dict(self.counts)
            end = chunk.rfind(b"\n") + 1  # a line being written is read next time
            for line in chunk[:end].splitlines():
                if b'"event"' not in line:
                    continue
                for name in EVENTS:
                    if f'"event": "{name}"'.encode() in line or f'"event":"{name}"'.encode() in line:
                        self.counts[name] = self.counts.get(name, 0) + 1
                        break
            self.offset += end
            return dict(self.counts)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _histogram(out: list[str], name: str, doc: str, series: list[tuple[dict[str, str], list[int], float]]) -> None:
    """A histogram family from per-bucket counts (``LATENCY_BUCKETS_S`` + one above): cumulative ``le`` buckets."""
    out.append(f"# HELP {name} {doc}")
    out.append(f"# TYPE {name} histogram")
    for labels, counts, total_s in series:
        text = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
        running = 0
        size = len(LATENCY_BUCKETS_S) + 1
        for bound, n in zip((*LATENCY_BUCKETS_S, float("inf")), (list(counts) + [0] * size)[:size], strict=True):
            running += n
            le = "+Inf" if bound == float("inf") else f"{bound:g}"
            out.append(f'{name}_bucket{{{text},le="{le}"}} {running}')
        out.append(f"{name}_sum{{{text}}} {total_s:.10g}")
        out.append(f"{name}_count{{{text}}} {running}")


_Samples = list[tuple[dict[str, str], float]]


def _family(out: list[str], name: str, kind: str, doc: str, samples: _Samples) -> None:
    """One metric family: its HELP and TYPE lines, then a line per labelled sample."""
    out.append(f"# HELP {name} {doc}")
    out.append(f"# TYPE {name} {kind}")
    for labels, value in samples:
        text = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
        out.append(f"{name}{{{text}}} {value:.10g}")


def render(runs: list[RunMetrics]) -> str:
    """Prometheus text exposition format (version 0.0.4) for the runs."""
    out: list[str] = []
    _run_and_stage_families(out, runs)
    _model_families(out, runs)
    _provider_families(out, runs)
    _batch_and_event_families(out, runs)
    return "\n".join(out) + "\n"


def _run_and_stage_families(out: list[str], runs: list[RunMetrics]) -> None:
    """What each run is, and its stages' counters, plan size and shards (from the ledger or the run record)."""
    _family(
        out,
        "punchline_run_info",
        "gauge",
        "a run: its pipeline and state (1); live says its counters come from its ledger now",
        [({"run": r.run_id, "pipeline": r.pipeline, "state": r.state, "live": str(r.live).lower()}, 1) for r in runs],
    )
    for metric, (field, doc) in _STAGE_COUNTERS.items():
        kind = "counter" if metric not in ("units_done", "units_failed") else "gauge"
        samples = [
            ({"run": r.run_id, "stage": s}, float(getattr(c, field))) for r in runs for s, c in r.counters.items()
        ]
        _family(out, f"punchline_stage_{metric}" + ("_total" if kind == "counter" else ""), kind, doc, samples)
    _family(
        out,
        "punchline_stage_units_planned",
        "gauge",
        "units the stage's plan has",
        [({"run": r.run_id, "stage": s}, float(c.units_total)) for r in runs for s, c in r.counters.items()],
    )
    _family(
        out,
        "punchline_stage_shards",
        "gauge",
        "shards by state (done, total, leased: being worked on right now)",
        [
            ({"run": r.run_id, "stage": s, "state": state}, float(v))
            for r in runs
            for s, c in r.counters.items()
            for state, v in (
                ("done", c.shards_done),
                ("total", c.shards_total),
                *((("leased", r.leased.get(s, 0)),) if r.leased is not None else ()),
            )
        ],
    )


def _model_families(out: list[str], runs: list[RunMetrics]) -> None:
    """Per model: tokens and dollars billed, and calls, retries, 429s and latency of committed shards."""
    for metric, attr, doc in (
        ("input_tokens", "input_tokens", "input tokens billed, per model"),
        ("output_tokens", "output_tokens", "output tokens billed, per model"),
        ("cost_usd", "usd", "dollars billed, per model"),
    ):
        _family(
            out,
            f"punchline_model_{metric}_total",
            "counter",
            doc,
            [
                ({"run": r.run_id, "stage": u.stage, "model": u.model}, float(getattr(u, attr)))
                for r in runs
                for u in r.usage
            ],
        )
    _family(
        out,
        "punchline_model_calls_total",
        "counter",
        "provider calls per model (from the stage's shard files: committed shards only)",
        [
            ({"run": r.run_id, "stage": s, "model": m}, float(u.calls))
            for r in runs
            for s, models in r.models.items()
            for m, u in models.items()
        ],
    )
    for metric, attr, doc in (
        ("retries", "retries", "failed attempts of the stage's units tried again, per model (committed shards)"),
        ("rate_limited", "rate_limited", "429 answers to the stage's calls, per model (committed shards)"),
    ):
        _family(
            out,
            f"punchline_model_{metric}_total",
            "counter",
            doc,
            [
                ({"run": r.run_id, "stage": s, "model": m}, float(getattr(u, attr)))
                for r in runs
                for s, models in r.models.items()
                for m, u in models.items()
            ],
        )
    _histogram(
        out,
        "punchline_model_unit_latency_seconds",
        "answered units' first attempt to accepted answer, retries included, per model (committed shards)",
        [
            ({"run": r.run_id, "stage": s, "model": m}, u.latency_counts, u.latency_sum_s)
            for r in runs
            for s, models in r.models.items()
            for m, u in models.items()
            if u.latency_counts
        ],
    )


def _provider_families(out: list[str], runs: list[RunMetrics]) -> None:
    """The workers' live call figures per provider and model: in flight, ended, 429s, retries, latency."""
    live = [(r.run_id, c) for r in runs for c in r.calls]

    def labels(run_id: str, c: CallRow) -> dict[str, str]:
        return {"run": run_id, "stage": c.stage, "provider": c.provider, "model": c.model}

    _family(
        out,
        "punchline_provider_calls_in_flight",
        "gauge",
        "provider calls under way right now (a retry's backoff not counted), from the workers' figures",
        [(labels(run_id, c), float(c.in_flight)) for run_id, c in live],
    )
    for metric, attr, doc in (
        ("calls", "calls", "units' provider calls that ended (answered or failed), from the workers' figures"),
        ("rate_limited", "rate_limited", "429 (rate limited) answers, from the workers' figures"),
        ("retries", "retries", "failed attempts (429s, 5xx, timeouts, malformed) tried again, from the workers"),
    ):
        _family(
            out,
            f"punchline_provider_{metric}_total",
            "counter",
            doc,
            [(labels(run_id, c), float(getattr(c, attr))) for run_id, c in live],
        )
    _histogram(
        out,
        "punchline_provider_call_latency_seconds",
        "a unit's provider call from its first attempt to its answer, retries and backoff included",
        [(labels(run_id, c), c.latency_counts, c.latency_sum_s) for run_id, c in live if c.latency_counts],
    )


def _batch_and_event_families(out: list[str], runs: list[RunMetrics]) -> None:
    """Provider batches by state, and the run log's events that say something went wrong."""
    states: dict[tuple[str, str, str, str], int] = {}
    for r in runs:
        for b in r.batches:
            k = (r.run_id, b.stage, b.model, b.state)
            states[k] = states.get(k, 0) + 1
    _family(
        out,
        "punchline_batches",
        "gauge",
        "provider batches by state",
        [
            ({"run": run, "stage": st, "model": m, "state": s}, float(n))
            for (run, st, m, s), n in sorted(states.items())
        ],
    )
    _family(
        out,
        "punchline_log_events_total",
        "counter",
        "run log events that say something went wrong (lease losses, failed units, retried malformed answers, ...)",
        [({"run": r.run_id, "event": e}, float(r.events.get(e, 0))) for r in runs for e in EVENTS],
    )


def from_ledger(run_id: str, pipeline: str, stages: list[str], ledger: Ledger, events: LogEvents | None) -> RunMetrics:
    """A running run's metrics, read from its ledger (what the driver serves)."""
    return RunMetrics(
        run_id=run_id,
        pipeline=pipeline,
        state="running",
        live=True,
        counters={s: ledger.counters(run_id, s) for s in stages},
        usage=Budget(ledger.r, run_id, None).usage(),
        leased={s: ledger.leased_shards(run_id, s) for s in stages},
        events=events.read() if events is not None else {},
        calls=call_stats.read(ledger.r, ledger.ns, run_id),
    )


class MetricsServer:
    """``/metrics`` on a port of its own, answered from ``collect()`` at each scrape, in a daemon thread."""

    def __init__(self, port: int, collect: Callable[[], list[RunMetrics]], host: str = "127.0.0.1") -> None:
        collect_fn = collect

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] != "/metrics":
                    self.send_error(404)
                    return
                try:
                    body = render(collect_fn()).encode()
                except Exception as exc:  # a scrape during a ledger outage: say so, keep serving
                    self.send_error(503, explain=str(exc)[:200])
                    return
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="punchline-metrics", daemon=True)
        self.thread.start()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.httpd.shutdown()
            self.httpd.server_close()


class _Run(Protocol):
    run_id: str
    pipeline: str
    stages: list[str]


def serve_driver_metrics(port: int | None, record: _Run, ledger: Ledger, log_path: Path) -> MetricsServer | None:
    """The driver's hook: ``/metrics`` of the run on 127.0.0.1:``port`` while it runs (None: no port asked)."""
    if port is None:
        return None
    events = LogEvents(log_path)
    run_id, pipeline, stages = record.run_id, record.pipeline, list(record.stages)
    try:
        server = MetricsServer(port, lambda: [from_ledger(run_id, pipeline, stages, ledger, events)])
    except (OSError, OverflowError) as exc:
        raise InputError(
            f"cannot serve metrics there: {getattr(exc, 'strerror', None) or exc}", field="--metrics-port"
        ) from None
    log.info("metrics_serving", url=f"http://127.0.0.1:{server.port}/metrics")
    return server
