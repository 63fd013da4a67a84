"""The simulator's answers to a run's generic stages: what each stage parses, right as often as its model's accuracy.

Before the simulator starts, the driver asks each generic stage (a ``[prompts]`` study's, a plug-in's ``Generate``
or ``Judge``) what its requests are and how their answers parse
(:class:`~punchline.data.answer_format.StageAnswers`, handed to the server beside its knobs: a run's own, not a
knob). A request whose prompt is one of a generate stage's is answered so that it parses: its regex's named
groups, or JSON valid against its schema (:mod:`.regex_text`, :mod:`.json_text`), with the compared field drawn
*right* (the row's reference) at the model's rate (``[simulator] accuracy``), else another value the parse admits
(another of a few values: ``[ABCD]``, an ``enum``; else another option of the prompt's ``Options:`` line or
another row's reference; else another text). A request whose prompt is a judge's is found by its prompt around
the judged answer; the answer is parsed as the judged stage parses it and graded against the row's reference,
and the verdict (the judge's first parsed field: ``correct``/``incorrect``, ``yes``/``no``, ``1``/``0``, ...) is
the true one at the judge's rate.

Every draw is a pure function of (seed, model, request, choice), as the simulator's other draws are, so a
replayed request gets the same answer. A model ``[simulator] accuracy`` leaves out is right as often as its size
says (a judge: ``1 - judge_flip_rate``). A row without a reference gets a valid answer drawn at random; a judge
of it, a verdict drawn at random.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from punchline.data.answer_format import AnswerParse, JudgedPrompt, StageAnswers, json_of, prompt_digest
from punchline.data.errors import ConfigError
from punchline.data.simulator import FakeConfig, SimRequest, by_size, rng_for
from punchline.workers.fake.formats.json_text import SchemaText
from punchline.workers.fake.formats.regex_text import RegexText

GENERIC_WORDS: tuple[str, ...] = ("time", "way", "day", "friend", "idea", "reason", "problem", "plan", "home", "job")
#: (a verdict saying the answer is right, one saying it is wrong), the first pair the judge's parse admits
VERDICT_PAIRS: tuple[tuple[Any, Any], ...] = (
    ("correct", "incorrect"),
    ("CORRECT", "INCORRECT"),
    ("Correct", "Incorrect"),
    ("yes", "no"),
    ("Yes", "No"),
    ("YES", "NO"),
    ("true", "false"),
    ("right", "wrong"),
    ("pass", "fail"),
    ("1", "0"),
    (True, False),
    (1, 0),
)
_OPTIONS_RE = re.compile(r"^Options:[ \t]*(.+)$", re.M)


def prompt_options(text: str) -> list[str]:
    """The options of a prompt's ``Options: a | b | c`` line (none: [])."""
    found = _OPTIONS_RE.search(text)
    return [o.strip() for o in found.group(1).split("|") if o.strip()] if found is not None else []


def default_accuracy(model: str) -> float:
    """A model's rate when ``[simulator] accuracy`` does not name it: growing with its size (8B: 0.48, 70B: 0.67)."""
    return by_size(model, {}, base=0.3, per_decade=0.2, cap=0.95)


class Writer:
    """One parse step (regex or schema), able to write an answer whose ``field`` parses to a chosen value."""

    def __init__(self, parse: AnswerParse) -> None:
        self.regex = RegexText(parse.regex, parse.flags) if parse.regex is not None else None
        self.schema = SchemaText(parse.json_schema) if parse.json_schema is not None else None

    @property
    def names(self) -> tuple[str, ...]:
        return self.regex.names if self.regex is not None else self.schema.names if self.schema is not None else ()

    def values(self, name: str | None) -> list[Any] | None:
        if name is None:
            return None
        if self.regex is not None:
            return self.regex.values(name)
        return self.schema.values(name) if self.schema is not None else None

    def coerce(self, name: str | None, value: Any) -> Any:
        """A row's reference as the parse gives it (a regex's groups are texts; a schema's field has its type)."""
        if name is None or value is None:
            return value
        if self.regex is not None:
            return value if isinstance(value, str) else str(value)
        return self.schema.coerce(name, value) if self.schema is not None else value

    def write(self, name: str | None, value: Any, variant: bool) -> str | None:
        """An answer whose ``name`` parses to ``value`` (a variant's way, when ``variant``), or None if none can."""
        values = {} if name is None else {name: value}
        if self.regex is not None:
            text = self.regex.text(values)
            if text is not None and variant and self.regex.reads(f"Let me think.\n{text}", values):
                return f"Let me think.\n{text}"
            return text
        if self.schema is None:
            return None
        text = self.schema.text(values)
        return f"```json\n{text}\n```" if text is not None and variant else text

    def read(self, text: str, name: str | None) -> Any:
        """What ``text`` parses to in ``name`` (None: it does not parse), as the stage reads it (no schema check)."""
        if self.regex is not None:
            match = self.regex.pattern.search(text)
            return match.groupdict().get(name) if match is not None and name is not None else None
        value, error = json_of(text)
        if error is not None:
            return None
        return value.get(name) if isinstance(value, dict) and name is not None else value


