"""The settings reference (docs/settings.md), generated from the code: every TOML table and key of a
run config and every ``PUNCHLINE_*`` environment variable, with type, default, range and description.

The TOML half walks the msgspec Structs a config decodes into (``RunConfig``: ``[run]``,
``[providers.<name>]`` and its models, ``[simulator]``; then each installed pipeline's
``settings_type``) with :func:`msgspec.inspect.type_info`, reading each field's ``msgspec.Meta``
(its range and ``description``); the environment half lists :data:`punchline.data.settings.ENV_VARS`.
So the reference cannot drift from the code: ``punchline settings`` prints it, and
``tests/data/test_settings.py`` fails when docs/settings.md differs or a field has no description.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import msgspec
import msgspec.inspect as mi

from punchline.cluster.config import RunConfig
from punchline.cluster.registry import available, resolve
from punchline.data.errors import PunchlineError
from punchline.data.settings import ENV_VARS, EnvVar, bounds_text

HEADER = """# Settings reference

Every key of a run config (TOML) and every environment variable punchline reads, generated from the code by
`punchline settings > docs/settings.md` (do not edit by hand: `tests/data/test_settings.py` compares this file
with the generated text). Precedence: a command-line flag, then its environment variable, then the config's key,
then the default. A value out of range stops the command before anything starts, in one line naming the key or
the variable (exit 2). An empty environment variable counts as unset.
"""


class Key(msgspec.Struct, frozen=True):
    """One key of a TOML table, as the reference shows it."""

    name: str
    type: str
    default: str
    range: str
    description: str


class TableDoc(msgspec.Struct, frozen=True):
    """One TOML table: its path (``providers.<name>``), what it is, its keys."""

    path: str
    summary: str
    keys: list[Key]


def _unwrap(t: mi.Type) -> tuple[mi.Type, str]:
    """The type under its Metadata, and the Metadata's description."""
    description = ""
    while isinstance(t, mi.Metadata):
        description = description or (t.extra_json_schema or {}).get("description", "")
        t = t.type
    return t, description


def _members(t: mi.Type) -> list[mi.Type]:
    t, _ = _unwrap(t)
    if isinstance(t, mi.UnionType):
        return [m for u in t.types for m in _members(u)]
    return [t]


def _type_name(t: mi.Type) -> str:
    t, _ = _unwrap(t)
    if isinstance(t, mi.UnionType):
        names = [_type_name(m) for m in t.types if not isinstance(_unwrap(m)[0], mi.NoneType)]
        return " or ".join(names)
    if isinstance(t, mi.LiteralType):
        return " \\| ".join(json.dumps(v) for v in t.values)
    if isinstance(t, mi.ListType):
        return f"list of {_type_name(t.item_type)}"
    if isinstance(t, mi.DictType):
        return f"table of {_type_name(t.value_type)}"
    if isinstance(t, mi.StructType):
        return "table"
    simple = {
        mi.IntType: "int",
        mi.FloatType: "float",
        mi.StrType: "string",
        mi.BoolType: "bool",
        mi.AnyType: "any",
        mi.CustomType: "any",
    }
    for kind, name in simple.items():
        if isinstance(t, kind):
            return name
    return type(t).__name__.removesuffix("Type").lower()


def _range(t: mi.Type) -> str:
    """The constraints msgspec checks, in words (``1 – 1000``, ``> 0 and <= 1``, ``length 1 – 200``)."""
    parts = []
    for m in _members(t):
        if isinstance(m, (mi.IntType, mi.FloatType)):
            parts.append(bounds_text(ge=m.ge, gt=m.gt, le=m.le, lt=m.lt))
        elif isinstance(m, (mi.StrType, mi.ListType, mi.DictType)):
            length = bounds_text(ge=m.min_length, le=m.max_length)
            parts.append(f"length {length}" if length else "")
            if isinstance(m, mi.StrType) and m.pattern:
                parts.append(f"matches `{m.pattern}`")
    return ", ".join(p for p in parts if p)


