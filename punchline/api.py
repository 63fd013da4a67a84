"""The Python API, for notebooks and scripts: ``punchline.run(config)``, ``punchline.status(run_id)`` and
``punchline.prompts(data, template=..., models=...)``.

The same engine as ``punchline run``, with the same guarantees (exactly-once, resume by run id, the
response cache), called without a shell: keyword arguments are the command's flags, and the
environment fills in what they leave out (``PUNCHLINE_REDIS_URL``, ``PUNCHLINE_STORE``, ...). Nothing
is printed: the run's log goes to ``<runs_dir>/<run id>/log.jsonl``, bad input raises
:class:`~punchline.data.errors.ConfigError` / :class:`~punchline.data.errors.InputError`, a failing
service an :class:`~punchline.data.errors.InfraError`, a spent budget
:class:`~punchline.data.errors.BudgetExceeded`: all :class:`~punchline.data.errors.PunchlineError`.
The result is the run's :class:`~punchline.cluster.run.driver.RunRecord` (a msgspec Struct, also kept as
``run.json``): run id, state, artifacts, counters per stage, usage per (stage, model), failures.

Without a TOML file: ``punchline.run(pipeline, settings)`` runs a pipeline object with its settings, and
``punchline.prompts(...)`` runs the prompts pipeline over a DataFrame (or a list of dicts, a path, a
``datasets.Dataset``) and returns the user's frame with the answers beside it (its index, its columns,
the run named in ``attrs``). Both name the run by its content
(:mod:`punchline.notebook`), so running a cell again pays nothing and a killed kernel's run resumes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import structlog

from punchline.cluster.records.runs import load_run_record
from punchline.cluster.run.coordinator import ProgressFn
from punchline.cluster.run.driver import RunOptions, RunRecord
from punchline.cluster.run.driver import run as run_driver
from punchline.data.errors import PunchlineError
from punchline.data.settings import overlay
from punchline.data.storage.run_layout import RunLayout
from punchline.data.stores import open_store
from punchline.notebook import (
    NOTEBOOK_DIR,
    ProgressBar,
    content_id,
    data_file,
    in_notebook,
    judge_table,
    parse_table,
    provider_tables,
    register,
    toml_text,
    write_config,
)
from punchline.notebook_frame import answer_fields, check_names, result_frame

__all__ = ["RunRecord", "artifact_url", "prompts", "run", "status"]


def run(
    config: str | os.PathLike[str] | Any,
    settings: Any = None,
    *,
    providers: Mapping[str, Any] | None = None,
    settings_file: str | os.PathLike[str] | None = None,
    run_id: str | None = None,
    store: str | None = None,
    runs_dir: str | None = None,
    redis_url: str | None = None,
    ray_address: str | None = None,
    max_cost_usd: float | None = None,
    max_workers: int | None = None,
    offline: bool | None = None,
    progress: ProgressFn | None = None,
) -> RunRecord:
    """Run (or, with the ``run_id`` of an earlier run, resume) the pipeline of the config file
    ``config``; returns when the run ends. ``state`` is ``finished``, or ``failed`` when some units
    failed (``failures`` names them; ``punchline retry-failed`` retries them). ``progress(stage,
    counters)`` is called as shards commit.

    ``config`` may instead be a pipeline object, run with ``settings`` (its ``settings_type``, or a dict
    shaped like its TOML table) and the providers of ``providers`` (name -> ProviderSettings or a dict
    shaped like ``[providers.<name>]``) or of the settings file (``settings_file``, else
    ``$PUNCHLINE_CONFIG``, else ``./punchline.toml``). Its run id, unless given, is a hash of all that:
    the same call again returns the finished run without a call, and resumes an interrupted one."""
    if not isinstance(config, (str, os.PathLike)):
        if settings is None:
            raise PunchlineError("punchline.run(pipeline, settings): a pipeline object needs its settings")
        runs = runs_dir if runs_dir is not None else RunOptions.from_env().runs_dir
        config, derived = _pipeline_config(config, settings, providers, settings_file, Path(runs))
        run_id = run_id or derived
    elif settings is not None or providers is not None:
        raise PunchlineError("settings and providers go with a pipeline object, not with a config file")
    opts = overlay(
        RunOptions.from_env(),
        run_id=run_id,
        store=store,
        runs_dir=runs_dir,
        redis_url=redis_url,
        ray_address=ray_address,
        max_cost_usd=max_cost_usd,
        max_workers=max_workers,
        offline=offline,
    )
    if not structlog.is_configured():  # until the driver sends its log to log.jsonl: not to stdout
        structlog.configure(logger_factory=structlog.ReturnLoggerFactory())
    return run_driver(os.fspath(config), opts, progress=progress)


def status(run_id: str, *, runs_dir: str | None = None, store: str | None = None) -> RunRecord:
    """The record of run ``run_id``: from ``<runs_dir>/<run_id>/run.json``, else (a run submitted as a
    Ray job) from ``store``; a run whose driver on this machine is gone says ``interrupted``."""
    opts = overlay(RunOptions.from_env(), runs_dir=runs_dir, store=store)
    record: RunRecord = load_run_record(opts.runs_dir, run_id, opts.store)
    if record.driver_gone():
        record.state = "interrupted"
    return record


def artifact_url(record: RunRecord, name: str) -> str:
    """Where the run's artifact ``name`` is: a path under a local store, or an ``s3://`` URL."""
    return f"{record.services.store_url.rstrip('/')}/{RunLayout(record.run_id).artifact(name)}"