@dataclass
class Stage:
    """One stage's answers, compiled once: its writer and what its accuracy is read by."""

    answers: StageAnswers
    writer: Writer | None
    judged: Writer | None = None
    verdicts: tuple[Any, Any] | None = None
    _judge_index: JudgeIndex | None = field(default=None, repr=False)

    @classmethod
    def of(cls, answers: StageAnswers) -> Stage:
        writer = Writer(answers.parse) if answers.parse is not None else None
        stage = cls(answers, writer)
        if answers.is_judge:
            stage.judged = Writer(answers.judged_parse) if answers.judged_parse is not None else None
            stage.verdicts = _verdicts(writer, answers.field) if writer is not None else None
            stage._judge_index = JudgeIndex(answers.judged)
        return stage

    def rate(self, model: str, accuracy: Mapping[str, float], judge_flip_rate: float) -> float:
        for name in (model, *self.answers.models.get(model, ())):
            if name in accuracy:
                return accuracy[name]
        return 1.0 - judge_flip_rate if self.answers.is_judge else default_accuracy(model)


def _verdicts(writer: Writer, name: str | None) -> tuple[Any, Any] | None:
    """(right, wrong): the first of :data:`VERDICT_PAIRS` whose both verdicts the judge's parse can be given."""
    few = writer.values(name)
    for right, wrong in VERDICT_PAIRS:
        if few is not None and (right not in few or wrong not in few):
            continue
        if writer.write(name, right, False) is not None and writer.write(name, wrong, False) is not None:
            return right, wrong
    return (few[0], few[-1]) if few is not None and len(few) >= 2 else None


class JudgeIndex:
    """A judge's rows' prompts (the answer left out), found from a request's prompt: by the text before the answer
    and the text after it (indexed by their lengths), then matched whole."""

    def __init__(self, judged: Sequence[JudgedPrompt]) -> None:
        self.judged = list(judged)
        self.heads: dict[int, dict[str, list[int]]] = {}
        self.tails: dict[int, dict[str, list[int]]] = {}
        for i, j in enumerate(self.judged):
            head, tail = j.pieces[0], j.pieces[-1]
            self.heads.setdefault(len(head), {}).setdefault(head, []).append(i)
            self.tails.setdefault(len(tail), {}).setdefault(tail, []).append(i)
        self._patterns: dict[int, re.Pattern[str]] = {}

    def find(self, text: str) -> tuple[str, JudgedPrompt] | None:
        """(the answer inside ``text``, the row's judged prompt), or None when it is none of the judge's."""
        heads = {i for n, by in self.heads.items() if n <= len(text) for i in by.get(text[:n], ())}
        if not heads:
            return None
        tails = {i for n, by in self.tails.items() if n <= len(text) for i in by.get(text[len(text) - n :], ())}
        for i in sorted(heads & tails):
            pattern = self._patterns.get(i)
            if pattern is None:
                pieces = [re.escape(p) for p in self.judged[i].pieces]
                body = pieces[0] + "(.*?)" + pieces[1] + "".join("(?:.*?)" + p for p in pieces[2:])
                pattern = self._patterns[i] = re.compile(body, re.S)
            match = pattern.fullmatch(text)
            if match is not None:
                return match.group(1), self.judged[i]
        return None


