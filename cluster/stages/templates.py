"""Prompt templates: Jinja2 in a sandbox, with every missing field an error found before any call.

Jinja2 is what chat templates and lm-eval use, so a researcher's templates carry over. The
environment is sandboxed (a row's text cannot reach Python internals) and ``StrictUndefined``: a
template naming a field a row lacks fails to render, and the pipeline renders every row's messages
while checking its input, before anything is scheduled. Nothing is HTML-escaped and a trailing
newline is kept, so the prompt is exactly the text written.

A null cell (JSON ``null``, an empty Parquet cell, a pandas ``NaN``) reaches a template as a
:class:`NullField` when ``[prompts] null = "error"``: it is false in a test (``{% if x %}``, ``x or
"n/a"``, ``x is none``) but refuses to be rendered, so ``{{ x }}`` stops the run with one line naming
the column before any call, instead of sending the text ``None`` and paying for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jinja2
import jinja2.meta
from jinja2.sandbox import SandboxedEnvironment

from punchline.cluster.stages.settings import MessageTemplate
from punchline.data.errors import ConfigError, InputError
from punchline.data.requests import Message


class NullValue(Exception):
    """A null cell was about to be rendered (raised through Jinja2, caught in :meth:`Template.render`)."""

    def __init__(self, column: str) -> None:
        super().__init__(column)
        self.column = column


class NullField:
    """A row's null cell as a template sees it: false, equal to nothing, never rendered."""

    __slots__ = ("column",)

    def __init__(self, column: str) -> None:
        self.column = column

    def __bool__(self) -> bool:
        return False

    def __str__(self) -> str:
        raise NullValue(self.column)

    def __repr__(self) -> str:  # inside a rendered container (``{{ row }}``) it reads as before
        return "None"


def _finalize(value: Any) -> Any:
    if isinstance(value, NullField):
        raise NullValue(value.column)
    return value


def _json_default(value: Any) -> Any:
    if isinstance(value, NullField):
        return None
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


_ENV = SandboxedEnvironment(
    undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True, finalize=_finalize
)
_ENV.tests["none"] = lambda value: value is None or isinstance(value, NullField)
_ENV.policies["json.dumps_kwargs"] = {"sort_keys": True, "default": _json_default}


def expression(source: str, *, field: str, file: str | None = None) -> tuple[Any, frozenset[str]]:
    """A compiled Jinja2 expression (``[prompts.judge] where``: call it with a context, get a value) and
    the names it reads (checked against the context before any call)."""
    try:
        compiled = _ENV.compile_expression(source, undefined_to_none=False)
        names = frozenset(jinja2.meta.find_undeclared_variables(_ENV.parse("{{ (" + source + ") }}")))
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError(f"expression syntax error: {exc.message}", file=file, field=field) from None
    return compiled, names


class Template:
    """One compiled template; ``field`` is the config key it came from (for error lines)."""

    def __init__(self, source: str, *, field: str, file: str | None = None) -> None:
        self.field = field
        try:
            self._template = _ENV.from_string(source)
            self.names = frozenset(jinja2.meta.find_undeclared_variables(_ENV.parse(source)))
        except jinja2.TemplateSyntaxError as exc:
            raise ConfigError(
                f"template syntax error on line {exc.lineno}: {exc.message}", file=file, field=field
            ) from None

    def render(self, context: Mapping[str, Any], *, file: str | None, record: str) -> str:
        try:
            return self._template.render(context)
        except NullValue as exc:
            raise InputError(
                f'template {self.field}: the value is null (set [prompts] null = "empty" or a text to render nulls)',
                file=file,
                record=record,
                field=exc.column,
            ) from None
        except jinja2.UndefinedError as exc:
            raise InputError(f"template {self.field}: {exc.message}", file=file, record=record) from None
        except jinja2.TemplateError as exc:  # e.g. the sandbox refusing an attribute
            raise InputError(f"template {self.field}: {exc}", file=file, record=record) from None
        except Exception as exc:  # a filter applied to a value of the wrong type, a division by zero, ...
            raise InputError(f"template {self.field}: {type(exc).__name__}: {exc}", file=file, record=record) from None


class ChatTemplate:
    """A system prompt, a chat (list of role + template) or a single user prompt, compiled once."""

    def __init__(
        self,
        *,
        prompt: str | None,
        system: str | None,
        messages: list[MessageTemplate] | None,
        prefix: str,
        file: str | None = None,
    ) -> None:
        if (prompt is None) == (messages is None):
            raise ConfigError("give exactly one of prompt and messages", file=file, field=f"{prefix}.prompt")
        if messages is not None and not messages:
            raise ConfigError("is empty", file=file, field=f"{prefix}.messages")
        parts: list[tuple[str, Template]] = []
        if system is not None:
            parts.append(("system", Template(system, field=f"{prefix}.system", file=file)))
        for i, m in enumerate(messages or []):
            parts.append((m.role, Template(m.content, field=f"{prefix}.messages[{i}].content", file=file)))
        if prompt is not None:
            parts.append(("user", Template(prompt, field=f"{prefix}.prompt", file=file)))
        self.parts = parts
        self.names = frozenset().union(*(t.names for _, t in parts))

    def render(self, context: Mapping[str, Any], *, file: str | None, record: str) -> tuple[Message, ...]:
        return tuple(
            Message(role, t.render(context, file=file, record=record))  # type: ignore[arg-type]
            for role, t in self.parts
        )
