"""JSON answers valid against a stage's JSON schema, with a chosen value in one field: how the simulator writes an
answer a schema parse reads.

An instance is built from the schema's own words (``type``, ``properties``/``required``, ``enum``/``const``,
``minimum``/``maximum``, ``minLength``, ``pattern``, ``items``/``minItems``, ``anyOf``/``oneOf``/``allOf`` and local
``$ref``, which a Pydantic model's schema uses), then checked by the same validator the stage parses with and kept
only when valid, so an answer the schema would refuse is never written as if it parsed.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema

from punchline.workers.fake.formats.regex_text import RegexText

_MAX_RANGE = 64  # an integer range this small counts as a field's few values


class SchemaText:
    """One JSON schema, able to write instances with chosen field values and to list a field's few values."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.schema = schema
        self.validator = jsonschema.validators.validator_for(schema)(schema)
        props = schema.get("properties")
        self.names = tuple(props) if isinstance(props, dict) else ()

    def _resolved(self, node: Any) -> Any:
        for _ in range(20):  # a chain of $refs, never a loop forever
            ref = node.get("$ref") if isinstance(node, dict) else None
            if not isinstance(ref, str) or not ref.startswith("#/"):
                return node
            target: Any = self.schema
            for part in ref[2:].split("/"):
                target = target.get(part, {}) if isinstance(target, dict) else {}
            node = target
        return node

    def prop(self, name: str) -> Any:
        props = self.schema.get("properties") or {}
        return self._resolved(props.get(name, {}))

    def values(self, name: str) -> list[Any] | None:
        """The few values field ``name`` can take (an ``enum``, a ``const``, a boolean, a small integer range)."""
        node = self.prop(name)
        if not isinstance(node, dict):
            return None
        if isinstance(node.get("enum"), list):
            return list(node["enum"])
        if "const" in node:
            return [node["const"]]
        kind = _kind(node)
        if kind == "boolean":
            return [True, False]
        low, high = node.get("minimum"), node.get("maximum")
        if kind == "integer" and isinstance(low, int) and isinstance(high, int) and 0 <= high - low < _MAX_RANGE:
            return list(range(low, high + 1))
        return None

    def coerce(self, name: str, value: Any) -> Any:
        """A row's reference as field ``name`` holds it (``"3"`` for an integer field is 3)."""
        kind = _kind(self.prop(name))
        try:
            if kind == "integer" and not isinstance(value, bool):
                return int(value)
            if kind == "number" and not isinstance(value, bool):
                return float(value)
            if kind == "boolean" and isinstance(value, str):
                return {"true": True, "false": False}.get(value.strip().lower(), value)
            if kind == "string" and not isinstance(value, str):
                return json.dumps(value) if isinstance(value, (dict, list)) else str(value)
        except (TypeError, ValueError):
            return value
        return value

    def text(self, values: dict[str, Any]) -> str | None:
        """The JSON text of a valid instance with ``values`` in its fields, or None when the schema refuses it."""
        instance = self._instance(self.schema, 0)
        if values:
            if not isinstance(instance, dict):
                return None
            instance.update(values)
        if not self.validator.is_valid(instance):
            return None
        return json.dumps(instance, ensure_ascii=False)

    def _instance(self, node: Any, depth: int) -> Any:
        node = self._resolved(node)
        if not isinstance(node, dict) or depth > 8:
            return None
        if "const" in node:
            return node["const"]
        if isinstance(node.get("enum"), list) and node["enum"]:
            return node["enum"][0]
        for key in ("anyOf", "oneOf"):
            options = node.get(key)
            if isinstance(options, list) and options:
                typed = [o for o in options if _kind(self._resolved(o)) != "null"] or options
                return self._instance(typed[0], depth + 1)
        if isinstance(node.get("allOf"), list) and node["allOf"]:
            merged: dict[str, Any] = {}
            for part in node["allOf"]:
                merged.update(self._resolved(part) if isinstance(part, dict) else {})
            return self._instance({**merged, **{k: v for k, v in node.items() if k != "allOf"}}, depth + 1)
        kind = _kind(node)
        if kind == "object" or (kind is None and "properties" in node):
            props = node.get("properties") or {}
            return {k: self._instance(v, depth + 1) for k, v in props.items()}
        if kind == "array":
            count = int(node.get("minItems") or 0)
            return [self._instance(node.get("items", {}), depth + 1) for _ in range(count)]
        if kind in ("integer", "number"):
            return _number(node, kind)
        if kind == "boolean":
            return True
        if kind == "null":
            return None
        return _string(node)


def _kind(node: Any) -> str | None:
    """A node's one non-null ``type`` (``["integer", "null"]`` is integer)."""
    kind = node.get("type") if isinstance(node, dict) else None
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        return kinds[0] if kinds else "null"
    if kind is None and isinstance(node, dict) and isinstance(node.get("enum"), list):
        return "string" if all(isinstance(v, str) for v in node["enum"]) else None
    return kind if isinstance(kind, str) else None


def _number(node: dict[str, Any], kind: str) -> int | float:
    low = node.get("minimum", node.get("exclusiveMinimum"))
    value: float = low if isinstance(low, (int, float)) and not isinstance(low, bool) else 0
    if isinstance(node.get("exclusiveMinimum"), (int, float)) and "minimum" not in node:
        value += 1
    high = node.get("maximum")
    if isinstance(high, (int, float)) and value > high:
        value = high
    return int(value) if kind == "integer" else float(value)


def _string(node: dict[str, Any]) -> str:
    pattern = node.get("pattern")
    if isinstance(pattern, str):
        try:
            written = RegexText(pattern).text({})
        except Exception:  # a pattern Python's re reads otherwise (ECMA-262): the plain text below
            written = None
        if written is not None:
            return written
    return "x" * max(1, int(node.get("minLength") or 1))
