"""A ``[prompts]`` table compiled: templates, parsers and model references, checked once.

Compiling is the config check (a template's syntax, a regex, a JSON schema, a sampling table for a
model that is not listed: one line naming the key), and :meth:`CompiledPrompts.check_rows` is the
input check: it renders every row's messages, and the judge's over a stand-in answer, so a missing
field stops the run before any call rather than after half of them. Templates see the row's fields by
name and the whole row as ``row``; the judge's also see ``response`` (the answer), ``parsed``, ``model``
and ``sample``, which win over a row field of the same name (``row.<field>`` still reaches it).

A null cell is rendered as ``[prompts] null`` says (by default it is refused, naming the row and
column), and a request whose rendered messages are longer than ``max_request_chars`` is refused
naming the row: both before any call. ``[prompts.judge] where`` and ``fraction`` choose the answers
the judge reads: ``where`` is evaluated over each answer, ``fraction`` draws a share of them by a hash
of (seed, row id, model, sample), so the same answers are chosen on every resume and in every mode.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from typing import Any

from punchline.cluster.stages.parse import Parser
from punchline.cluster.stages.rows import Row
from punchline.cluster.stages.settings import PromptsSettings, model_ref
from punchline.cluster.stages.templates import ChatTemplate, NullField, expression
from punchline.data.errors import ConfigError, InputError
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
        self.where: Any = None
        self.where_names: frozenset[str] = frozenset()
        if judge is not None and judge.where is not None:
            self.where, self.where_names = expression(judge.where, field="prompts.judge.where", file=file)
        judge_parse = judge.parse if judge is not None else None
        for key, parse in (("prompts.parse", settings.parse), ("prompts.judge.parse", judge_parse)):
            if parse is not None and parse.structured and parse.json_schema is None:
                raise ConfigError("needs json_schema (it is the format sent)", file=file, field=f"{key}.structured")
        null = settings.null
        self._null: object = "" if null == "empty" else None if null == "error" else null

    def providers(self) -> list[tuple[str, str]]:
        """(config key, provider name) of every provider the table names, for the config's check."""
        out = [("prompts.models", provider) for _, provider, _ in self.models]
        if self.judge_model is not None:
            out.append(("prompts.judge.model", self.judge_model[0]))
        return out

    def context(self, row: Row) -> dict[str, Any]:
        """The row's fields by name and as ``row``, its null cells as ``[prompts] null`` says."""
        fields = row.fields
        nulls = [k for k, v in fields.items() if v is None or (isinstance(v, float) and math.isnan(v))]
        if nulls:
            fields = dict(fields)
            for k in nulls:
                fields[k] = NullField(k) if self._null is None else self._null
        return {**fields, "row": fields}

    def _sized(self, messages: tuple[Message, ...], row: Row, data_file: str, what: str) -> tuple[Message, ...]:
        size = sum(len(m.content) for m in messages)
        limit = self.settings.max_request_chars
        if size > limit:
            raise InputError(
                f"{what} renders to {size:,} characters, over max_request_chars = {limit:,}",
                file=data_file,
                record=row.where,
                field="prompts.max_request_chars",
            )
        return messages

    def messages(self, row: Row, data_file: str) -> tuple[Message, ...]:
        messages = self.chat.render(self.context(row), file=data_file, record=row.where)
        return self._sized(messages, row, data_file, "the prompt")

    def judge_context(
        self, row: Row, *, response: str, parsed: Mapping[str, Any] | None, model: str, sample: int
    ) -> dict[str, Any]:
        """What the judge's templates and ``where`` see. ``parsed`` always has every field the parser can
        give (None when the answer did not parse), so ``parsed.<field>`` is defined for every answer."""
        names = self.parser.names if self.parser is not None else ()
        return {
            **self.context(row),
            "response": response,
            "parsed": {**dict.fromkeys(names), **(parsed or {})},
            "model": model,
            "sample": sample,
        }

    def drawn(self, row: Row, model: str, sample: int) -> bool:
        """Whether the answer is in the judge's ``fraction``: a hash of (seed, row id, model, sample), so the
        same answers are drawn on every resume and in every mode, known before any answer exists."""
        judge = self.settings.judge
        assert judge is not None
        if judge.fraction >= 1.0:
            return True
        seed = f"{judge.fraction_seed}\0{row.id}\0{model}\0{sample}".encode()
        return int.from_bytes(hashlib.sha256(seed).digest()[:8], "big") < judge.fraction * 2**64

    def judged(
        self, row: Row, *, response: str, parsed: Mapping[str, Any] | None, model: str, sample: int
    ) -> bool | str:
        """Whether the judge reads this answer (drawn, and ``where`` holds for it); a text saying why
        ``where`` could not be evaluated for it (a comparison of a null, say): that answer is not judged."""
        if not self.drawn(row, model, sample):
            return False
        if self.where is None:
            return True
        context = self.judge_context(row, response=response, parsed=parsed, model=model, sample=sample)
        try:
            return bool(self.where(**context))
        except Exception as exc:  # e.g. parsed.confidence < 0.5 for an answer that did not parse
            return f"[prompts.judge] where: {type(exc).__name__}: {exc}"[:300]

    def check_where(self, row: Row, data_file: str) -> None:
        """``where`` reads only names the judge sees (an undefined one is one line, before any call). It is
        not evaluated here: over a stand-in answer, a comparison with a null field could fail where no real
        answer would."""
        context = self.judge_context(row, response="", parsed=None, model="", sample=0)
        missing = sorted(self.where_names - set(context))
        if missing:
            raise InputError(f"[prompts.judge] where: {missing[0]!r} is undefined", file=data_file, record=row.where)

    def judge_messages(
        self, row: Row, data_file: str, *, response: str, parsed: Mapping[str, Any] | None, model: str, sample: int
    ) -> tuple[Message, ...]:
        """The judge's chat for one answer (unsized: the answer's length is the model's, see the judge stage)."""
        assert self.judge_chat is not None
        context = self.judge_context(row, response=response, parsed=parsed, model=model, sample=sample)
        return self.judge_chat.render(context, file=data_file, record=row.where)

    def judge_size(self, messages: tuple[Message, ...]) -> str | None:
        """Why a judge request may not be sent (over ``max_request_chars``), or None."""
        size = sum(len(m.content) for m in messages)
        limit = self.settings.max_request_chars
        if size <= limit:
            return None
        return f"the judge's request is {size:,} characters, over max_request_chars = {limit:,}"

    def check_rows(self, rows: list[Row], data_file: str) -> None:
        """Every row's messages render (all fields present, no template error), and so do the judge's
        over a stand-in answer — before any provider call."""
        for row in rows:
            self.messages(row, data_file)
            if self.judge_chat is not None:
                chat = self.judge_messages(row, data_file, response="", parsed=None, model="", sample=0)
                self._sized(chat, row, data_file, "the judge's prompt (without the answer)")
                self.check_where(row, data_file)