def _default(field: mi.Field) -> str:
    if field.required:
        return "required"
    value = field.default_factory() if field.default is msgspec.NODEFAULT else field.default
    if value is None:
        return "(none)"
    return f"`{json.dumps(msgspec.to_builtins(value), ensure_ascii=False)}`"


def _nested(path: str, t: mi.Type) -> Iterator[tuple[str, type[msgspec.Struct]]]:
    """The tables a field's type holds: a Struct, a table of Structs (``<name>``), an array of them (``[]``)."""
    for m in _members(t):
        if isinstance(m, mi.StructType):
            yield path, m.cls
        elif isinstance(m, mi.DictType):
            yield from _nested(f"{path}.<name>", m.value_type)
        elif isinstance(m, mi.ListType):
            yield from _nested(f"{path}[]", m.item_type)


def _tables(path: str, struct: type[msgspec.Struct]) -> Iterator[TableDoc]:
    """``struct``'s own table, then the tables nested in it (sub-Structs, tables of Structs)."""
    info = mi.type_info(struct)
    assert isinstance(info, mi.StructType)
    summary = " ".join((struct.__doc__ or "").split("\n\n")[0].split()).replace("```", "").replace("``", "`")
    keys = []
    for f in info.fields:
        _, description = _unwrap(f.type)
        keys.append(Key(f.encode_name, _type_name(f.type), _default(f), _range(f.type), description))
    yield TableDoc(path, summary, keys)
    for f in info.fields:
        for sub_path, cls in _nested(f"{path}.{f.encode_name}", f.type):
            yield from _tables(sub_path, cls)


def config_tables() -> list[TableDoc]:
    """Every table of a run config: the engine's (``RunConfig``), then each installed pipeline's."""
    info = mi.type_info(RunConfig)
    assert isinstance(info, mi.StructType)
    out: list[TableDoc] = []
    for f in info.fields:
        for path, cls in _nested(f.encode_name, f.type):
            out += _tables(path, cls)
    for name in available():  # every installed pipeline's table, punchline's own and the plug-ins'
        try:
            pipeline = resolve(name)
        except PunchlineError:  # a broken plug-in: its table cannot be read, the rest of the reference can
            continue
        out += _tables(name, pipeline.settings_type)
        knobs = getattr(pipeline, "simulate_knobs", None)  # its simulated answers' own knobs, if it has any
        if isinstance(knobs, type) and issubclass(knobs, msgspec.Struct):
            out += _tables(f"simulator.pipeline_knobs.{name}", knobs)
    return out


def _env_row(var: EnvVar[Any]) -> str:
    default = "(none)" if var.default is None else f"`{json.dumps(var.default)}`"
    also = f" (else {', '.join(var.also)})" if var.also else ""
    kind = " \\| ".join(json.dumps(c) for c in var.choices) if var.choices else var.kind
    job = "yes" if var.job and not var.secret else ""
    flag = f"`{var.flag}`" if var.flag else ""
    return f"| `{var.name}`{also} | {kind} | {default} | {var.range_text()} | {flag} | {job} | {var.description} |"


def reference() -> str:
    """docs/settings.md."""
    lines = [HEADER, "## Environment variables", ""]
    lines.append(
        "`submit --env` may set the variables marked *per job* for one Ray job; the others (a Redis URL may hold "
        "a password) belong in the nodes' own environment."
    )
    lines += ["", "| variable | type | default | range | flag | per job | description |", "| --- " * 7 + "|"]
    lines += [_env_row(v) for v in ENV_VARS]
    lines += ["", "## Run config (TOML)", ""]
    lines.append(
        "`<name>` stands for a name you choose (a provider, a model's nickname); `[]` for an array of tables. "
        "A pipeline reads only its own table (`[<pipeline name>]`: a built-in's or a plug-in's)."
    )
    for table in config_tables():
        lines += ["", f"### `[{table.path}]`", ""]
        if table.summary:
            lines += [table.summary, ""]
        lines += ["| key | type | default | range | description |", "| --- " * 5 + "|"]
        for k in table.keys:
            lines.append(f"| `{k.name}` | {k.type} | {k.default} | {k.range} | {k.description} |")
    return "\n".join(lines) + "\n"
