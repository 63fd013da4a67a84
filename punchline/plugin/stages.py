"""The common shape of an LLM study as two stages a plug-in composes: ``Generate`` (rows x models x n samples,
parsed) and ``Judge`` (a second model reads each answer), each with an optional ``reduce`` of its own.

They are the generic prompts pipeline's machinery (:mod:`punchline.cluster.stages.generate`: the same
Jinja2 templates, parsers, row loaders, units, cost columns and output files), given their settings as
arguments instead of a ``[prompts]`` table: a stage builds that table from its arguments, runs the built-in
stage over it, and keeps the artifacts under its own name (``<stage>.jsonl`` and ``<stage>.parquet``, the
input columns first, then the answer's), so two stages of one pipeline never share a file. A stage's
``reduce(ctx, rows)`` then gets those rows as dicts and writes whatever it wants (a table, a plot).

A bad argument is one line naming the stage and the key (``stage answer: parse.regex``), as a bad key of
a ``[prompts]`` table would be; a bad row names the file, the row and the column, before any call.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, cast

import msgspec
import structlog

from punchline.cluster.config import RunConfig
from punchline.cluster.pipeline import StageContext
from punchline.cluster.pipeline_base import default_provider, model_provider
from punchline.cluster.stages import generate as builtin
from punchline.cluster.stages.compiled import CompiledPrompts
from punchline.cluster.stages.settings import PromptsSettings
from punchline.data.errors import ConfigError, InputError, PluginError, PunchlineError, code_line
from punchline.data.storage.jsonio import validation_location
from punchline.data.units import UnitResult, UnitSpec
from punchline.notebook import parse_table

Rows = list[dict[str, Any]]
Reduce = Callable[[StageContext, Rows], Iterable[str] | None]  # the stage's rows -> the artifacts it wrote

_TABLE = "prompts"  # the built-in's table name, as its error lines say it


class _StageConfig(RunConfig):
    """The run's config as the built-in stage sees it: the stage's table as its settings, and the stage
    modes of the plug-in's own stages (the built-in asks by its stage names)."""

    real: Any = None
    stage_names: dict[str, str] = {}

    def stage_mode(self, stage: str) -> Any:
        return self.real.stage_mode(self.stage_names.get(stage, stage))


class _StageFiles(StageContext):
    """The run's context with the built-in's artifact names mapped to the plug-in stage's own."""

    def __init__(self, ctx: StageContext, cfg: RunConfig, names: Mapping[str, str]) -> None:
        super().__init__(cfg, ctx.run_id, ctx.store)
        self._names = dict(names)

    def artifact_key(self, name: str) -> str:
        return super().artifact_key(self._names.get(name, name))


@contextlib.contextmanager
def _named(renames: Mapping[str, str]) -> Iterator[None]:
    """The built-in's error lines name ``[prompts]`` keys: here they name the stages' own (``answer.top_p``,
    ``grade.parse.regex``), by the longest matching prefix of ``renames``."""
    try:
        yield
    except InputError as exc:
        raise type(exc)(
            _renamed(exc.detail, renames), file=exc.file, record=exc.record, field=_renamed(exc.field, renames)
        ) from None


def _renamed(text: Any, renames: Mapping[str, str]) -> Any:
    if not isinstance(text, str):
        return text
    text = text.replace(f"[{_TABLE}.judge] ", "").replace(f"[{_TABLE}] ", "")
    pattern = "|".join(re.escape(old) for old in sorted(renames, key=len, reverse=True))
    return re.sub(pattern, lambda m: renames[m.group(0)], text)


def read_rows(ctx: StageContext, stage: str) -> Rows:
    """A stage's output rows (``<stage>.jsonl``) as dicts: the input columns, then the answer's."""
    return [json.loads(line) for line in ctx.read_artifact(f"{stage}.jsonl").splitlines() if line.strip()]


