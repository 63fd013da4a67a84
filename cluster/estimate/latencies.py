"""How long a real endpoint's calls took in this runs folder: what ``plan`` times a stage's calls by.

Why: a real endpoint's latency is nothing a config says, and a guess from ``max_tokens`` (an upper bound on the
answer) overestimated a run against an HTTP endpoint about nine times (127 s planned, 14 s taken). Every finished
stage's manifest (``<store>/<run>/stages/<stage>/manifest.json``) keeps what its shards did per model
(:class:`~punchline.data.units.ModelUsage`: its answered units' latency, first attempt to accepted answer, retries
included), and the run's record keeps its config, which says where each model was called. So the latest runs of this
runs folder, of any pipeline, give each endpoint and model its mean seconds per answered unit; ``call_time.py``
uses it where one is measured, a default per provider kind where none is.

An endpoint is the provider's ``kind``, its ``base_url`` and the model id: the same model behind another URL (a
local server, a hosted API) is another endpoint, and a provider's name in the config does not matter. The
simulated provider (``base_url = "simulated"``) is not measured: its ``[simulator]`` knobs say its latency.
Only a local store is read (a remote one would cost requests per run); a run whose files are unreadable is
skipped.
"""

from __future__ import annotations

import contextlib
import tomllib
from pathlib import Path

import msgspec

from punchline.cluster.config import SIMULATED
from punchline.cluster.records.run_record import readable_records
from punchline.data.provider_settings import ProviderSettings
from punchline.data.storage.run_layout import RunLayout
from punchline.data.units import ModelUsage, StageManifest

RUNS_READ = 5  # the latest runs (by start) whose stages' latencies are pooled
MIN_UNITS = 5  # an endpoint's mean from fewer answered units is not taken: a few calls say little

Endpoint = tuple[str, str, str]  # (provider kind, base_url, model id)


class Latency(msgspec.Struct, frozen=True, kw_only=True):
    """One endpoint's measured mean seconds per answered unit, over ``units`` units of the latest runs."""

    unit_s: float
    units: int
    run_id: str  # the latest run that measured it


def endpoint(settings: ProviderSettings, model_id: str) -> Endpoint:
    return (settings.kind, (settings.base_url or "").rstrip("/"), model_id)


_manifest = msgspec.json.Decoder(StageManifest)


def measured_latencies(runs_dir: str | Path) -> dict[Endpoint, Latency]:
    """Each real endpoint's mean seconds per answered unit, pooled over the :data:`RUNS_READ` latest runs under
    ``runs_dir`` (their finished stages' manifests); an endpoint with fewer than :data:`MIN_UNITS` is left out."""
    sums: dict[Endpoint, list[float]] = {}  # endpoint -> [seconds, units]
    latest: dict[Endpoint, str] = {}
    for run_id, store, stages, providers in _latest_runs(Path(runs_dir)):
        for stage in stages:
            usage = stage_usage(store, run_id, stage)
            for model_id, used in usage.items():
                answered = sum(used.latency_counts)
                if not answered:
                    continue
                for settings in providers:
                    if settings.base_url == SIMULATED or not any(m.id == model_id for m in settings.models.values()):
                        continue
                    key = endpoint(settings, model_id)
                    pooled = sums.setdefault(key, [0.0, 0.0])
                    pooled[0] += used.latency_sum_s
                    pooled[1] += answered
                    latest.setdefault(key, run_id)
    return {
        key: Latency(unit_s=seconds / units, units=int(units), run_id=latest[key])
        for key, (seconds, units) in sums.items()
        if units >= MIN_UNITS
    }


def _latest_runs(root: Path) -> list[tuple[str, Path, list[str], list[ProviderSettings]]]:
    """The latest runs with a local store: their id, store, stages and providers (as their config said)."""
    found: list[tuple[float, str, Path, list[str], list[ProviderSettings]]] = []
    for rec in readable_records(root):
        if "://" in rec.services.store_url:
            continue
        providers = run_providers(rec.config_toml)
        if providers:
            found.append((rec.created_at, rec.run_id, Path(rec.services.store_url), rec.stages, providers))
    found.sort(key=lambda run: run[0], reverse=True)
    return [(run_id, store, stages, providers) for _, run_id, store, stages, providers in found[:RUNS_READ]]


def run_providers(config_toml: str) -> list[ProviderSettings]:
    """The ``[providers.*]`` tables of a run's config (none when it no longer decodes)."""
    try:
        tables = tomllib.loads(config_toml).get("providers", {})
        return list(msgspec.convert(tables, dict[str, ProviderSettings]).values())
    except (tomllib.TOMLDecodeError, msgspec.ValidationError, AttributeError):
        return []


def stage_usage(store: Path, run_id: str, stage: str) -> dict[str, ModelUsage]:
    """A finished stage's usage per model id, from its manifest in a local store (empty: not finished, or written
    before it was kept)."""
    with contextlib.suppress(OSError, msgspec.DecodeError):
        manifest = _manifest.decode((store / RunLayout(run_id).manifest(stage)).read_bytes())
        if manifest.usage is not None:
            return dict(manifest.usage.models)
    return {}
