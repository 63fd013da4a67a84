"""Testing a plug-in: run it against punchline's simulated provider, in this process, in a few seconds.

``run_simulated(MyPipeline(), {...settings...}, tmp_dir=tmp_path)`` is a whole run on the engine (the same
one as ``punchline run``: shards, the response cache, resume), its providers simulated (``base_url =
"simulated"``: answers drawn from each request, no network, no key) unless ``providers`` says otherwise.
The simulated providers are derived from the settings: every provider a :data:`Model` field names (a bare
nick's is ``sim``, or the settings' ``provider``) with every model named, at $0. The result has the run's
record, its artifacts and how many calls it paid, so a test can assert that a second run pays none.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import msgspec

from punchline.api import run
from punchline.cluster.pipeline_base import default_provider, marked_values, model_provider
from punchline.cluster.run.driver import RunRecord
from punchline.data.errors import PunchlineError
from punchline.data.storage.run_layout import RunLayout
from punchline.data.stores import open_store
from punchline.notebook import content_id

SIMULATED_PROVIDER = "sim"  # the provider of bare model nicks when the settings name none


class SimulatedRun(msgspec.Struct, kw_only=True):
    """A finished (or failed) run: its record, where its artifacts are, and what it paid."""

    record: RunRecord
    calls: int  # provider requests paid (a cache hit is not one)
    cache_hits: int

    @property
    def run_id(self) -> str:
        return self.record.run_id

    @property
    def artifacts(self) -> list[str]:
        return self.record.artifacts

    def artifact(self, name: str) -> bytes:
        raw = open_store(self.record.services.store_url).get(RunLayout(self.record.run_id).artifact(name))
        if raw is None:
            raise PunchlineError(f"run {self.record.run_id} has no artifact {name!r} (it has {self.artifacts})")
        return raw

    def rows(self, name: str) -> list[dict[str, Any]]:
        """A JSONL artifact's rows (a stage's ``<stage>.jsonl``) as dicts."""
        return [json.loads(line) for line in self.artifact(name).splitlines() if line.strip()]


def simulated_providers(settings: Any, prefix: str = "settings") -> dict[str, Any]:
    """``[providers.<name>]`` tables of simulated providers for every provider and model the settings name."""
    default = default_provider(settings) or SIMULATED_PROVIDER
    tables: dict[str, Any] = {}
    for _, kind, value in marked_values(settings, prefix):
        if kind == "provider":
            tables.setdefault(value, {"kind": "openai", "base_url": "simulated", "models": {}})
        elif kind == "model":
            provider, nick = model_provider(value, default)
            table = tables.setdefault(provider or default, {"kind": "openai", "base_url": "simulated", "models": {}})
            table["models"][nick] = {"id": nick, "input_usd_per_mtok": 0.0, "output_usd_per_mtok": 0.0}
    return tables or {SIMULATED_PROVIDER: {"kind": "openai", "base_url": "simulated", "models": {}}}


def _content_id(name: str, settings: Any, providers: dict[str, Any]) -> str:
    """The run id of these settings, providers and input files' content (a relative path is the working
    folder's, as the engine reads it): the same again is the same run, an edited input file a new one."""
    parts = [msgspec.json.encode(settings).decode(), msgspec.json.encode(providers, order="sorted").decode()]
    for _, kind, value in marked_values(settings, name):
        path = Path(value).expanduser()
        if kind == "input" and path.is_file():
            parts.append(hashlib.sha256(path.read_bytes()).hexdigest())
    return content_id(name, *parts)


def run_simulated(
    pipeline: Any,
    settings: Any = None,
    *,
    tmp_dir: str | os.PathLike[str],
    providers: dict[str, Any] | None = None,
    run_id: str | None = None,
) -> SimulatedRun:
    """Run ``pipeline`` (a pipeline object with its ``settings``: its ``settings_type`` or a dict shaped like
    its table; or the path of a config file whose providers say ``base_url = "simulated"``) under
    ``tmp_dir``, in this process. The same call again returns the same run (its run id is a hash of the
    settings, the providers and the input files' content); pass another ``run_id`` to run it afresh: it
    finds every answer in the response cache (0 calls)."""
    runs = str(Path(tmp_dir) / "runs")
    if isinstance(pipeline, (str, os.PathLike)):
        record = run(pipeline, run_id=run_id, runs_dir=runs, offline=False)
    else:
        if settings is None:
            raise PunchlineError("run_simulated(pipeline, settings): a pipeline object needs its settings")
        typed = settings if isinstance(settings, msgspec.Struct) else msgspec.convert(settings, pipeline.settings_type)
        tables = providers if providers is not None else simulated_providers(typed, pipeline.name)
        rid = run_id or _content_id(pipeline.name, typed, tables)
        record = run(pipeline, typed, providers=tables, runs_dir=runs, run_id=rid, offline=False)
    counters = record.counters.values()
    return SimulatedRun(
        record=record,
        calls=sum(c.provider_requests for c in counters),
        cache_hits=sum(c.cache_hits for c in counters),
    )