class _Composed:
    """What Generate and Judge share: the table they build, the built-in stage they run, their reduce."""

    name: str
    _builtin: Any
    _reduce: Reduce | None

    def table(self, cfg: RunConfig) -> dict[str, Any]:
        raise NotImplementedError

    def _renames(self) -> dict[str, str]:
        return {f"{_TABLE}.": f"{self.name}."}

    def _names(self) -> dict[str, str]:
        return {builtin.OUTPUTS_JSONL: f"{self.name}.jsonl", builtin.OUTPUTS_PARQUET: f"{self.name}.parquet"}

    def config(self, cfg: RunConfig) -> RunConfig:
        """The run's config with this stage's table decoded as the built-in's settings."""
        with _named(self._renames()):
            try:
                settings = msgspec.convert(self.table(cfg), PromptsSettings)
            except msgspec.ValidationError as exc:
                record, key, detail = validation_location(exc)
                field = ".".join(k for k in (_TABLE, record, key) if k)
                raise ConfigError(detail, file=cfg.source or None, field=field) from None
            CompiledPrompts(settings, file=cfg.source)
        return _StageConfig(
            run=cfg.run,
            providers=cfg.providers,
            simulator=cfg.simulator,
            source=cfg.source,
            settings=settings,
            real=cfg,
            stage_names={self._builtin.name: self.name},
        )

    def _context(self, ctx: StageContext) -> StageContext:
        return _StageFiles(ctx, self.config(ctx.cfg), self._names())

    def plan(self, ctx: StageContext) -> Iterator[UnitSpec]:
        with _named(self._renames()):
            yield from self._builtin.plan(self._context(ctx))

    def reduce(self, ctx: StageContext, results: Mapping[str, UnitResult]) -> list[str]:
        with _named(self._renames()):
            self._builtin.reduce(self._context(ctx), results)
        written = [f"{self.name}.jsonl", f"{self.name}.parquet"]
        if self._reduce is not None:
            written += _own_reduce(self._reduce, ctx, self.name, read_rows(ctx, self.name))
        return written

    def check_inputs(self, cfg: RunConfig) -> None:
        """Every row loads and every row's messages render (the judge's too), before any call."""
        with _named(self._renames()):
            builtin.check_inputs(self.config(cfg))


def _own_reduce(fn: Reduce, ctx: StageContext, stage: str, rows: Rows) -> list[str]:
    """The plug-in's own reduce: what it raises is one line naming its ``file:line`` (not this module's)."""
    try:
        return list(fn(ctx, rows) or [])
    except PunchlineError:
        raise
    except Exception as exc:
        structlog.get_logger("punchline.pipeline").error(
            "pipeline_code_failed", pipeline=ctx.cfg.run.pipeline, stage=stage, step="reduce", exc_info=True
        )
        raise PluginError(
            pipeline=ctx.cfg.run.pipeline,
            stage=stage,
            step="reduce",
            where=code_line(exc, cast(type, fn)),  # a function's file is found as a class's is
            cause=f"{type(exc).__name__}: {exc}",
        ) from exc


def _no_mode(name: str, options: Mapping[str, Any]) -> None:
    """A stage's mode is the engine's to know, from the settings (``stage_mode``) or the provider: not an
    argument, which the engine could not see before it builds the stages."""
    if "mode" in options:
        raise ConfigError(
            "a stage's mode is not an argument: give the settings a [<pipeline>.<stage>] table with a mode field, "
            "or set the provider's mode",
            field=f"{name}.mode",
        )


def _provider(cfg: RunConfig, models: Sequence[str]) -> str:
    """The provider of the bare nicks: the settings' ``provider`` field, else the config's only provider."""
    named = default_provider(cfg.settings)
    if named is not None:
        return named
    if len(cfg.providers) == 1:
        return next(iter(cfg.providers))
    qualified = [p for p, _ in (model_provider(m, None) for m in models) if p is not None]
    if len(qualified) == len(models) and qualified:
        return qualified[0]
    raise ConfigError(
        f'a model names no provider and the config has {len(cfg.providers)}: write "provider:nick"',
        file=cfg.source or None,
        field=f"models {list(models)}",
    )


