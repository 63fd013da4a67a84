"""The notebook API's plumbing: a run's config, data and id made from Python objects instead of files.

``punchline.prompts(data, template=..., models=...)`` and ``punchline.run(pipeline, settings)`` run on the
same engine as ``punchline run`` with a TOML file, so everything it guarantees holds: this module writes
that file (and, for in-memory data, the rows) under ``<runs dir>/_notebook/`` and names the run by a
hash of what determines its answers, so running a cell again finds the finished run (0 calls) and a
killed kernel's run is resumed, paying only for what it had not committed.

* **Data**: a path (``.jsonl``, ``.csv``, ``.parquet``) is read where it is; a list of dicts is written as
  JSONL; a pandas or polars DataFrame, a Hugging Face ``datasets.Dataset`` or a pyarrow Table as Parquet
  (by their own ``to_arrow``-like methods: none of those libraries is imported here, an object of one
  proves it is loaded). The file is named by its content's hash.
* **Providers**: the ``providers`` argument (name -> a :class:`ProviderSettings` or a dict shaped like a
  ``[providers.<name>]`` table), else the ``[providers]`` tables of the settings file: ``config=``, else
  ``$PUNCHLINE_CONFIG``, else ``./punchline.toml``. API keys come from the environment variables the
  tables name (``api_key_env``), never from an argument.
* **Run id**: ``<pipeline>-<sha256 of the config written and the data's content>``; pass ``run_id`` to
  choose one.
* **A pipeline object** (``punchline.run(pipeline, settings)``) is registered in this module and named in
  the config as ``punchline.notebook:<name>``, which the registry imports like any user pipeline; it
  lives in this process, so it runs here (and on a Ray cluster this process drives), not by ``submit``.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from punchline.cluster.stages.rows import FORMATS, load_rows
from punchline.data import settings as env_registry
from punchline.data.errors import ConfigError, InputError
from punchline.schedulers.ledger import StageCounters

NOTEBOOK_DIR = "_notebook"  # under the runs folder: the configs and data files this module writes
SETTINGS_FILE = "punchline.toml"  # the settings file looked for in the working folder
_PIPELINES: dict[str, Any] = {}  # the pipeline objects of this process, by the name their config gives


def __getattr__(name: str) -> Any:
    """``punchline.notebook:<name>`` as the registry resolves it: a pipeline object registered here."""
    if name in _PIPELINES:
        return _PIPELINES[name]
    raise AttributeError(f"module 'punchline.notebook' has no attribute {name!r}")


def register(pipeline: Any) -> str:
    """The ``[run] pipeline`` reference of a pipeline object of this process."""
    name = getattr(pipeline, "name", None)
    if not isinstance(name, str) or not name:
        raise ConfigError("is not a Pipeline: it has no str `name` (see docs/write-a-pipeline.md)", field="pipeline")
    attr = "pipeline_" + re.sub(r"\W", "_", name)
    _PIPELINES[attr] = pipeline
    return f"{__name__}:{attr}"


# --- settings ---------------------------------------------------------------------------------------------


def settings_file(config: str | os.PathLike[str] | None = None) -> Path | None:
    """The settings file the rule finds: ``config``, else ``$PUNCHLINE_CONFIG``, else ``./punchline.toml``
    if it exists; None when there is none."""
    if config is not None:
        return Path(config)
    named = env_registry.CONFIG.get()
    if named:
        return Path(named)
    here = Path(SETTINGS_FILE)
    return here if here.is_file() else None


def provider_tables(
    providers: Mapping[str, Any] | None, config: str | os.PathLike[str] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(``[providers]``, other engine tables: ``[simulator]``, ``[run]``) from the argument or the settings file."""
    if providers is not None:
        return {name: _plain(p) for name, p in providers.items()}, {}
    path = settings_file(config)
    if path is None:
        raise ConfigError(
            f"no providers: pass providers={{...}}, or write [providers.<name>] tables in ./{SETTINGS_FILE} "
            f"or in the file ${env_registry.CONFIG.name} names",
            field="providers",
        )
    try:
        tables = msgspec.toml.decode(path.read_bytes(), type=dict[str, Any])
    except OSError as exc:
        raise ConfigError(f"cannot read the settings file: {exc.strerror}", file=str(path)) from None
    except msgspec.DecodeError as exc:
        raise ConfigError(f"malformed TOML: {exc}", file=str(path)) from None
    if not isinstance(tables.get("providers"), dict) or not tables["providers"]:
        raise ConfigError("has no [providers.<name>] table", file=str(path), field="providers")
    others = {k: tables[k] for k in ("simulator", "run") if isinstance(tables.get(k), dict)}
    return tables["providers"], others


