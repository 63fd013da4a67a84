"""A ``[prompts]`` table compiled: templates, parsers and model references, checked once.

Compiling is the config check (a template's syntax, a regex, a JSON schema, a sampling table for a
model that is not listed: one line naming the key), and :meth:`CompiledPrompts.check_rows` is the
input check: it renders every row's messages, and the judge's over a stand-in answer, so a missing
field stops the run before any call rather than after half of them. Templates see the row's fields by
name and the whole row as ``row``; the judge's also see ``response`` (the answer), ``parsed``, ``model``
and ``sample``, which win over a row field of the same name (``row.<field>`` still reaches it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from punchline.data.errors import ConfigError
from punchline.data.prompts.parse import Parser
from punchline.data.prompts.rows import Row
from punchline.data.prompts.settings import PromptsSettings, model_ref
from punchline.data.prompts.templates import ChatTemplate
from punchline.data.requests import Message


class CompiledPrompts:
    def __init__(self, settings: PromptsSettings, *, file: str | None = None) -> None:
        self.settings = settings
        self.file = file
        if len(set(settings.models)) != len(settings.models):
            dup = sorted({m for m in settings.models if settings.models.count(m) > 1})
            raise ConfigError(f"lists {dup[0]!r} twice", file=file, field="prompts.models")
        for name in settings.sampling:
            if name not in settings.models:
                raise ConfigError(
                    f"{name!r} is not one of prompts.models {settings.models}",
                    file=file,
                    field=f"prompts.sampling.{name}",
                )
        self.models = [(entry, *model_ref(entry, settings.provider)) for entry in settings.models]
        self.chat = ChatTemplate(
            prompt=settings.prompt, system=settings.system, messages=settings.messages, prefix="prompts", file=file
        )
        self.parser = Parser(settings.parse, field="prompts.parse", file=file) if settings.parse else None
        judge = settings.judge
        self.judge_chat: ChatTemplate | None = None
        self.judge_parser: Parser | None = None
        self.judge_model: tuple[str, str] | None = None
        if judge is not None:
            self.judge_model = model_ref(judge.model, settings.provider)
            self.judge_chat = ChatTemplate(
                prompt=judge.prompt, system=judge.system, messages=judge.messages, prefix="prompts.judge", file=file
            )
            if judge.parse is not None:
                self.judge_parser = Parser(judge.parse, field="prompts.judge.parse", file=file)

    def providers(self) -> list[tuple[str, str]]:
        """(config key, provider name) of every provider the table names, for the config's check."""
        out = [("prompts.models", provider) for _, provider, _ in self.models]
        if self.judge_model is not None:
            out.append(("prompts.judge.model", self.judge_model[0]))
        return out

    @staticmethod
    def context(row: Row) -> dict[str, Any]:
        return {**row.fields, "row": row.fields}

    def messages(self, row: Row, data_file: str) -> tuple[Message, ...]:
        return self.chat.render(self.context(row), file=data_file, record=row.where)

    def judge_messages(
        self, row: Row, data_file: str, *, response: str, parsed: Mapping[str, Any] | None, model: str, sample: int
    ) -> tuple[Message, ...]:
        """The judge's chat for one answer. ``parsed`` always has every field the parser can give (None
        when the answer did not parse), so a template naming ``parsed.<field>`` renders for every answer."""
        assert self.judge_chat is not None
        names = self.parser.names if self.parser is not None else ()
        context = {
            **self.context(row),
            "response": response,
            "parsed": {**dict.fromkeys(names), **(parsed or {})},
            "model": model,
            "sample": sample,
        }
        return self.judge_chat.render(context, file=data_file, record=row.where)

    def check_rows(self, rows: list[Row], data_file: str) -> None:
        """Every row's messages render (all fields present, no template error), and so do the judge's
        over a stand-in answer — before any provider call."""
        for row in rows:
            self.messages(row, data_file)
            if self.judge_chat is not None:
                self.judge_messages(row, data_file, response="", parsed=None, model="", sample=0)