def _pipeline_config(
    pipeline: Any, settings: Any, providers: Mapping[str, Any] | None, settings_file: Any, runs: Path
) -> tuple[Path, str]:
    """The config file of a pipeline object's run, and the run id its content gives."""
    ref = register(pipeline)
    table = msgspec.to_builtins(settings) if isinstance(settings, msgspec.Struct) else settings
    provider_table, engine = provider_tables(providers, settings_file)
    name = pipeline.name
    tables = {**engine, "run": {**engine.get("run", {}), "pipeline": ref}, "providers": provider_table, name: table}
    text = toml_text(tables, f"punchline.run({name}, settings): written by punchline.notebook")
    run_id = content_id(name, text)
    return write_config(runs / NOTEBOOK_DIR, run_id, text), run_id


def prompts(
    data: Any,
    template: str | None = None,
    *,
    models: str | Sequence[str],
    n: int = 1,
    parse: Any = None,
    judge: Any = None,
    system: str | None = None,
    messages: Sequence[Mapping[str, str]] | None = None,
    provider: str | None = None,
    providers: Mapping[str, Any] | None = None,
    settings_file: str | os.PathLike[str] | None = None,
    id_field: str | None = None,
    run_id: str | None = None,
    runs_dir: str | None = None,
    store: str | None = None,
    redis_url: str | None = None,
    max_cost_usd: float | None = None,
    progress: bool | None = None,
    **options: Any,
) -> Any:
    """The prompts pipeline over ``data``: the user's frame back, one row per input row x model x sample, with
    the answers beside the input's columns. Running the same call again returns the same frame and pays
    nothing (the run id is a hash of the call and the data's content: the finished run answers); after a
    killed kernel it resumes the run, paying only for what was not committed.

    **Arguments.** ``data``: a pandas or polars DataFrame, a list of dicts, a ``datasets.Dataset``, a pyarrow
    Table or a path (.jsonl/.csv/.parquet). ``template``: the user message, a Jinja2 template over the row's
    columns (or ``messages``, a chat of ``{"role", "content"}``). ``models``: nicknames of ``provider``
    (default: the first provider) or ``"provider:nick"``. ``parse``: a regex, a JSON schema or a Pydantic
    model class (both sent as the provider's structured-output format), or a ``[prompts.parse]`` table.
    ``judge``: a dict shaped like ``[prompts.judge]`` (``model``, ``prompt``, ``parse``, ``where``,
    ``fraction``...). ``options``: any other ``[prompts]`` key (``temperature``, ``max_tokens``, ``seed``,
    ``null``, ``mode``...). ``id_field``: the rows' id column (default: ``id`` when there is one, else the
    rows are numbered). ``progress``: a bar per stage (default: in a notebook).

    **Rows**: input row order, then ``models`` as given, then sample ``0..n-1`` (``len(data) x len(models)
    x n`` rows), the same on every call.

    **Type and index**: a pandas DataFrame in, a pandas DataFrame out with the input's own index, each label
    repeated once per model x sample (a MultiIndex and the index's name too). A polars DataFrame in, a polars
    DataFrame out: polars has no index, so the rows' order is the link (row ``i * len(models) * n + j`` answers
    input row ``i``). Anything else (a list of dicts, a Dataset, a pyarrow Table, a path): a pandas DataFrame
    whose index is the input row's 0-based position (in the list, the Dataset as selected, the file).

    **Columns**: first the input's columns under their own names (pandas and polars: with their own dtypes;
    the others: as the run read them, typed by Arrow, JSON text for a column of mixed types), then the
    answer's, only those of the steps that ran:

    * always: ``row_id`` (str: the row's id in the run, its ``id_field`` value or its 1-based number),
      ``model`` (the ``models`` entry), ``sample`` (int32), ``text`` (the answer; null when there is none),
      ``finish_reason``, ``input_tokens``, ``output_tokens``, ``cost_usd`` (the request's: its ``n`` samples
      were one request, so sum over distinct ``request_key``), ``mode`` (``online``/``batch``),
      ``request_key``, ``error`` (null unless the unit failed after its retries);
    * with ``parse``: after ``text``, ``parsed.<field>`` for each field the parser declares (a regex's named
      groups, a schema's ``properties``: str, int64, float64, bool, else JSON text), or one ``parsed`` (JSON
      text) when it declares none, then ``parse_error``;
    * with ``judge``: ``judge_text``, with the judge's ``parse`` ``judge_parsed.<field>`` (or
      ``judge_parsed``) and ``judge_parse_error``, then ``judge_request_key`` (null: the judge did not read
      this answer, ``where``/``fraction``), ``judge_cost_usd``, ``judge_mode``.

    **A name clash** (an input column named like one of this call's answer columns: ``text``, ``model``,
    ``sample``..., or ``parsed``/``parsed.*`` with ``parse``) raises :class:`InputError` before anything
    runs, naming the column. Why an error and not a prefix: the answer columns keep the same names for every
    dataset, so code reading ``out["text"]`` always means the answer, and the input columns keep the names
    the template and the user's own code use; a silent rename on either side would make a column's meaning
    depend on the data. Renaming the input column (and its name in the template) is one line.

    **attrs**: ``out.attrs["punchline"]`` is ``{"run_id", "runs_dir", "store", "state"}``: the run
    (``punchline.status(run_id, runs_dir=...)``, ``punchline view``), the absolute runs folder it used, its
    store's URL and ``finished`` (or ``failed``: some units failed, their rows have ``error``). A pandas
    frame's own attrs are kept beside it; for polars, which has no attrs, the returned object carries an
    ``attrs`` dict of the same shape (polars' operations do not pass it on). Nothing is printed."""
    runs = Path(runs_dir if runs_dir is not None else RunOptions.from_env().runs_dir).absolute()
    folder = runs / NOTEBOOK_DIR
    path, digest, columns = data_file(data, folder)
    parse_spec, judge_spec = parse_table(parse), judge_table(judge)
    fields = answer_fields(
        parse=parse_spec is not None,
        judge=judge_spec is not None,
        judge_parse=judge_spec is not None and judge_spec.get("parse") is not None,
    )
    check_names(columns, fields)
    provider_table, engine = provider_tables(providers, settings_file)
    model_list = [models] if isinstance(models, str) else list(models)
    if provider is None:
        provider = next(iter(provider_table)) if provider_table else ""
    if id_field is None:
        id_field = "id" if "id" in columns else ""
    table: dict[str, Any] = {
        "data": str(path) if path.parent != folder else path.name,
        "id_field": id_field,
        "provider": provider,
        "models": model_list,
        "n": n,
        "prompt": template,
        "system": system,
        "messages": [dict(m) for m in messages] if messages is not None else None,
        "parse": parse_spec,
        "judge": judge_spec,
        **options,
    }
    tables = {**engine, "run": {**engine.get("run", {}), "pipeline": "prompts"}, "providers": provider_table}
    text = toml_text({**tables, "prompts": table}, "punchline.prompts(...): written by punchline.notebook")
    rid = run_id or content_id("prompts", text, digest)
    config = write_config(folder, rid, text)
    show = in_notebook() if progress is None else progress
    if show:
        with ProgressBar() as bar:
            record = run(config, run_id=rid, runs_dir=str(runs), store=store, redis_url=redis_url,
                         max_cost_usd=max_cost_usd, progress=bar)  # fmt: skip
    else:
        record = run(
            config, run_id=rid, runs_dir=str(runs), store=store, redis_url=redis_url, max_cost_usd=max_cost_usd
        )
    raw = open_store(record.services.store_url).get(RunLayout(record.run_id).artifact("outputs.parquet"))
    if raw is None:
        raise PunchlineError(
            f"run {record.run_id} ended {record.state} without outputs: punchline status {record.run_id}"
        )
    info = {"run_id": record.run_id, "runs_dir": str(runs), "store": record.services.store_url, "state": record.state}
    return result_frame(data, pq.read_table(pa.BufferReader(raw)), columns, fields, info)