def _plain(value: Any) -> Any:
    """A settings object or mapping as TOML-ready builtins (None values left out: TOML has no null)."""
    if isinstance(value, msgspec.Struct):
        value = msgspec.to_builtins(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# --- data ------------------------------------------------------------------------------------------------

ARROW_LIKE = ("pandas", "polars", "datasets", "pyarrow")


def _arrow_table(data: Any) -> pa.Table | None:
    """A DataFrame or Dataset as an Arrow table, by its own methods; None when ``data`` is none of them."""
    top = type(data).__module__.partition(".")[0]
    if top not in ARROW_LIKE:
        return None
    if isinstance(data, pa.Table):
        return data
    if top == "pandas" and hasattr(data, "columns"):
        return pa.Table.from_pandas(data, preserve_index=False)  # NaN in a float column becomes null
    if top == "polars" and hasattr(data, "to_arrow"):
        return data.to_arrow()
    if top == "datasets" and hasattr(data, "with_format"):
        table: pa.Table = data.with_format("arrow")[:]  # honours select/shuffle (the indices mapping)
        return table
    return None


def data_file(data: Any, folder: Path) -> tuple[Path, str, list[str]]:
    """(the rows' file, its content hash, its column names in the order the run's outputs put them) for a
    path, a list of dicts or a table."""
    if isinstance(data, (str, os.PathLike)):
        path = Path(data).expanduser().absolute()
        if path.suffix.lower() not in FORMATS:
            raise InputError(f"unknown format {path.suffix!r}: use .jsonl, .csv or .parquet", file=str(path))
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise InputError(f"cannot read: {exc.strerror}", file=str(path)) from None
        columns = list(dict.fromkeys(k for row in load_rows(path, "") for k in row.fields))  # as the run reads them
        return path, hashlib.sha256(raw).hexdigest(), columns
    table = _arrow_table(data)
    if table is not None:
        sink = io.BytesIO()
        pq.write_table(table, sink, compression="zstd")
        raw, suffix, columns = sink.getvalue(), ".parquet", list(table.column_names)
    elif isinstance(data, (list, tuple)):
        raw, columns = _jsonl(data), list(dict.fromkeys(k for row in data for k in row))
        suffix = ".jsonl"
    else:
        raise InputError(
            f"data is a {type(data).__name__}: give a path, a list of dicts, a pandas or polars DataFrame, "
            "or a datasets.Dataset",
            field="data",
        )
    digest = hashlib.sha256(raw).hexdigest()
    path = folder / f"data-{digest[:24]}{suffix}"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(raw)
        tmp.replace(path)
    return path, digest, columns


def _jsonl(rows: list[Any] | tuple[Any, ...]) -> bytes:
    out = []
    for number, row in enumerate(rows, start=1):
        if not isinstance(row, Mapping):
            raise InputError(f"is a {type(row).__name__}, not a dict", file="data", record=f"row {number}")
        clean = {str(k): None if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()}
        try:
            out.append(msgspec.json.encode(clean))
        except (TypeError, ValueError) as exc:
            raise InputError(f"cannot be written as JSON: {exc}", file="data", record=f"row {number}") from None
    if not out:
        raise InputError("has no rows", file="data")
    return b"\n".join(out) + b"\n"


# --- the config file ---------------------------------------------------------------------------------------

_BARE = re.compile(r"[A-Za-z0-9_-]+")


def _key(k: str) -> str:
    return k if _BARE.fullmatch(k) else _string(k)


def _string(s: str) -> str:
    # a JSON string is a TOML basic string, but for DEL, which TOML wants escaped
    return json.dumps(s, ensure_ascii=False).replace("\x7f", "\\u007f")


def _value(v: Any, where: str) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else repr(v)  # repr: the shortest exact text; inf and -inf as TOML has them
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x, where) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{ " + ", ".join(f"{_key(str(k))} = {_value(x, where)}" for k, x in v.items() if x is not None) + " }"
    if v is None:
        raise ConfigError("holds a null inside a list, which a settings file cannot hold", field=where)
    raise ConfigError(f"holds a {type(v).__name__}, which a settings file cannot hold", field=where)


