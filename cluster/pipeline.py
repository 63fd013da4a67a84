"""What a pipeline is: a :class:`Pipeline` object, whose stages expand into units, shards of units
and reduce steps.

A stage's ``plan`` is a pure function of the config and earlier stages' artifacts, so a resumed
run (or another node) computes exactly the same units and the same shard boundaries; a stage's
``reduce`` is a pure function of its units' results, so artifacts are byte-identical whatever the
number of workers, the order of completion or the faults along the way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

import msgspec
import structlog

from punchline.cluster.run_config import RunConfig
from punchline.data.errors import PluginError, PunchlineError, code_line
from punchline.data.provider_settings import Mode
from punchline.data.requests import ProviderRequest
from punchline.data.simulator import FakeConfig
from punchline.data.storage.run_layout import RunLayout
from punchline.data.store import Store
from punchline.data.units import UnitResult, UnitSpec

AnswerParser = Callable[[str], tuple[dict[str, Any] | None, str | None]]
"""An answer's text -> (its parsed fields, or None; why it does not parse, or None): what the viewer shows."""


class StageContext:
    """What a stage may read and write: the config and the run's artifacts in the store."""

    def __init__(self, cfg: RunConfig, run_id: str, store: Store) -> None:
        self.cfg = cfg
        self.run_id = run_id
        self.store = store

    def artifact_key(self, name: str) -> str:
        return RunLayout(self.run_id).artifact(name)

    def write_artifact(self, name: str, data: bytes) -> None:
        self.store.put(self.artifact_key(name), data)

    def write_artifact_chunks(self, name: str, chunks: Iterable[bytes]) -> None:
        self.store.put_chunks(self.artifact_key(name), chunks)

    def read_artifact(self, name: str) -> bytes:
        raw = self.store.get(self.artifact_key(name))
        if raw is None:
            raise FileNotFoundError(f"artifact {name} of run {self.run_id} is missing from {self.store.url}")
        return raw

    def read_artifact_chunks(self, name: str) -> Iterator[bytes]:
        """The artifact a piece at a time (one too large to hold: a 10^6-row JSONL)."""
        chunks = self.store.get_chunks(self.artifact_key(name))
        if chunks is None:
            raise FileNotFoundError(f"artifact {name} of run {self.run_id} is missing from {self.store.url}")
        return chunks


class Stage(Protocol):
    """One step of a pipeline. Optional: ``warm_imports``, a tuple of the slow modules its ``reduce`` imports
    lazily (plotting, say); the driver imports them in the background while earlier stages' workers call
    (:class:`~punchline.cluster.run.local_worker.ForkWarmup`), so the reduce does not wait for them."""

    name: str

    def plan(self, ctx: StageContext) -> Iterable[UnitSpec]:
        """The stage's units in strictly increasing ``unit_id`` order (may be empty for a reduce-only stage);
        a generator keeps a large plan out of memory, a small stage may return ``in_unit_order(units)``."""
        ...

    def reduce(self, ctx: StageContext, results: Mapping[str, UnitResult]) -> list[str]:
        """Build the stage's artifacts from its results; returns the artifact names written."""
        ...


