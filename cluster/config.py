"""Run configuration: a TOML file decoded into a :class:`~punchline.cluster.run_config.RunConfig` and checked.

Unknown or missing keys are errors that name the file and the key path, so a typo in a 100-node
submission fails on the laptop before anything is scheduled. What a config is (its Structs, where its relative
paths point) is :mod:`punchline.cluster.run_config`, below the pipeline protocol; reading one asks the registry
for the run's pipeline, above it. The names re-exported here are the ones pipelines and commands import.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec

from punchline.cluster.pipeline import Pipeline
from punchline.cluster.records.run_record import RUN_ID as RUN_ID
from punchline.cluster.records.run_record import check_run_id as check_run_id
from punchline.cluster.registry import available, resolve
from punchline.cluster.run_config import Count as Count
from punchline.cluster.run_config import Name as Name
from punchline.cluster.run_config import Names as Names
from punchline.cluster.run_config import RunConfig as RunConfig
from punchline.cluster.run_config import resolve_path as resolve_path
from punchline.data.errors import ConfigError
from punchline.data.provider_settings import ModelSettings, ProviderSettings
from punchline.data.storage.jsonio import validation_location
from punchline.schedulers.server.redis_client import check_url, control_characters, redact_url
from punchline.workers.fake.checks import check_simulator
from punchline.workers.providers.registry import check_kind

SIMULATED = "simulated"  # a provider base_url that makes the driver start the fake provider itself


def load_config(path: str | os.PathLike[str]) -> RunConfig:
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config: {exc.strerror}", file=str(p)) from None
    try:
        tables = msgspec.toml.decode(raw, type=dict[str, Any])
    except msgspec.DecodeError as exc:
        raise ConfigError(f"malformed TOML: {exc}", file=str(p)) from None
    # provider tables (and their models) one by one: msgspec does not name dict keys in its error paths
    providers = tables.get("providers")
    for name, table in providers.items() if isinstance(providers, dict) else ():
        models = table.get("models") if isinstance(table, dict) else None
        for nick, model in models.items() if isinstance(models, dict) else ():
            _decode_table(model, ModelSettings, str(p), f"providers.{name}.models.{nick}")
        _decode_table(table, ProviderSettings, str(p), f"providers.{name}")
    pipeline, settings = _pipeline_settings(tables, str(p))
    try:
        cfg = msgspec.convert(tables, RunConfig)
    except msgspec.ValidationError as exc:
        table, key, detail = validation_location(exc)  # $.run.pipeline -> table "run", key "pipeline"
        raise ConfigError(detail, file=str(p), field=".".join(k for k in (table, key) if k) or None) from None
    cfg.source = str(p)
    cfg.settings = settings
    cfg.resolved_pipeline = pipeline
    _check(cfg, pipeline)
    return cfg


def _decode_table(table: Any, kind: type[msgspec.Struct], file: str, where: str) -> None:
    """Decode one table as a check, so that an error names its key path (``providers.x.models.y.id``)."""
    try:
        msgspec.convert(table, kind)
    except msgspec.ValidationError as exc:
        record, key, detail = validation_location(exc)
        raise ConfigError(detail, file=file, field=".".join(k for k in (where, record, key) if k)) from None


def _pipeline_settings(tables: dict[str, Any], file: str) -> tuple[Pipeline | None, Any]:
    """Take the pipeline's own table out of ``tables`` and decode it with its ``settings_type``; errors
    name the file and the key path (``<table>.<stage>.provider``). (None, None) when ``[run] pipeline`` is
    missing or not a string: decoding ``[run]`` then says so."""
    for filled in ("settings", "resolved_pipeline"):  # the fields load_config fills are no TOML tables
        if filled in tables:
            raise ConfigError(f"Object contains unknown field `{filled}`", file=file, field=filled)
    run = tables.get("run")
    ref = run.get("pipeline") if isinstance(run, dict) else None
    if not isinstance(ref, str) or not ref:
        return None, None
    pipeline = resolve(ref, file)
    table = tables.pop(pipeline.name, None)
    for other in available():  # a config may keep other pipelines' tables: left alone, unread
        tables.pop(other, None)
    if table is None:
        raise ConfigError(f"run.pipeline is {ref!r} but there is no [{pipeline.name}] table", file=file)
    try:
        return pipeline, msgspec.convert(table, pipeline.settings_type)
    except msgspec.ValidationError as exc:
        record, key, detail = validation_location(exc)
        field = ".".join(k for k in (pipeline.name, record, key) if k)
        raise ConfigError(detail, file=file, field=field) from None


def _check(cfg: RunConfig, pipeline: Pipeline | None) -> None:
    assert pipeline is not None  # RunSettings.pipeline is a required non-empty str: decoding refused it
    for name, settings in cfg.providers.items():
        check_provider(name, settings, cfg.source)
    if cfg.simulator is not None:
        check_simulator(cfg.simulator, cfg.source)
    for field, value in (("run.store", cfg.run.store), ("run.redis_url", cfg.run.redis_url)):
        if value is not None:
            check_service_url(value, field, cfg.source)
    pipeline.check_settings(cfg.settings, cfg.source)
    for field, name in pipeline.provider_refs(cfg.settings):
        if name not in cfg.providers:
            raise ConfigError(
                f"unknown provider {name!r}; configured: {sorted(cfg.providers)}", file=cfg.source, field=field
            )


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_http_url(value: str, *, file: str | None, record: str | None, field: str) -> None:
    try:
        parts = urlsplit(value)  # raises on a broken IPv6 literal ("http://[::1/v1")
        port_ok = parts.port is None or 0 < parts.port < 65536
        host_ok = bool(parts.hostname)
    except ValueError:
        parts, port_ok, host_ok = urlsplit(""), False, False
    if parts.scheme not in ("http", "https") or not host_ok or not port_ok or " " in value or control_characters(value):
        raise ConfigError(
            f"not an http(s) URL: {value!r} (want e.g. https://api.example.com/v1, or {SIMULATED!r})",
            file=file,
            record=record,
            field=field,
        )


def check_service_urls(values: list[tuple[str | None, str]], file: str | None = None) -> None:
    """:func:`check_service_url` of each ``(value, field)`` given (None: not set), in order."""
    for value, field in values:
        if value is not None:
            check_service_url(value, field, file)


def check_service_url(value: str, field: str, file: str | None = None) -> None:
    """The form of a store or Redis URL given in a config, flag or environment (never echoes a password)."""
    if not value.strip():
        raise ConfigError("is empty", file=file, field=field)
    if control_characters(value):
        raise ConfigError(
            f"{redact_url(value)!r} contains a control character (a newline, a tab...)", file=file, field=field
        )
    if "redis" in field.lower():
        try:
            check_url(value)
        except ConfigError as exc:
            raise ConfigError(exc.detail, file=file, field=field) from None
        return
    if value.startswith("s3://"):
        bucket = urlsplit(value).netloc
        if not re.fullmatch(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]", bucket):
            raise ConfigError(f"not a valid S3 bucket in {redact_url(value)!r}", file=file, field=field)
    elif "://" in value:
        raise ConfigError(f"want a folder or s3://bucket/prefix, got {redact_url(value)!r}", file=file, field=field)
    elif Path(value).expanduser().exists() and not Path(value).expanduser().is_dir():
        raise ConfigError("is a file, not a folder (give a folder or s3://bucket/prefix)", file=value, field=field)


def check_provider(name: str, p: ProviderSettings, file: str | None) -> None:
    """Range checks of one ``[providers.<name>]`` table (msgspec has checked the types)."""
    record = f"providers.{name}"

    def bad(field: str, message: str) -> ConfigError:
        return ConfigError(message, file=file, record=record, field=field)

    check_kind(name, p, file)  # an installed kind, and one with a batch API if mode = "batch"
    if p.base_url is not None and p.base_url != SIMULATED:
        check_http_url(p.base_url, file=file, record=record, field="base_url")
    if p.api_key_env is not None and not _ENV_NAME.fullmatch(p.api_key_env):
        # never echo the value: a key pasted here by mistake must not reach the terminal
        raise bad("api_key_env", "is not an environment variable name (give the variable's name, never the key)")
    if p.api_key_file is not None and not p.api_key_file.strip():
        raise bad("api_key_file", "is empty")
    for nick, m in p.models.items():
        if not m.id.strip():
            raise bad(f"models.{nick}.id", "is empty")
    # the numbers' ranges are in ProviderSettings' and ModelSettings' Meta, checked as the table is decoded
