"""Prompt templates: Jinja2 in a sandbox, with every missing field an error found before any call.

Jinja2 is what chat templates and lm-eval use, so a researcher's templates carry over. The
environment is sandboxed (a row's text cannot reach Python internals) and ``StrictUndefined``: a
template naming a field a row lacks fails to render, and the pipeline renders every row's messages
while checking its input, before anything is scheduled. Nothing is HTML-escaped and a trailing
newline is kept, so the prompt is exactly the text written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jinja2
import jinja2.meta
from jinja2.sandbox import SandboxedEnvironment

from punchline.data.errors import ConfigError, InputError
from punchline.data.prompts.settings import MessageTemplate
from punchline.data.requests import Message

_ENV = SandboxedEnvironment(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True)


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
