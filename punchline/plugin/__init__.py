"""Everything a pipeline plug-in imports, in one place: ``from punchline.plugin import ...``.

What is here is the public, stable surface for plug-in authors (docs/write-a-pipeline.md is its guide);
every other module of punchline is private and may change. In short:

* :class:`Pipeline`: subclass it, give ``name`` and ``stages(cfg)`` (and ``settings_type``): every other
  member the engine asks has a default derived from the settings' field types (:data:`Provider`,
  :data:`Model`, :data:`Models`, :data:`InputFile`, :data:`InputFiles`); override any of them.
* :class:`Settings`: a base for the settings Struct (unknown keys refused); ``Meta`` states ranges.
* :class:`Generate` and :class:`Judge`: rows x models x n samples -> parse -> judge, each with a ``reduce``
  of your own; or write a :class:`Stage` (``name``, ``plan(ctx)`` -> :class:`UnitSpec`s of
  :class:`ProviderRequest`s, ``reduce(ctx, results)`` over :class:`UnitResult`s -> artifact names).
* :func:`write_csv`, :func:`bar_plot`, :func:`read_rows`: artifacts a reduce writes, byte-identical.
* Scores with their uncertainty (docs/metrics.md): :func:`outcomes` -> :func:`per_model` (:class:`Estimate`: a
  rate with its :func:`wilson` / :func:`clopper_pearson` interval, a mean with :func:`bootstrap_mean`'s),
  :func:`compare_models` (two models on the same items: :func:`mcnemar`, :func:`paired_bootstrap`), rows for
  :func:`write_csv` (:func:`estimate_rows`, :func:`comparison_rows`), figures as PNG and SVG
  (:func:`error_bars`, :func:`paired_differences`, :func:`write_figure`); an undefined value is ``None``, shown
  ``n/a``.
* :class:`InputError` / :class:`ConfigError`: raise them for bad input (one line naming file, record and field,
  exit 2); anything else a stage raises is reported as the plug-in's error, naming its ``file:line``.
* :func:`run_simulated`: a plug-in's own tests run it against the simulated provider, in-process; a pipeline's
  optional ``simulate(request: SimRequest) -> str | None`` gives that provider's answers to its own prompts.

A provider kind (an API punchline does not speak yet) is one module too, registered as a ``punchline.providers``
entry point: a :class:`ProviderKind` naming its :class:`ProviderClient` class (``complete`` a
:class:`ProviderRequest` into a :class:`ProviderResponse`, failing with :class:`RetryableProviderError` or
:class:`FatalProviderError`; :func:`status_error` maps an HTTP status to one), and its offline twin, a
:class:`SimulatedWire` (how the simulated provider reads its requests into a :class:`WireRequest` and writes its
answers and errors) or the name of the kind whose wire it reuses. ``ProviderKind(..., retryable=...)`` says
which :class:`ProviderError` of its is retried (default :func:`retried_by_default`: the error's class).
``ProviderClient`` is :class:`punchline.workers.provider.Provider` (here ``Provider`` is the settings field type).
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from punchline.cluster.config import RunConfig, resolve_path
from punchline.cluster.pipeline import Stage, StageContext, repeated
from punchline.cluster.pipeline_base import BasePipeline as Pipeline
from punchline.cluster.pipeline_base import (
    InputFile,
    InputFiles,
    Model,
    Models,
    NoSettings,
    Provider,
    Settings,
    resolve_model,
)
from punchline.cluster.result_sections import Link, ResultSection, ResultsView
from punchline.data.errors import (
    ConfigError,
    FatalProviderError,
    InputError,
    ProviderError,
    PunchlineError,
    RetryableProviderError,
)
from punchline.data.metrics.intervals import Interval, bootstrap_mean, clopper_pearson, newcombe_difference, wilson
from punchline.data.metrics.paired import McNemar, PairedComparison, compare, compare_models, mcnemar, paired_bootstrap
from punchline.data.metrics.plots import error_bars, paired_differences, write_figure
from punchline.data.metrics.tables import (
    NA,
    Estimate,
    comparison_rows,
    estimate,
    estimate_rows,
    markdown_table,
    mean,
    outcomes,
    per_model,
    proportion,
    shown,
)
from punchline.data.provider_settings import Mode, ProviderSettings
from punchline.data.requests import Message, ProviderRequest, ProviderResponse
from punchline.data.simulator import SimRequest
from punchline.data.store import Store
from punchline.data.units import UnitResult, UnitSpec
from punchline.plugin.artifacts import bar_plot, write_csv
from punchline.plugin.stages import Generate, Judge, Rows, read_rows
from punchline.plugin.testing import SimulatedRun, run_simulated, simulated_providers
from punchline.workers.calls.retry import retried_by_default
from punchline.workers.fake.wire import SimulatedWire, WireRequest
from punchline.workers.provider import Provider as ProviderClient
from punchline.workers.provider import ProviderKind
from punchline.workers.providers.base import status_error

__all__ = [
    "NA",
    "Annotated",
    "ConfigError",
    "Estimate",
    "FatalProviderError",
    "Generate",
    "InputError",
    "InputFile",
    "InputFiles",
    "Interval",
    "Judge",
    "Link",
    "McNemar",
    "Message",
    "Meta",
    "Mode",
    "Model",
    "Models",
    "NoSettings",
    "PairedComparison",
    "Pipeline",
    "Provider",
    "ProviderClient",
    "ProviderError",
    "ProviderKind",
    "ProviderRequest",
    "ProviderResponse",
    "ProviderSettings",
    "PunchlineError",
    "ResultSection",
    "ResultsView",
    "RetryableProviderError",
    "Rows",
    "RunConfig",
    "Settings",
    "SimRequest",
    "SimulatedRun",
    "SimulatedWire",
    "Stage",
    "StageContext",
    "Store",
    "UnitResult",
    "UnitSpec",
    "WireRequest",
    "bar_plot",
    "bootstrap_mean",
    "clopper_pearson",
    "compare",
    "compare_models",
    "comparison_rows",
    "error_bars",
    "estimate",
    "estimate_rows",
    "markdown_table",
    "mcnemar",
    "mean",
    "msgspec",
    "newcombe_difference",
    "outcomes",
    "paired_bootstrap",
    "paired_differences",
    "per_model",
    "proportion",
    "read_rows",
    "repeated",
    "resolve_model",
    "resolve_path",
    "retried_by_default",
    "run_simulated",
    "shown",
    "simulated_providers",
    "status_error",
    "wilson",
    "write_csv",
    "write_figure",
]