class StageBook:
    """Every generic stage's answers of a run (the server's ``stages``), looked up by a request's prompt."""

    def __init__(
        self, stages: Sequence[StageAnswers], accuracy: Mapping[str, float], judge_flip_rate: float = 0.05
    ) -> None:
        self.accuracy = dict(accuracy)
        self.judge_flip_rate = judge_flip_rate
        self.by_prompt: dict[str, tuple[Stage, Any]] = {}
        self.judges: list[Stage] = []
        for answers in stages:
            stage = Stage.of(answers)
            if answers.is_judge:
                self.judges.append(stage)
            for digest, reference in answers.prompts.items():
                self.by_prompt.setdefault(digest, (stage, reference))

    def __bool__(self) -> bool:
        return bool(self.by_prompt or self.judges)

    def answer(self, request: SimRequest) -> str | None:
        """The answer to ``request`` if it is one of the stages' (None: not theirs, or nothing to say of it)."""
        found = self.by_prompt.get(prompt_digest(request.system, request.user))
        if found is not None:
            return self._generate(request, *found)
        if self.judges:
            text = f"{request.system}\0{request.user}"
            for stage in self.judges:
                assert stage._judge_index is not None
                hit = stage._judge_index.find(text)
                if hit is not None:
                    return self._judge(request, stage, *hit)
        return None

    def _draw(self, request: SimRequest, stage: Stage) -> tuple[bool, random.Random]:
        """Whether this answer is right, and the rest of its draws: (seed, model, request, choice) alone."""
        rng = rng_for(
            request.seed, request.key, 0 if request.greedy else request.choice, f"stage:{stage.answers.stage}"
        )
        return rng.random() < stage.rate(request.model, self.accuracy, self.judge_flip_rate), rng

    def _generate(self, request: SimRequest, stage: Stage, reference: Any) -> str | None:
        right, rng = self._draw(request, stage)
        variant = rng.random() < request.format_variant_rate
        writer, name = stage.writer, stage.answers.field
        if writer is None:  # free text: the reference itself, or another text
            if reference is None:
                return None
            if right:
                return str(reference)
            return _pick(rng, _wrong_pool(request, stage, str(reference), None), lambda v: str(v)) or "I do not know."
        reference = writer.coerce(name, reference)
        if reference is not None and right:
            text = writer.write(name, reference, variant)
            if text is not None:
                return text
        return _pick(rng, _wrong_pool(request, stage, reference, writer), lambda v: writer.write(name, v, variant))

    def _judge(self, request: SimRequest, stage: Stage, answer: str, judged: JudgedPrompt) -> str | None:
        writer, verdicts = stage.writer, stage.verdicts
        if writer is None or verdicts is None:
            return None
        right, rng = self._draw(request, stage)
        if judged.reference is None:
            truth = rng.random() < 0.5
        else:
            # the answer as the judged stage parses it; a text that does not parse is a field the judge's template
            # wrote in its place (``{{ parsed.answer }}``), compared as it is
            name, judged_writer = stage.answers.judged_field, stage.judged
            value = judged_writer.read(answer, name) if judged_writer is not None else None
            reference = judged_writer.coerce(name, judged.reference) if judged_writer is not None else judged.reference
            truth = _same(answer.strip() if value is None else value, reference)
        verdict = verdicts[0] if truth == right else verdicts[1]
        return writer.write(stage.answers.field, verdict, rng.random() < request.format_variant_rate)


def _same(value: Any, reference: Any) -> bool:
    """A parsed value is the reference (a text the same but for surrounding spaces: ``"3"`` is 3)."""
    return bool(value == reference or str(value).strip() == str(reference).strip())


def _wrong_pool(request: SimRequest, stage: Stage, reference: Any, writer: Writer | None) -> list[list[Any]]:
    """The values a wrong (or reference-less) answer is drawn from, in tiers tried in turn: the parse's few values,
    else the prompt's options, other rows' references, common words; never the reference."""
    name = stage.answers.field
    few = writer.values(name) if writer is not None else None
    tiers: list[list[Any]] = (
        [list(few)]
        if few is not None
        else [prompt_options(request.text), list(stage.answers.pool), list(GENERIC_WORDS)]
    )
    if writer is not None and few is None:
        tiers = [[writer.coerce(name, v) for v in tier] for tier in tiers]
    return [[v for v in tier if v != reference] for tier in tiers]


def _pick(rng: random.Random, tiers: list[list[Any]], write: Callable[[Any], str | None]) -> str | None:
    """A written answer of a value drawn from the first tier that has one the parse can be given (None: none)."""
    for tier in tiers:
        options = list(tier)
        rng.shuffle(options)
        for value in options:
            text = write(value)
            if text is not None:
                return text
    return None


def stage_answers(
    sim: FakeConfig, stages: Iterable[object], cfg: object, file: str | None = None
) -> list[StageAnswers]:
    """The answers of every stage that says them (its ``simulated_answers(cfg)``: the generic stages, a plug-in's
    ``Generate``/``Judge``), asked in the driver before the simulator starts. A ``[simulator] accuracy`` key of
    ``sim`` naming no model of those stages is a ConfigError naming it (a typo would silently change nothing)."""
    found: list[StageAnswers] = []
    for stage in stages:
        own = getattr(stage, "simulated_answers", None)
        if callable(own):
            found.extend(own(cfg))
    names = sorted({n for a in found for model, more in a.models.items() for n in (model, *more)})
    for key in sim.accuracy:
        if key not in names:
            has = f"its generic stages' models: {', '.join(names)}" if names else "it has no generic stage"
            raise ConfigError(
                f"names no model of this run ({has}); accuracy applies to the answers of generic stages "
                "(Generate, Judge, [prompts])",
                file=file,
                field=f"simulator.accuracy.{key}",
            )
    return found
