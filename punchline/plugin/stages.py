"""The common shape of an LLM study as two stages a plug-in composes: ``Generate`` (rows x models x n samples,
parsed) and ``Judge`` (a second model reads each answer), each with an optional ``reduce`` of its own.

They are the generic prompts pipeline's machinery (:mod:`punchline.cluster.stages.generate`: the same
Jinja2 templates, parsers, row loaders, units, cost columns and output files), given their settings as
arguments instead of a ``[prompts]`` table: a stage builds that table from its arguments, runs the built-in
stage over it, and keeps the artifacts under its own name (``<stage>.jsonl`` and ``<stage>.parquet``, the
input columns first, then the answer's), so two stages of one pipeline never share a file. A stage's
``reduce(ctx, rows)`` then gets those rows as dicts and writes whatever it wants (a table, a plot).

A bad argument is one line naming the line of the plug-in's code that built the stage, the stage and the
argument (``mc/pipeline.py:12: stage 'answer': Generate() got an unknown keyword 'max_token' (did you mean
'max_tokens'?)``), raised as the stage is built: its keywords are checked against the settings the stage fills in
and every value against the same msgspec types a ``[prompts]`` table is decoded into
(:mod:`punchline.cluster.stages.settings`, one place spells the rules), then its templates and parsers compiled. A bad
row names the file, the row and the column, before any call.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, cast

import msgspec
import structlog

from punchline.cluster.config import RunConfig
from punchline.cluster.pipeline import StageContext
from punchline.cluster.pipeline_base import default_provider, model_provider
from punchline.cluster.stages import generate as builtin
from punchline.cluster.stages import outputs
from punchline.cluster.stages.compiled import CompiledPrompts
from punchline.cluster.stages.settings import JudgeSettings, PromptsSettings
from punchline.data.answer_format import StageAnswers
from punchline.data.errors import ConfigError, InputError, PluginError, PunchlineError, code_line
from punchline.data.storage.jsonio import validation_location
from punchline.data.units import UnitResult, UnitSpec
from punchline.notebook import parse_table

Rows = list[dict[str, Any]]
Reduce = Callable[[StageContext, Rows], Iterable[str] | None]  # the stage's rows -> the artifacts it wrote

_TABLE = "prompts"  # the built-in's table name, as its error lines say it
_HERE = os.path.realpath(__file__)
# the settings' provider is the config's, known only at run time: a stand-in while the arguments are checked
_STAND_IN_PROVIDER = "provider"


class StageArgumentError(ConfigError):
    """A stage built in Python was given a bad argument. The mistake is in the plug-in's code, not in the config, so
    the line names the file and line that built the stage, then the stage: ``mc/pipeline.py:12: stage 'answer':
    Generate() got an unknown keyword 'max_token' (did you mean 'max_tokens'?)`` (exit 2, as any bad input)."""

    def __init__(self, site: str, stage: str, message: str, *, field: str | None = None) -> None:
        super().__init__(message, file=site, record=f"stage {stage}", field=field)
        self.site = site
        self.stage = stage
        self.args = (f"{site}: stage {stage!r}: {message}",)


def _caller() -> str:
    """``file:line`` of the plug-in's code that built the stage: the first frame outside this module (relative to
    the working folder when it is inside it)."""
    frame: Any = sys._getframe(1)
    while frame is not None and os.path.realpath(frame.f_code.co_filename) == _HERE:
        frame = frame.f_back
    if frame is None:
        return "<unknown>"
    path = frame.f_code.co_filename
    with contextlib.suppress(ValueError):  # another drive (Windows): the path as it is
        relative = os.path.relpath(path)
        if not relative.startswith(os.pardir):
            path = relative
    return f"{path}:{frame.f_lineno}"


class _Arguments:
    """How one stage class's keyword arguments map onto its settings table: which keywords ``**options`` may
    carry (the settings' fields the constructor does not fill itself), and the argument each table key came from."""

    def __init__(self, cls: str, settings: type[msgspec.Struct], params: Sequence[str], filled: Mapping[str, str]):
        self.cls = cls
        self.params = list(params)  # the constructor's own keywords
        self.to_argument = {key: arg for arg, key in filled.items()}  # table key -> the argument it came from
        built = {*filled.values(), "mode"}  # a stage's mode is the engine's: check_keywords says so
        self.options = [f for f in msgspec.structs.fields(settings) if f.name not in built]

    @property
    def option_names(self) -> list[str]:
        return [f.name for f in self.options]

    def check_keywords(self, site: str, stage: str, options: Mapping[str, Any]) -> None:
        """Every ``**options`` keyword is a settings field; a typo gets the nearest keyword."""
        if "mode" in options:
            raise StageArgumentError(
                site,
                stage,
                f"{self.cls}() got mode=: a stage's mode is not an argument: give the settings a "
                "[<pipeline>.<stage>] table with a mode field, or set the provider's mode",
                field="mode",
            )
        known = [*self.params, *self.option_names]
        for key in options:
            if key in self.option_names:
                continue
            near = _HINTS.get(key) if _HINTS.get(key) in known else None
            near = near or next(iter(difflib.get_close_matches(key, known, n=1, cutoff=0.6)), None)
            hint = f" (did you mean {near!r}?)" if near else f" (it takes {', '.join(known)})"
            raise StageArgumentError(site, stage, f"{self.cls}() got an unknown keyword {key!r}{hint}", field=key)

    def argument(self, path: str) -> str:
        """The argument a settings path came from: ``prompt`` -> ``template``, ``data`` -> ``rows``."""
        head, dot, rest = path.partition(".")
        return self.to_argument.get(head, head) + dot + rest

    def value_error(self, site: str, stage: str, exc: msgspec.ValidationError, table: Mapping[str, Any]) -> Exception:
        """A value the settings' types refuse, as the argument the user wrote: ``Generate(max_tokens=-1): ...``."""
        record, key, detail = validation_location(exc)
        path = ".".join(k for k in (record, key) if k)
        argument = self.argument(path) if path else ""
        if path and "." not in path and path in table:
            shown = f"{self.cls}({argument}={table[path]!r})"
        else:
            shown = f"{self.cls}() argument {argument}" if argument else f"{self.cls}()"
        return StageArgumentError(site, stage, f"{shown}: {detail}", field=argument or None)

    def compile_error(self, site: str, stage: str, exc: InputError, prefix: str) -> Exception:
        """A template, regex or schema that does not compile (the built-in names it ``prompts.parse.regex``)."""
        field = exc.field if isinstance(exc.field, str) else ""
        path = self.argument(field[len(prefix) :]) if field.startswith(prefix) else field
        shown = f"{self.cls}() argument {path}" if path else f"{self.cls}()"
        return StageArgumentError(site, stage, f"{shown}: {exc.detail}", field=path or None)


# a keyword of the [prompts] table's spelling given to the stage, whose argument is spelled otherwise
_HINTS = {"prompt": "template", "data": "rows", "model": "models", "models": "model"}


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
    except StageArgumentError:
        raise
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
        return {outputs.OUTPUTS_JSONL: f"{self.name}.jsonl", outputs.OUTPUTS_PARQUET: f"{self.name}.parquet"}

    def config(self, cfg: RunConfig) -> RunConfig:
        """The run's config with this stage's table decoded as the built-in's settings (checked as the stage was
        built: only the provider is new here, and it comes from the config)."""
        settings = self._checked(self.table(cfg))
        return _StageConfig(
            run=cfg.run,
            providers=cfg.providers,
            simulator=cfg.simulator,
            source=cfg.source,
            settings=settings,
            real=cfg,
            stage_names={self._builtin.name: self.name},
        )

    def _checked(self, table: dict[str, Any]) -> PromptsSettings:
        """The table decoded as the built-in's settings and compiled (templates, parsers): a mistake is one line
        naming the line that built this stage (:class:`StageArgumentError`)."""
        try:
            settings = msgspec.convert(table, PromptsSettings)
        except msgspec.ValidationError as exc:
            raise self._value_error(exc, table) from None
        try:
            CompiledPrompts(settings)
        except InputError as exc:
            raise self._compile_error(exc) from None
        return settings

    def _value_error(self, exc: msgspec.ValidationError, table: Mapping[str, Any]) -> Exception:
        raise NotImplementedError

    def _compile_error(self, exc: InputError) -> Exception:
        raise NotImplementedError

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

    def simulated_answers(self, cfg: RunConfig) -> list[StageAnswers]:
        """What the stage's answers parse into, for the simulated provider (the built-in stage's, under its name)."""
        with _named(self._renames()):
            return self._builtin.simulated_answers(self.config(cfg), self.name)


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


def _parse(site: str, stage: str, cls: str, parse: Any) -> dict[str, Any] | None:
    """``parse=`` as a parse table (a regex, a JSON schema, a Pydantic model or the table itself)."""
    try:
        return parse_table(parse, "parse")
    except InputError as exc:
        raise StageArgumentError(site, stage, f"{cls}() argument parse: {exc.detail}", field="parse") from None


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
        self.site = _caller()
        self.name = name
        self._reduce = reduce
        _GENERATE.check_keywords(self.site, name, options)
        self.models = [models] if isinstance(models, str) else list(models)
        self._table: dict[str, Any] = {
            "data": rows,
            "models": self.models,
            "n": n,
            "prompt": template,
            "system": system,
            "messages": [dict(m) for m in messages] if messages is not None else None,
            "parse": _parse(self.site, name, "Generate", parse),
            **options,
        }
        self._checked({**self._own(), "provider": _STAND_IN_PROVIDER})

    def _own(self) -> dict[str, Any]:
        return {k: v for k, v in self._table.items() if v is not None}

    def _value_error(self, exc: msgspec.ValidationError, table: Mapping[str, Any]) -> Exception:
        return _GENERATE.value_error(self.site, self.name, exc, table)

    def _compile_error(self, exc: InputError) -> Exception:
        return _GENERATE.compile_error(self.site, self.name, exc, f"{_TABLE}.")

    def table(self, cfg: RunConfig) -> dict[str, Any]:
        return {**self._own(), "provider": _provider(cfg, self.models)}


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
        self.site = _caller()
        self.name = name
        self._reduce = reduce
        _JUDGE.check_keywords(self.site, name, options)
        if not isinstance(of, Generate):
            raise StageArgumentError(
                self.site,
                name,
                f"Judge(of=...) is a {type(of).__name__}: give the Generate stage it judges",
                field="of",
            )
        self.of = of
        self.model = model
        self._judge: dict[str, Any] = {
            "model": model,
            "prompt": template,
            "system": system,
            "messages": [dict(m) for m in messages] if messages is not None else None,
            "parse": _parse(self.site, name, "Judge", parse),
            **options,
        }
        self._checked({**self.of._own(), "provider": _STAND_IN_PROVIDER, "judge": self._own()})

    def _own(self) -> dict[str, Any]:
        return {k: v for k, v in self._judge.items() if v is not None}

    def _value_error(self, exc: msgspec.ValidationError, table: Mapping[str, Any]) -> Exception:
        record, _, _ = validation_location(exc)
        if record != "judge":  # the judged stage's own table: checked as it was built, so not expected here
            return self.of._value_error(exc, table)
        inner = msgspec.ValidationError(str(exc).replace("at `$.judge", "at `$", 1))
        return _JUDGE.value_error(self.site, self.name, inner, self._judge)

    def _compile_error(self, exc: InputError) -> Exception:
        if isinstance(exc.field, str) and not exc.field.startswith(f"{_TABLE}.judge."):
            return self.of._compile_error(exc)
        return _JUDGE.compile_error(self.site, self.name, exc, f"{_TABLE}.judge.")

    def table(self, cfg: RunConfig) -> dict[str, Any]:
        table = self.of.table(cfg)
        table["provider"] = _provider(cfg, [*self.of.models, self.model])
        return {**table, "judge": self._own()}

    def _renames(self) -> dict[str, str]:
        return {f"{_TABLE}.judge.": f"{self.name}.", f"{_TABLE}.": f"{self.of.name}."}

    def _names(self) -> dict[str, str]:
        return {**super()._names(), outputs.ANSWERS_JSONL: f"{self.of.name}.jsonl"}

    def estimate(self, cfg: RunConfig) -> list[UnitSpec]:
        """For ``punchline plan`` before any answer exists: one request per row x model x sample, each over
        a stand-in answer as long as the model may write."""
        with _named(self._renames()):
            return builtin.judge_upper_bound(self.config(cfg))


# what each stage's keywords fill in its settings table (argument -> table key); the rest are ``**options``
_GENERATE = _Arguments(
    "Generate",
    PromptsSettings,
    ["rows", "template", "models", "n", "parse", "system", "messages", "name", "reduce"],
    {
        "rows": "data",
        "template": "prompt",
        "models": "models",
        "n": "n",
        "parse": "parse",
        "system": "system",
        "messages": "messages",
        "provider": "provider",  # the config's (the settings' provider field, or its only provider)
        "judge": "judge",  # a Judge stage of its own
    },
)
_JUDGE = _Arguments(
    "Judge",
    JudgeSettings,
    ["of", "template", "model", "parse", "system", "messages", "name", "reduce"],
    {"template": "prompt", "model": "model", "parse": "parse", "system": "system", "messages": "messages"},
)
