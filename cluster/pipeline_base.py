"""Every :class:`~punchline.cluster.pipeline.Pipeline` member but ``name`` and ``stages``, derived: a plug-in's
base class (``punchline.plugin.Pipeline``).

The engine asks a pipeline nine things; most plug-ins would answer seven of them the same way, from their
settings. So the settings say what their fields are, by type: a :data:`Provider` field names a
``[providers.<name>]`` table, a :data:`Model` / :data:`Models` field a ``"provider:nick"`` (or a bare
``nick`` of the settings' ``provider`` field, else of the config's only provider), an :data:`InputFile` /
:data:`InputFiles` field a data file relative to the config. From those, :class:`BasePipeline` derives the
providers the loader checks, the files ``submit`` ships and the preflight reads, and a stage may add its
own ``check_inputs(cfg)`` and ``estimate(cfg)`` (called by the pipeline's defaults). A subclass overrides
any member it wants to answer differently; the engine sees one object either way and names no pipeline.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Annotated, Any, get_args

import msgspec

from punchline.cluster.pipeline import AnswerParser, Stage, StageContext
from punchline.cluster.result_sections import ResultSection, ResultsView
from punchline.cluster.run_config import RunConfig, resolve_path
from punchline.data.errors import ConfigError, InputError
from punchline.data.provider_settings import Mode
from punchline.data.simulator import FakeConfig, SimRequest
from punchline.data.storage.run_layout import RunLayout
from punchline.data.units import StageManifest, UnitSpec

_KIND = "punchline"  # the key in msgspec.Meta(extra=...) that marks what a settings field is
_NAME = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]

Provider = Annotated[
    _NAME, msgspec.Meta(description="a provider's name (its [providers.<name>] table)", extra={_KIND: "provider"})
]
Model = Annotated[
    _NAME,
    msgspec.Meta(
        description='a model: "provider:nick", or a nick of the provider field (else of the only provider)',
        extra={_KIND: "model"},
    ),
]
Models = Annotated[list[Model], msgspec.Meta(min_length=1, max_length=1000, description="models (see Model)")]
InputFile = Annotated[
    _NAME, msgspec.Meta(description="a data file, relative to the config file", extra={_KIND: "input"})
]
InputFiles = Annotated[list[InputFile], msgspec.Meta(max_length=10_000, description="data files (see InputFile)")]


class Settings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A base for a plug-in's settings: unknown keys are refused (a typo names its key), fields are keywords."""


class NoSettings(Settings):
    """The settings of a pipeline that declares none: its ``[<name>]`` table must be empty."""


def _marked(ti: Any) -> str | None:
    """The kind a field's type is marked with (provider, model, input), through Optional and Annotated."""
    if isinstance(ti, msgspec.inspect.UnionType):
        kinds = {_marked(t) for t in ti.types} - {None}
        return kinds.pop() if len(kinds) == 1 else None
    extra = getattr(ti, "extra", None)
    return extra.get(_KIND) if isinstance(extra, dict) else None


def marked_values(settings: Any, prefix: str) -> Iterator[tuple[str, str, str]]:
    """``(key path, kind, value)`` of every marked field of ``settings`` (nested Structs, lists and dicts of
    them included), e.g. ``("mc.models", "model", "sim:small")``."""
    yield from _walk(msgspec.inspect.type_info(type(settings)), settings, prefix)


def _walk(ti: Any, value: Any, path: str) -> Iterator[tuple[str, str, str]]:
    if value is None:
        return
    kind = _marked(ti)
    if kind is not None and isinstance(value, str):
        yield path, kind, value
        return
    if isinstance(ti, msgspec.inspect.Metadata):  # Annotated[..., Meta(...)] without a mark: what it wraps
        yield from _walk(ti.type, value, path)
        return
    if isinstance(ti, msgspec.inspect.UnionType):
        for t in ti.types:
            if not isinstance(t, msgspec.inspect.NoneType):
                yield from _walk(t, value, path)
        return
    if isinstance(ti, msgspec.inspect.StructType) and isinstance(value, msgspec.Struct):
        for f in ti.fields:
            yield from _walk(f.type, getattr(value, f.name), f"{path}.{f.encode_name}")
    elif isinstance(ti, (msgspec.inspect.ListType, msgspec.inspect.TupleType, msgspec.inspect.VarTupleType)):
        item = getattr(ti, "item_type", None)
        for i, v in enumerate(value):
            yield from _walk(item, v, f"{path}[{i}]")
    elif isinstance(ti, msgspec.inspect.DictType):
        for k, v in value.items():
            yield from _walk(ti.value_type, v, f"{path}.{k}")


def model_provider(entry: str, default: str | None) -> tuple[str | None, str]:
    """``"provider:nick"`` -> (provider, nick); a bare ``nick`` -> (``default``, nick)."""
    provider, sep, nick = entry.partition(":")
    return (provider, nick) if sep else (default, entry)


def default_provider(settings: Any) -> str | None:
    """The provider a bare model nick belongs to: the settings' top-level ``provider`` field, if any."""
    value = getattr(settings, "provider", None)
    return value if isinstance(value, str) and value else None


def resolve_model(cfg: RunConfig, entry: str) -> tuple[str, str]:
    """``(provider, model id)`` of a :data:`Model` value, by the rule above (the config's only provider
    when the settings have no ``provider``): a ConfigError names the providers when it is ambiguous."""
    provider, nick = model_provider(entry, default_provider(cfg.settings))
    if provider is None:
        if len(cfg.providers) != 1:
            raise ConfigError(
                f'model {entry!r} names no provider and the config has {len(cfg.providers)}: write "provider:{entry}"',
                file=cfg.source or None,
            )
        provider = next(iter(cfg.providers))
    return provider, cfg.provider(provider).model_id(nick)


