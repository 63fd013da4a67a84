"""What the generic stages tell the simulated provider before it starts: what their answers parse into.

The simulator (:mod:`punchline.workers.fake`) sees only the HTTP request, so a stage's own prompt would get a
generic answer that its regex or schema never parses (issue 41: every model scored 0.0 offline). Instead, the
driver asks each stage (its ``simulated_answers(cfg)``) before the simulator starts, as a pipeline's
``simulator_knobs`` hook gives it knobs: the stage renders every row's prompt as it will send it and says, per
prompt, the row's reference (:class:`~punchline.data.answer_format.StageAnswers`). A judge renders every row's
prompt with the judged answer left out, so the simulator finds the answer in a judge's request, parses it as the
judged stage does and grades it against the row's reference.

A row's reference is the column ``[prompts] reference`` names (a ``Generate(..., reference="answer")``), else a
column named like a parsed field, else one of :data:`~punchline.data.answer_format.REFERENCE_COLUMNS`: the simulator is
a stand-in, so a good guess that makes a study's offline numbers plausible beats none.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from punchline.cluster.stages.parse import Parser
from punchline.cluster.stages.rows import Row
from punchline.cluster.stages.settings import ParseSettings, PromptsSettings
from punchline.data.answer_format import ANSWER_MARK, REFERENCE_COLUMNS, AnswerParse, JudgedPrompt, StageAnswers
from punchline.data.requests import Message

POOL_SIZE = 50  # distinct references kept as wrong answers for a parse that admits any text


def answer_parse(settings: ParseSettings | None) -> AnswerParse | None:
    """A ``parse`` table as the simulator reads it."""
    if settings is None:
        return None
    return AnswerParse(regex=settings.regex, flags=settings.flags, json_schema=settings.json_schema)


def reference_of(settings: PromptsSettings, parser: Parser | None, first: Row | None) -> tuple[str, str | None]:
    """(the rows' reference column, the parsed field it is compared with), from the ``first`` row's columns;
    the column is empty when there is none. The field is the one named like the column, else the parser's
    first (None: no parse step)."""
    columns = first.fields if first is not None else {}
    names = parser.names if parser is not None else ()
    column = settings.reference
    if column is None:
        column = next((n for n in names if n in columns), None)
    if column is None:
        column = next((c for c in REFERENCE_COLUMNS if c in columns), "")
    field = column if column in names else (names[0] if names else None)
    return column, field


def split_prompt(messages: Sequence[Message]) -> tuple[str, str]:
    """(system messages joined by blank lines, the last user message): what the simulator reads off a request."""
    system = "\n\n".join(m.content for m in messages if m.role == "system")
    user = next((m.content for m in reversed(messages) if m.role == "user"), "")
    return system, user


def model_names(models: Sequence[tuple[str, str, str]], model_id: Any) -> dict[str, list[str]]:
    """Model id -> the names a config may give it in ``[simulator] accuracy`` (its entry, nick, provider:nick)."""
    out: dict[str, list[str]] = {}
    for entry, provider, nick in models:
        out.setdefault(model_id(provider, nick), []).extend(dict.fromkeys([entry, nick, f"{provider}:{nick}"]))
    return out


def generate_answers(
    name: str,
    settings: PromptsSettings,
    parser: Parser | None,
    first: Row | None,
    prompts: Iterable[tuple[str, Any]],
    models: dict[str, list[str]],
) -> StageAnswers:
    """A generate stage's answers: ``prompts`` is each row's prompt digest and its reference, already found, in
    row order (a stream: the book keeps what it needs of it).

    Without a parse step, a prompt whose row has no reference is left out of the book: the simulator answers it
    as it answers a prompt not in the book (a stage's free-text answer is its reference or another row's, so one
    without a reference has none to give). A study without references, as a load test, thus gives the simulator
    an empty book, not a digest per row (issue 42)."""
    _, field = reference_of(settings, parser, first)
    keep_all = settings.parse is not None
    book: dict[str, Any] = {}
    for digest, reference in prompts:  # the last row's reference wins, at the first row's place
        if keep_all or reference is not None or digest in book:
            book[digest] = reference
    if not keep_all:
        book = {d: r for d, r in book.items() if r is not None}
    pool = list(dict.fromkeys(str(v) for v in book.values() if v is not None))[:POOL_SIZE]
    return StageAnswers(
        stage=name, parse=answer_parse(settings.parse), field=field, prompts=book, pool=pool, models=models
    )


def judged_prompt(messages: Sequence[Message], reference: Any) -> JudgedPrompt:
    """A row's judge prompt rendered over :data:`ANSWER_MARK`, cut into the texts around the answer."""
    system, user = split_prompt(messages)
    return JudgedPrompt(pieces=f"{system}\0{user}".split(ANSWER_MARK), reference=reference)


def judge_answers(
    name: str,
    settings: PromptsSettings,
    parser: Parser | None,
    first: Row | None,
    judged: list[JudgedPrompt],
    models: dict[str, list[str]],
) -> StageAnswers:
    """A judge stage's answers: its verdict's parse, and every row's prompt with the judged answer left out."""
    assert settings.judge is not None
    _, field = reference_of(settings, parser, first)
    verdict = Parser(settings.judge.parse, field="prompts.judge.parse") if settings.judge.parse else None
    return StageAnswers(
        stage=name,
        parse=answer_parse(settings.judge.parse),
        field=verdict.names[0] if verdict is not None and verdict.names else None,
        judged=[j for j in judged if len(j.pieces) > 1],
        judged_parse=answer_parse(settings.parse),
        judged_field=field,
        models=models,
    )


def marked_parse(parser: Parser | None) -> dict[str, str]:
    """The ``parsed`` a judge's template sees while its prompt is rendered for the simulator: each field the
    answer's mark."""
    return dict.fromkeys(parser.names if parser is not None else (), ANSWER_MARK)
