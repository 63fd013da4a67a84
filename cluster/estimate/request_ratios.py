"""How many requests a stage whose prompts depend on earlier answers sent per unit: what ``plan`` counts it by.

Why: such a stage's units are known only as an upper bound before the run (the pipeline's ``estimate``: every
answer judged, say), and its requests are fewer. Identical requests are one request: the engine keys each by its
content hash (``ProviderRequest.key``), a unit whose key another unit holds waits for that one's answer, and the
response cache answers what an earlier run asked. A judge that grades three samples agreeing on the answer sends
one request, not three; timing all of them planned a run against a 250 ms endpoint at 2.6-3.5 times its length.

A finished run's record keeps each stage's units and how many the cache (or another unit of the same key) answered,
so ``units - cache_hits`` of them were sent: the ratio sent / units. It is taken for the stage to come from the
latest finished runs of the same pipeline whose stage sent any to the same endpoints (the model's answers make the
prompts: another model, or the simulator, agrees with itself more or less often); its stage's manifest names the
models its calls went to, the run's config says where each was. Of those runs, the highest ratio: a run whose
requests an earlier one's cache partly answered sent fewer than the same stage over new rows would, and an estimate
below the run is the worse miss (the plan names the run it took).
"""

from __future__ import annotations

from collections.abc import Set
from pathlib import Path

import msgspec

from punchline.cluster.estimate.latencies import Endpoint, endpoint, run_providers, stage_usage
from punchline.cluster.records.run_record import readable_records
from punchline.data.provider_settings import ProviderSettings

RUNS_READ = 5  # the latest finished runs of the pipeline looked at


class RequestRatio(msgspec.Struct, frozen=True, kw_only=True):
    """A stage of an earlier run: ``sent`` requests for its ``units`` units, to ``endpoints`` (None: unknown, a
    remote store's manifest is not read)."""

    run_id: str
    units: int
    sent: int
    endpoints: frozenset[Endpoint] | None = None

    @property
    def ratio(self) -> float:
        return self.sent / self.units if self.units else 1.0

    def fits(self, endpoints: Set[Endpoint]) -> bool:
        """Whether it called the endpoints the stage to come calls (all of them)."""
        return self.endpoints is None or endpoints <= self.endpoints


#: per stage, the earlier runs' ratios, latest first
Ratios = dict[str, list[RequestRatio]]


def request_ratios(runs_dir: str | Path, pipeline: str) -> Ratios:
    """Each stage's ratio of requests sent to units in the :data:`RUNS_READ` latest finished runs of ``pipeline``
    under ``runs_dir`` that sent any of its requests, latest first."""
    found = [
        rec
        for rec in readable_records(Path(runs_dir))
        if rec.state == "finished" and rec.pipeline == pipeline and rec.finished_at
    ]
    found.sort(key=lambda rec: rec.finished_at or 0.0, reverse=True)
    out: Ratios = {}
    for rec in found[:RUNS_READ]:
        providers: list[ProviderSettings] | None = None
        for stage, counters in rec.counters.items():
            sent = counters.units_total - counters.cache_hits
            if counters.units_total <= 0 or sent <= 0:
                continue
            if providers is None:
                providers = run_providers(rec.config_toml)
            called = _called_endpoints(rec.services.store_url, rec.run_id, stage, providers)
            ratio = RequestRatio(run_id=rec.run_id, units=counters.units_total, sent=sent, endpoints=called)
            out.setdefault(stage, []).append(ratio)
    return out


def _called_endpoints(
    store_url: str, run_id: str, stage: str, providers: list[ProviderSettings]
) -> frozenset[Endpoint] | None:
    """The endpoints a finished stage's calls went to: its manifest's models, where the run's config put them."""
    if "://" in store_url:
        return None
    usage = stage_usage(Path(store_url), run_id, stage)
    if not usage:
        return None
    return frozenset(
        endpoint(settings, model_id)
        for model_id in usage
        for settings in providers
        if any(m.id == model_id for m in settings.models.values())
    )


def ratio_for(ratios: Ratios | None, stage: str, endpoints: Set[Endpoint]) -> RequestRatio | None:
    """The highest ratio for ``stage`` of the earlier runs that called the same endpoints (the latest of equals;
    None: no such run)."""
    fitting = [r for r in (ratios or {}).get(stage, []) if r.fits(endpoints)]
    return max(fitting, key=lambda r: r.ratio) if fitting else None