class BasePipeline:
    """A pipeline that gives its ``name`` and ``stages``; every other member has a default (see the module).

    ``settings_type`` defaults to :class:`NoSettings` (an empty ``[<name>]`` table)."""

    name: str
    settings_type: type[msgspec.Struct] = NoSettings

    def stages(self, cfg: RunConfig) -> list[Stage]:
        raise NotImplementedError(f"pipeline {type(self).__name__} must define stages(cfg)")

    def check_settings(self, settings: Any, source: str) -> None:
        """Nothing beyond the field ranges msgspec.Meta states (override for checks across fields)."""

    def provider_refs(self, settings: Any) -> list[tuple[str, str]]:
        """Every :data:`Provider` field, and the provider of every :data:`Model` field that names one."""
        default = default_provider(settings)
        refs = []
        for path, kind, value in marked_values(settings, self.name):
            provider = value if kind == "provider" else model_provider(value, default)[0] if kind == "model" else None
            if provider is not None:
                refs.append((path, provider))
        return refs

    def stage_mode(self, settings: Any, stage: str) -> Mode | None:
        """A ``mode`` field in the stage's own sub-table (``[<name>.<stage>] mode``), else None."""
        mode = getattr(getattr(settings, stage, None), "mode", None)
        return mode if mode in get_args(Mode) else None

    def input_paths(self, settings: Any) -> list[str]:
        """Every :data:`InputFile` field's value, as written."""
        return [value for _, kind, value in marked_values(settings, self.name) if kind == "input"]

    def check_inputs(self, cfg: RunConfig) -> None:
        """Every input file is readable, then every stage's own ``check_inputs(cfg)`` (when it has one)."""
        for path, kind, value in marked_values(cfg.settings, self.name):
            if kind != "input":
                continue
            p = resolve_path(cfg, value)
            if not p.is_file():
                raise InputError("no such file (relative paths are relative to the config)", file=str(p), field=path)
        for stage in self.stages(cfg):
            check = getattr(stage, "check_inputs", None)
            if callable(check):
                check(cfg)

    def estimate(self, cfg: RunConfig, stage: str) -> Iterable[UnitSpec]:
        """The stage's own ``estimate(cfg)`` when it has one (a stage planned from earlier artifacts); else none."""
        for s in self.stages(cfg):
            own = getattr(s, "estimate", None)
            if s.name == stage and callable(own):
                return list(own(cfg))
        return []

    def headlines(self, ctx: StageContext) -> list[str]:
        """Each finished stage's artifacts, one line a stage."""
        out = []
        for stage in self.stages(ctx.cfg):
            raw = ctx.store.get(RunLayout(ctx.run_id).manifest(stage.name))
            if raw is not None:
                artifacts = msgspec.json.decode(raw, type=StageManifest).artifacts
                out.append(f"**{stage.name}**: {', '.join(artifacts) or 'no artifacts'}")
        return out

    def simulator_knobs(self, cfg: RunConfig, sim: FakeConfig) -> FakeConfig:
        """The simulated provider as configured; a run's pipeline named by ``package.module:Name`` (not installed) is
        added to the pipelines it asks for their answers (:meth:`simulate`). An override should call this."""
        return own_simulator(cfg, sim)

    def simulate(self, request: SimRequest) -> str | None:
        """No simulated answers of its own: the simulated provider answers its requests generically."""
        return None

    def answer_parsers(self, settings: Any) -> Mapping[str, AnswerParser]:
        """No parsed answers to show: the viewer shows a stage's answers as text."""
        return {}

    def results(self, view: ResultsView) -> list[ResultSection]:
        """No results of its own: the run's page shows its artifacts and plots only."""
        return []

    def artifact_results(self, view: ResultsView, artifact: str) -> list[ResultSection]:
        """Nothing above an artifact: the viewer shows it as it shows any file of its type."""
        return []


def own_simulator(cfg: RunConfig, sim: FakeConfig) -> FakeConfig:
    """``sim`` with the run's own pipeline among the ones the simulated provider asks, when the config names it by
    ``package.module:Name`` (an installed pipeline, named by its entry point, is asked anyway)."""
    ref = cfg.run.pipeline
    if ":" not in ref or ref in sim.simulators:
        return sim
    return msgspec.structs.replace(sim, simulators=[ref, *sim.simulators])


OPTIONAL_METHODS = ("simulate", "answer_parsers", "results", "artifact_results")  # not asked by the engine


class WithDefaults(BasePipeline):
    """A pipeline object that is no :class:`BasePipeline` but has a ``name`` and ``stages`` (and maybe more):
    its own members, and the defaults for the ones it lacks. The registry wraps such an object in one."""

    def __init__(self, obj: Any, methods: Iterable[str]) -> None:
        self.wrapped = obj
        self.name = obj.name
        self.settings_type = getattr(obj, "settings_type", NoSettings)
        if isinstance(getattr(obj, "simulate_knobs", None), type):
            self.simulate_knobs = obj.simulate_knobs  # what its [simulator.pipeline_knobs.<name>] table decodes into
        # asked by the simulated provider (simulate) and the viewer (the rest), not by the engine
        for method in (*methods, *OPTIONAL_METHODS):
            own = getattr(obj, method, None)
            if callable(own):
                setattr(self, method, own)  # the object's own answer shadows the default


def with_defaults(obj: Any, methods: Iterable[str]) -> Any:
    """``obj`` itself when it has every one of ``methods``, else ``obj`` with the defaults for the rest."""
    methods = list(methods)
    if all(callable(getattr(obj, m, None)) for m in methods) and hasattr(obj, "settings_type"):
        return obj
    return WithDefaults(obj, methods)