def toml_text(tables: Mapping[str, Mapping[str, Any]], header: str) -> str:
    """The tables as TOML: one ``[table]`` each, nested values as inline tables (deterministic)."""
    lines = [f"# {line}" for line in header.splitlines()]
    for name, table in tables.items():
        lines += ["", f"[{_key(name)}]"]
        lines += [f"{_key(k)} = {_value(v, f'{name}.{k}')}" for k, v in table.items() if v is not None]
    return "\n".join(lines) + "\n"


def write_config(folder: Path, run_id: str, text: str) -> Path:
    path = folder / f"{run_id}.toml"
    if not path.exists() or path.read_text() != text:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return path


def content_id(name: str, *parts: str) -> str:
    """``<name>-<hash>``: the run id of a config (and data) with this content."""
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:20]
    return f"{re.sub(r'[^A-Za-z0-9._-]', '-', name)[:60] or 'run'}-{digest}"


# --- the prompts table from keyword arguments -------------------------------------------------------------

_PARSE_KEYS = frozenset({"regex", "flags", "json_schema", "structured"})


def parse_table(parse: Any, field: str = "parse") -> dict[str, Any] | None:
    """``parse=`` as a ``[prompts.parse]`` table: a regex (str); a JSON schema (dict), or a Pydantic model
    class, sent as the provider's structured-output format; or the table itself (a dict with ``regex`` or
    ``json_schema``, or a ParseSettings)."""
    if parse is None:
        return None
    if isinstance(parse, str):
        return {"regex": parse}
    if isinstance(parse, msgspec.Struct):
        table: dict[str, Any] = _plain(parse)
        return table
    schema_of = getattr(parse, "model_json_schema", None)  # a Pydantic model class
    if callable(schema_of):
        return {"json_schema": schema_of(), "structured": True}
    if isinstance(parse, Mapping):
        if set(parse) <= _PARSE_KEYS and ("regex" in parse or "json_schema" in parse):
            return dict(parse)
        return {"json_schema": dict(parse), "structured": True}
    raise ConfigError(
        f"is a {type(parse).__name__}: give a regex, a JSON schema, a Pydantic model or a parse table", field=field
    )


def judge_table(judge: Any) -> dict[str, Any] | None:
    """``judge=`` as a ``[prompts.judge]`` table (a dict shaped like it, or a JudgeSettings)."""
    if judge is None:
        return None
    if not isinstance(judge, (Mapping, msgspec.Struct)):
        raise ConfigError(f"is a {type(judge).__name__}: give a dict shaped like [prompts.judge]", field="judge")
    table: dict[str, Any] = _plain(judge)
    if "parse" in table:
        table["parse"] = parse_table(table["parse"], "judge.parse")
    return table


# --- progress --------------------------------------------------------------------------------------------


def in_notebook() -> bool:
    """A Jupyter kernel runs this process (where a progress bar is wanted by default)."""
    return "ipykernel" in sys.modules


class ProgressBar:
    """One bar per stage (rich renders it in a notebook cell and in a terminal alike)."""

    def __init__(self) -> None:
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("${task.fields[cost]:.4f}"),
            TimeElapsedColumn(),
            console=Console(stderr=not in_notebook()),
        )
        self._tasks: dict[str, Any] = {}

    def __enter__(self) -> Callable[[str, StageCounters], None]:
        self._progress.start()
        return self.update

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def update(self, stage: str, counters: StageCounters) -> None:
        if stage not in self._tasks:
            self._tasks[stage] = self._progress.add_task(stage, total=counters.units_total or None, cost=0.0)
        self._progress.update(
            self._tasks[stage],
            total=counters.units_total or None,
            completed=counters.units_done + counters.units_failed,
            cost=counters.cost_usd,
        )
