"""The parse step: an answer's text -> named fields, or the reason it could not be parsed.

A regex gives its named groups; a JSON schema takes the answer's JSON (the whole text, a fenced
```json block inside it, or the outermost ``{...}``/``[...]`` span) and validates it. A failure is
not an exception but a value (the ``parse_error`` column), because a model that answers badly is a
finding of the study, not a fault of the run.
"""

from __future__ import annotations

import re
from typing import Any

import jsonschema
import msgspec

from punchline.cluster.stages.settings import ParseSettings
from punchline.data.answer_format import json_of
from punchline.data.errors import ConfigError

_FLAGS = {"i": re.IGNORECASE, "m": re.MULTILINE, "s": re.DOTALL, "x": re.VERBOSE}


class Parsed(msgspec.Struct, frozen=True, kw_only=True):
    fields: dict[str, Any] | None = None
    error: str | None = None


class Parser:
    """A compiled parse step (checked when the config is read: bad regex or schema -> one line)."""

    def __init__(self, settings: ParseSettings, *, field: str, file: str | None = None) -> None:
        if (settings.regex is None) == (settings.json_schema is None):
            raise ConfigError("give exactly one of regex and json_schema", file=file, field=field)
        self._regex: re.Pattern[str] | None = None
        self._validator: Any = None
        self.names: tuple[str, ...] = ()
        self.types: dict[str, str] = {}  # field -> string, integer, number, boolean or json (its Parquet column)
        if settings.regex is not None:
            flags = 0
            for f in settings.flags:
                flags |= _FLAGS[f]
            try:
                self._regex = re.compile(settings.regex, flags)
            except re.error as exc:
                raise ConfigError(f"not a valid regex: {exc}", file=file, field=f"{field}.regex") from None
            self.names = tuple(self._regex.groupindex)
            self.types = dict.fromkeys(self.names, "string")
            if not self.names:
                raise ConfigError(
                    "has no named group: write e.g. (?P<answer>...) for each field to keep",
                    file=file,
                    field=f"{field}.regex",
                )
        else:
            schema = settings.json_schema
            try:
                cls = jsonschema.validators.validator_for(schema)
                cls.check_schema(schema)
            except jsonschema.SchemaError as exc:
                raise ConfigError(
                    f"not a valid JSON schema: {exc.message}", file=file, field=f"{field}.json_schema"
                ) from None
            self._validator = cls(schema)
            props = schema.get("properties") if isinstance(schema, dict) else None
            self.names = tuple(props) if isinstance(props, dict) else ()
            self.types = {name: _type_of(props[name]) for name in self.names} if isinstance(props, dict) else {}

    def parse(self, text: str) -> Parsed:
        if self._regex is not None:
            match = self._regex.search(text)
            if match is None:
                return Parsed(error="no match for the regex")
            return Parsed(fields=match.groupdict())
        value, error = json_of(text)
        if error is not None:
            return Parsed(error=error)
        problem = jsonschema.exceptions.best_match(self._validator.iter_errors(value))
        if problem is not None:
            where = "/".join(str(p) for p in problem.absolute_path)
            return Parsed(error=f"schema: {where + ': ' if where else ''}{problem.message}")
        return Parsed(fields=value if isinstance(value, dict) else {"value": value})


_SCALARS = ("string", "integer", "number", "boolean")


def _type_of(schema: Any) -> str:
    """A property's column type: its one scalar JSON type (``["integer", "null"]`` counts), else ``json``."""
    if not isinstance(schema, dict):
        return "json"
    kind = schema.get("type")
    enum = schema.get("enum")
    if kind is None and isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
        kind = "string"
    kinds = [k for k in kind if k != "null"] if isinstance(kind, list) else [kind]
    return kinds[0] if len(kinds) == 1 and kinds[0] in _SCALARS else "json"
