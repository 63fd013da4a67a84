"""What a generic stage's answers must look like, as the stage and the simulated provider both read it.

The generic stages (``cluster/stages/``) parse answers by a regex or a JSON schema; the simulated provider
(``workers/fake/``) must write answers that parse so, right as often as ``[simulator] accuracy`` says. The
simulator only sees the HTTP request, so before it starts the driver asks each generic stage what its requests
are and what they parse into (:class:`StageAnswers`: the parse step, and per prompt the row's reference), and
hands that to the simulator beside its knobs. This module, on the ground floor, is what both sides import: the
structs, the rule that finds an answer's JSON value (:func:`json_of`), and the prompt digest both compute.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import msgspec

#: the usual names of a row's reference answer, most likely first: the column the simulator grades against when a
#: stage names none (``cluster/stages/simulate.py``), and what the viewer marks as a unit's reference
#: (``viewer/references.py``, which marks a few more names: marking is only shown, never graded)
REFERENCE_COLUMNS = ("answer", "reference", "expected", "label", "gold", "target")
_FENCE = re.compile(r"```(?:json|JSON)?[ \t]*\n(.*?)\n?```", re.S)


class AnswerParse(msgspec.Struct, frozen=True, kw_only=True):
    """A stage's parse step: a regex (its named groups, ``flags`` of ``imsx``) or a JSON schema."""

    regex: str | None = None
    flags: str = ""
    json_schema: dict[str, Any] | None = None

    @property
    def how(self) -> str:
        """How it parses, in a few words for a warning line: ``regex <its text>`` or ``JSON schema``."""
        if self.regex is not None:
            shown = self.regex if len(self.regex) <= 60 else self.regex[:57] + "..."
            return f"regex {shown}"
        return "JSON schema"


class JudgedPrompt(msgspec.Struct, frozen=True, array_like=True):
    """One row's judge prompt with the answer left out: the literal texts around each place the answer (or a
    field parsed from it) is written, and the row's reference (None: the row has none)."""

    pieces: list[str]
    reference: Any = None


class StageAnswers(msgspec.Struct, frozen=True, kw_only=True):
    """One generic stage's requests, as the simulator recognises and answers them.

    ``prompts``: the digest of each row's prompt (:func:`prompt_digest`) -> the row's reference (None: none);
    ``field``: the parsed field the reference is compared with; ``pool``: some of the rows' references (wrong
    answers are drawn from them when the parse admits any text). A judge stage has ``judged`` (its rows' prompts,
    the answer left out) and ``judged_parse``/``judged_field`` (how the judged answers parse) instead of
    ``prompts``. ``models``: model id -> the names a config gives it (``[simulator] accuracy`` may use any)."""

    stage: str
    parse: AnswerParse | None = None
    field: str | None = None
    prompts: dict[str, Any] = {}
    pool: list[Any] = []
    judged: list[JudgedPrompt] = []
    judged_parse: AnswerParse | None = None
    judged_field: str | None = None
    models: dict[str, list[str]] = {}

    @property
    def is_judge(self) -> bool:
        return bool(self.judged)


#: stands for the answer (and each field parsed from it) where a judge's prompt is rendered for the simulator;
#: private-use characters, which no row or template holds
ANSWER_MARK = "\ue000answer\ue001"


def prompt_digest(system: str, user: str) -> str:
    """The key of a prompt in :attr:`StageAnswers.prompts`: its system messages (joined by blank lines) and its
    last user message, as the simulator reads them off a request."""
    return hashlib.sha256(f"{system}\0{user}".encode()).hexdigest()[:32]


def json_of(text: str) -> tuple[Any, str | None]:
    """The JSON value an answer holds: the text itself, else its fenced block, else its outermost span; or
    (None, why not)."""
    candidates = [text.strip()]
    fence = _FENCE.search(text)
    if fence is not None:
        candidates.append(fence.group(1).strip())
    for open_, close in (("{", "}"), ("[", "]")):
        start, end = text.find(open_), text.rfind(close)
        if 0 <= start < end:
            candidates.append(text[start : end + 1])
    for candidate in candidates:
        try:
            return json.loads(candidate), None
        except ValueError:
            continue
    return None, "no JSON value in the answer"