class Pipeline(Protocol):
    """One workload (a built-in or a user's own): everything the engine needs to know about it.

    The driver, the config loader, the planner and the commands ask this object and never branch on
    a pipeline's name, so a new workload is one module (a built-in in :mod:`punchline.cluster.registry`,
    an entry point in the ``punchline.pipelines`` group, or ``[run] pipeline = "package.module:Name"``).
    ``settings`` below is always an instance of ``settings_type``, decoded from the ``[<name>]`` table.
    A plug-in usually subclasses :class:`~punchline.cluster.pipeline_base.BasePipeline` (``punchline.plugin.Pipeline``),
    which gives every member but ``name`` and ``stages`` a default derived from its settings' field types.

    Optional, and asked by the simulated provider only (never by the engine): ``simulate(request: SimRequest) ->
    str | None``, the answer to a request of this pipeline's own (a pure function of ``request``, drawing from
    ``request.rng()``), or None for one it does not know (answered generically); the simulated provider finds it
    through the entry points. With it, ``simulate_knobs``: a msgspec Struct type, what the pipeline's
    ``[simulator.pipeline_knobs.<name>]`` table decodes into (``request.knobs``).

    Optional, and asked by the viewer only: ``answer_parsers(settings) -> Mapping[str, AnswerParser]``, per stage
    how its answers parse (the viewer shows the fields beside the text and filters on answers that do not parse);
    ``results(view: ResultsView) -> list[ResultSection]``, the run's headline results on its page, and
    ``artifact_results(view, artifact) -> list[ResultSection]``, what to show above one artifact's own rendering
    (:mod:`punchline.cluster.result_sections`: structured sections, never HTML, which the viewer escapes; a hook
    that raises is one line on the page).
    """

    name: str  # its registry key, its TOML table (``[<name>]``) and the start of its run ids
    settings_type: type[msgspec.Struct]  # forbid_unknown_fields, every field range-checked with msgspec.Meta

    def check_settings(self, settings: Any, source: str) -> None:
        """Checks across fields that msgspec.Meta cannot state (a rater named twice, ...), when the config
        is read: ConfigError naming ``source`` and the key path."""
        ...

    def provider_refs(self, settings: Any) -> list[tuple[str, str]]:
        """(key path, provider name) of every provider the settings name, so the loader can refuse an
        unconfigured one generically (``("<name>.<stage>.provider", "<provider>")``)."""
        ...

    def stage_mode(self, settings: Any, stage: str) -> Mode | None:
        """The ``mode`` the stage's own table sets (overrides its providers' mode); None when unset."""
        ...

    def input_paths(self, settings: Any) -> list[str]:
        """The data files the settings name, as written (``punchline submit`` ships the relative ones)."""
        ...

    def check_inputs(self, cfg: RunConfig) -> None:
        """Read the input files the way the stages will, so a bad one stops the run before any service
        starts: ConfigError or InputError (one line naming file, record and field; exit 2)."""
        ...

    def stages(self, cfg: RunConfig) -> list[Stage]:
        """The run's stages in order (which ones may depend on the settings)."""
        ...

    def estimate(self, cfg: RunConfig, stage: str) -> Iterable[UnitSpec]:
        """For ``punchline plan``: the most units ``stage`` can have, when its ``plan`` needs earlier
        artifacts that do not exist yet (the pipeline knows its fan-out and its prompt and answer sizes;
        the planner prices them). Empty for a stage without provider calls."""
        ...

    def headlines(self, ctx: StageContext) -> list[str]:
        """What a person wants to see first after a run (markdown), read from the run's artifacts
        (``ctx.read_artifact``; ``ctx.cfg``, ``ctx.store``, ``ctx.run_id``)."""
        ...

    def simulator_knobs(self, cfg: RunConfig, sim: FakeConfig) -> FakeConfig:
        """The offline simulated provider's knobs for this run (e.g. its own table of ``sim.pipeline_knobs`` given
        the answer key of the run's own items)."""
        ...


PIPELINE_METHODS = (
    "check_settings",
    "provider_refs",
    "stage_mode",
    "input_paths",
    "check_inputs",
    "stages",
    "estimate",
    "headlines",
    "simulator_knobs",
)  # what the registry demands of a plug-in, besides ``name`` and ``settings_type``


def repeated(request: ProviderRequest, n: int) -> list[UnitSpec]:
    """``n`` units of the same request (distinct sample slots, so none is a cache hit of another): an
    upper-bound estimate priced like one representative request."""
    return [UnitSpec(unit_id=str(i), request=msgspec.structs.replace(request, sample_slot=i)) for i in range(n)]


@contextlib.contextmanager
def pipeline_code(
    pipeline: str, stage: Stage, step: str, *, passing: tuple[type[Exception], ...] = ()
) -> Iterator[None]:
    """Around a call into a pipeline's own code (a stage's ``plan`` or ``reduce``, wherever the engine makes it):
    what it raises that is not ours becomes a :class:`PluginError` naming the pipeline, the stage and the line of
    the pipeline's code (the traceback goes to the log), not an internal error of punchline's. ``passing``: what
    the caller handles itself (the planner: a stage whose inputs an earlier stage makes)."""
    try:
        yield
    except (PunchlineError, KeyboardInterrupt):
        raise
    except Exception as exc:
        if isinstance(exc, passing):
            raise
        structlog.get_logger("punchline.pipeline").error(
            "pipeline_code_failed", pipeline=pipeline, stage=stage.name, step=step, exc_info=True
        )
        raise PluginError(
            pipeline=pipeline,
            stage=stage.name,
            step=step,
            where=code_line(exc, type(stage)),
            cause=f"{type(exc).__name__}: {exc}",
        ) from exc