class Generate(_Composed):
    """Every row x model, ``n`` samples in one request; each answer parsed by ``parse``.

    ``rows``: a .jsonl, .csv or .parquet file (relative to the config). ``template``: the user message, a
    Jinja2 template over the row's columns (or ``messages``, a chat of ``{"role", "content"}``; ``system``).
    ``models``: ``"provider:nick"`` or nicks (of the settings' ``provider``, else of the only provider).
    ``parse``: a regex (its named groups), a JSON schema, a Pydantic model or a parse table. ``options``:
    any other key of the prompts pipeline's table (``temperature``, ``max_tokens``, ``seed``, ``stop``,
    ``top_p``, ``null``, ``id_field``, ``sampling``, ``max_request_chars``; a stage's ``mode`` comes from the
    settings, see :meth:`~punchline.cluster.pipeline_base.BasePipeline.stage_mode`)."""

    _builtin = builtin.GenerateStage()

    def __init__(
        self,
        rows: str,
        template: str | None = None,
        *,
        models: str | Sequence[str],
        n: int = 1,
        parse: Any = None,
        system: str | None = None,
        messages: Sequence[Mapping[str, str]] | None = None,
        name: str = "generate",
        reduce: Reduce | None = None,
        **options: Any,
    ) -> None:
        _no_mode(name, options)
        self.name = name
        self._reduce = reduce
        self.models = [models] if isinstance(models, str) else list(models)
        self._table: dict[str, Any] = {
            "data": rows,
            "models": self.models,
            "n": n,
            "prompt": template,
            "system": system,
            "messages": [dict(m) for m in messages] if messages is not None else None,
            "parse": parse_table(parse, f"{name}.parse"),
            **options,
        }

    def table(self, cfg: RunConfig) -> dict[str, Any]:
        table = {k: v for k, v in self._table.items() if v is not None}
        return {**table, "provider": _provider(cfg, self.models)}


class Judge(_Composed):
    """A model reads each answer of the ``of`` stage (one request per row x model x sample with an answer).

    Its templates see the row's columns plus ``response`` (the answer), ``parsed`` (its parsed fields),
    ``model`` and ``sample``. ``model``: as in :class:`Generate`. ``parse``: how the verdict becomes fields.
    ``where``: judge only the answers where this Jinja2 expression holds; ``fraction`` (drawn by
    ``fraction_seed``): judge that share. ``options``: ``temperature``, ``max_tokens``, ``seed``.
    Its rows are the ``of`` stage's, with the judge's columns added (``judge_text``, ``judge_parsed``...)."""

    _builtin = builtin.JudgeStage()

    def __init__(
        self,
        of: Generate,
        template: str | None = None,
        *,
        model: str,
        parse: Any = None,
        system: str | None = None,
        messages: Sequence[Mapping[str, str]] | None = None,
        name: str = "judge",
        reduce: Reduce | None = None,
        **options: Any,
    ) -> None:
        _no_mode(name, options)
        self.name = name
        self.of = of
        self.model = model
        self._reduce = reduce
        self._judge: dict[str, Any] = {
            "model": model,
            "prompt": template,
            "system": system,
            "messages": [dict(m) for m in messages] if messages is not None else None,
            "parse": parse_table(parse, f"{name}.parse"),
            **options,
        }

    def table(self, cfg: RunConfig) -> dict[str, Any]:
        judge = {k: v for k, v in self._judge.items() if v is not None}
        table = self.of.table(cfg)
        table["provider"] = _provider(cfg, [*self.of.models, self.model])
        return {**table, "judge": judge}

    def _renames(self) -> dict[str, str]:
        return {f"{_TABLE}.judge.": f"{self.name}.", f"{_TABLE}.": f"{self.of.name}."}

    def _names(self) -> dict[str, str]:
        return {**super()._names(), builtin.ANSWERS_JSONL: f"{self.of.name}.jsonl"}

    def estimate(self, cfg: RunConfig) -> list[UnitSpec]:
        """For ``punchline plan`` before any answer exists: one request per row x model x sample, each over
        a stand-in answer as long as the model may write."""
        with _named(self._renames()):
            return builtin.judge_upper_bound(self.config(cfg))
