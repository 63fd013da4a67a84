"""Which :class:`~punchline.cluster.pipeline.Pipeline` a config's ``[run] pipeline`` names.

Three places, in this order: ``"package.module:Name"`` (a user's own code on ``sys.path``, or beside
the config: a project folder holding its config and its package runs without installing), a built-in
name, an entry point of the ``punchline.pipelines`` group (an installed plug-in package). Built-ins are
named here as ``module:Name`` strings and imported only when asked for, so the config loader can use
the registry without importing any pipeline (and without knowing one by name). A reference that
cannot be imported or is not a Pipeline (no ``name`` or no ``stages``) is one line naming it (ConfigError,
exit 2); every other member a plug-in leaves out has its default (:mod:`punchline.cluster.pipeline_base`).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from punchline.cluster.pipeline import PIPELINE_METHODS, Pipeline
from punchline.cluster.pipeline_base import NoSettings, WithDefaults, with_defaults
from punchline.data.errors import ConfigError
from punchline.data.plugins import PIPELINES

GROUP = PIPELINES.name  # the entry-point group a package declares its pipelines in (punchline's own too)
FIELD = "run.pipeline"


def _entry_points() -> dict[str, str]:
    """Installed plug-ins: entry-point name -> ``module:attr`` (read afresh: a test may add a dist-info)."""
    return PIPELINES.targets()


def _load(ref: str, file: str | None) -> object:
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"pipeline {ref!r} is not 'package.module:Name'", file=file, field=FIELD)
    try:
        _find_beside(module_name, file)
        module = importlib.import_module(module_name)
    except Exception as exc:  # a plug-in's own import error, whatever it is, is one line naming it
        raise ConfigError(
            f"pipeline {ref!r} cannot be imported: {type(exc).__name__}: {exc}", file=file, field=FIELD
        ) from None
    try:
        value = getattr(module, attr)
    except AttributeError:
        raise ConfigError(f"pipeline {ref!r}: module {module_name!r} has no {attr!r}", file=file, field=FIELD) from None
    return value() if isinstance(value, type) else value  # a class with no arguments, or an instance


def beside_config(module_name: str, file: str | None) -> Path | None:
    """The config's folder when the top-level package ``module_name`` is not on ``sys.path`` but sits
    beside the config (``<folder>/<top>/`` or ``<folder>/<top>.py``); else None."""
    top = module_name.split(".")[0]
    if not file or importlib.util.find_spec(top) is not None:
        return None
    folder = Path(file).absolute().parent
    return folder if (folder / top).is_dir() or (folder / f"{top}.py").is_file() else None


def _find_beside(module_name: str, file: str | None) -> None:
    folder = beside_config(module_name, file)
    if folder is not None and str(folder) not in sys.path:
        sys.path.append(str(folder))  # after everything else: it never shadows an installed module


def check_pipeline(obj: object, ref: str, file: str | None = None) -> Pipeline:
    """``obj`` if it has everything :class:`Pipeline` asks for; an object with a ``name`` and ``stages`` gets
    the defaults of :class:`~punchline.cluster.pipeline_base.BasePipeline` for what it lacks; else one line
    naming ``ref``."""
    settings_type = getattr(obj, "settings_type", NoSettings)
    name = getattr(obj, "name", None)
    if not (
        isinstance(name, str)
        and callable(getattr(obj, "stages", None))
        and isinstance(settings_type, type)
        and issubclass(settings_type, msgspec.Struct)
    ):
        raise ConfigError(
            f"{ref!r} is not a Pipeline (want an object with a str `name` and a `stages(cfg)` method, and a "
            f"msgspec Struct `settings_type` if it has settings: see punchline.plugin.Pipeline)",
            file=file,
            field=FIELD,
        )
    pipeline: Pipeline = with_defaults(obj, PIPELINE_METHODS)
    own = getattr(obj, "headlines", None)
    if callable(own) and _takes_cfg_store_run_id(own):  # written before headlines took the stage context
        adapted = WithDefaults(obj, PIPELINE_METHODS)
        adapted.headlines = lambda ctx: own(ctx.cfg, ctx.store, ctx.run_id)  # type: ignore[method-assign]
        pipeline = adapted
    return pipeline


def _takes_cfg_store_run_id(method: Callable[..., object]) -> bool:
    """``headlines(cfg, store, run_id)``: the signature before ``headlines(ctx)``."""
    try:
        return len(inspect.signature(method).parameters) == 3
    except (TypeError, ValueError):
        return False


def resolve(ref: str, file: str | None = None) -> Pipeline:
    """The pipeline ``ref`` names (``[run] pipeline``); ``file`` is the config, for the error line."""
    if ":" in ref:
        target = ref
    else:
        installed = _entry_points()
        if ref not in installed:
            known = sorted(installed)
            raise ConfigError(
                f"unknown pipeline {ref!r}: known {known}, or give 'package.module:Name'", file=file, field=FIELD
            )
        target = installed[ref]
    return check_pipeline(_load(target, file), ref, file)


def available() -> list[str]:
    """Every pipeline name a config may use without a ``module:Name`` reference: every installed package's."""
    return sorted(_entry_points())


def shipped() -> list[str]:
    """The pipelines punchline itself installs (registered in its own entry points, like any plug-in's)."""
    return sorted(name for name, target in _entry_points().items() if target.startswith("punchline."))


def pipeline_of(cfg: Any) -> Pipeline:
    """The pipeline of a loaded :class:`~punchline.cluster.config.RunConfig`."""
    return resolve(cfg.run.pipeline, cfg.source or None)
