"""The two LLM-judge metrics: a judge model compares a model's answer with the reference.

**MERA's judge** (``judge_mera``, pinned to MERA-Evaluation/MERA ``benchmark_tasks/mera_judge.py`` at
4310d9836d03a1e70128fd65095cf6d04f96942b): one fixed Russian prompt (task text, reference, the answer, the
criterion "Правильность ответа" with a 0/1/2 rubric) as a single user message, temperature 0, 256 tokens; the
last number in the reply, divided by 2 and clamped into [0, 1]; the best over MERA's readings of the answer
(:func:`punchline.pipelines.humor.data.mera.mera_readings`, one call each); a failed call or an unreadable reply scores
0, never retried for its content (MERA does not retry either).

**Our judge** (``judge``), below it. Scale: **binary, 0 or 1** (1 = the answer names the same class, allowing
minor variations in wording, *and* the same letter as the reference). A binary score makes agreement with
exact match directly comparable (rate and Cohen's kappa). The judge must answer with exactly one line ``SCORE:
0`` or ``SCORE: 1``; anything else raises :class:`JudgeParseError`, a retryable provider error, so the engine
asks again. A judgement that still fails after the retries is *missing* (``None``), never 0.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import msgspec

from punchline.data.errors import InputError, RetryableProviderError
from punchline.data.requests import Message, ProviderRequest, ProviderResponse
from punchline.data.storage.jsonio import reject_duplicate_keys
from punchline.pipelines.humor.data.prompts import mera_task_text, render_prompt
from punchline.pipelines.humor.data.schema import HumorItem

SCORE_MIN = 0.0
SCORE_MAX = 1.0
DEFAULT_THRESHOLD = 1.0
JUDGE_MAX_TOKENS = 16

JUDGE_MARKER = "JUDGE"
"""In every judge prompt, so that the simulated provider answers it with a score line."""
REFERENCE_LABEL = "Эталонный ответ:"
ANSWER_BEGIN = "=== ОТВЕТ МОДЕЛИ ==="
ANSWER_END = "=== КОНЕЦ ОТВЕТА МОДЕЛИ ==="

JUDGE_SYSTEM = (
    f"{JUDGE_MARKER} Вы — строгий и беспристрастный эксперт, проверяющий ответы на задание по "
    "классификации юмористических текстов."
)
_JUDGE_USER = """{marker}
Оцените ответ модели на задание ниже, сравнив его с эталонным ответом.

Ответ считается верным (1), если в нём назван тот же класс юмористического эффекта, что и в эталоне
(допускаются незначительные отличия в написании: регистр, кавычки, «ё»/«е», пунктуация), и выбрана та же
буква дополнительного текста. Во всех остальных случаях, в том числе если класс или буква не названы или
названо несколько вариантов, ответ неверный (0).

=== ЗАДАНИЕ ===
{task}
=== КОНЕЦ ЗАДАНИЯ ===

{reference_label} {reference}

{answer_begin}
{answer}
{answer_end}

Выведите ровно одну строку в формате
SCORE: <0 или 1>"""

_SCORE_LINE = re.compile(r"^\s*\**\s*SCORE\s*\**\s*:\s*\**\s*(?P<value>[-+]?\d+(?:\.\d+)?)\s*\**\s*$", re.IGNORECASE)
_SCORE_WORD = re.compile(r"SCORE\s*:", re.IGNORECASE)


MERA_CRITERIA_NAME = "Правильность ответа"
MERA_CRITERIA_RUBRICS = """0: Дан неправильный ответ или ответ отсутствует.

1: Ответ модели неполный (не на все вопросы задания получен ответ, в формулировке ответа отсутствует часть информации).

2: Ответ модели совпадает с эталонным или эквивалентен ему."""
MERA_REFERENCE_HEADER = "### Эталонный ответ:"
MERA_ANSWER_HEADER = "### Ответ для оценки:"
MERA_CRITERIA_HEADER = "### Критерий оценки:"
MERA_JUDGE_TEMPLATE = f"""### Задание для оценки:
{{instruction}}

{MERA_REFERENCE_HEADER}
{{reference_answer}}

{MERA_ANSWER_HEADER}
{{answer}}

{MERA_CRITERIA_HEADER}
{{criteria_name}}

### Шкала оценивания по критерию:
{{criteria_rubrics}}"""
MERA_JUDGE_MAX_SCORE = 2.0
MERA_JUDGE_MAX_TOKENS = 256  # lm-eval's compute_llm_judge default
_MERA_FIELD = re.compile(r"\{(instruction|reference_answer|answer|criteria_name|criteria_rubrics)\}")
_MERA_NUMBER = re.compile(r"(\d+(?:\.\d+)?)")  # compute_llm_judge: every number; the last is the score


def mera_judge_prompt(item: HumorItem, answer: str) -> str:
    """MERA's judge prompt for one reading of an answer, filled in one pass (no text is re-scanned)."""
    values = {
        "instruction": mera_task_text(item),
        "reference_answer": item.outputs,
        "answer": answer,
        "criteria_name": MERA_CRITERIA_NAME,
        "criteria_rubrics": MERA_CRITERIA_RUBRICS,
    }
    return _MERA_FIELD.sub(lambda m: values[m.group(1)], MERA_JUDGE_TEMPLATE)


def mera_judge_request(provider: str, model_id: str, item: HumorItem, answer: str) -> ProviderRequest:
    """The request MERA's judge sends for one reading: one user message, temperature 0, 256 tokens."""
    return ProviderRequest(
        provider=provider,
        model=model_id,
        messages=(Message("user", mera_judge_prompt(item, answer)),),
        temperature=0.0,
        max_tokens=MERA_JUDGE_MAX_TOKENS,
    )


def mera_judge_score(reply: str | None) -> float:
    """A MERA judge reply on the [0, 1] scale, read as MERA reads it: lm-eval's ``compute_llm_judge``
    (``lm_eval/api/metrics_generative.py`` of the harness fork at 1a8000e7526d4b2c60f6d4410eeecac2d30714b5, the
    version whose ``judge_prompt`` argument ``mera_judge.py`` calls) takes the *last* number in the reply, and
    ``normalize_score`` divides it by 2 and clamps it into [0, 1] ("2 из 2" -> 1, "1 (шкала 0-2)" -> 1, "12" -> 1);
    a reply without a number, or a failed call, scores 0."""
    numbers = _MERA_NUMBER.findall(reply) if reply is not None else []
    if not numbers:
        return 0.0
    return min(max(float(numbers[-1]) / MERA_JUDGE_MAX_SCORE, 0.0), 1.0)


class JudgeParseError(RetryableProviderError):
    """The judge did not return exactly one valid score line; asking again may help."""


def judge_request(
    provider: str, model_id: str, item: HumorItem, answer_text: str, *, max_tokens: int = JUDGE_MAX_TOKENS
) -> ProviderRequest:
    """The judge's request (temperature 0) for one item and the evaluated model's raw answer."""
    user = _JUDGE_USER.format(
        marker=JUDGE_MARKER,
        task=render_prompt(item),
        reference_label=REFERENCE_LABEL,
        reference=item.outputs,
        answer_begin=ANSWER_BEGIN,
        answer=answer_text,
        answer_end=ANSWER_END,
    )
    return ProviderRequest(
        provider=provider,
        model=model_id,
        messages=(Message("system", JUDGE_SYSTEM), Message("user", user)),
        temperature=0.0,
        max_tokens=max_tokens,
    )


def parse_score(text: str) -> float:
    """The score of a judge's reply: exactly one ``SCORE: x`` line with ``x`` in [0, 1]."""
    lines = [line for line in text.splitlines() if _SCORE_WORD.search(line)]
    if len(lines) != 1:
        raise JudgeParseError(f"expected exactly one 'SCORE:' line, found {len(lines)}: {text[:200]!r}")
    m = _SCORE_LINE.match(lines[0])
    if m is None:
        raise JudgeParseError(f"malformed score line {lines[0][:100]!r}")
    value = float(m.group("value"))
    if not SCORE_MIN <= value <= SCORE_MAX:
        raise JudgeParseError(f"score {value} outside [{SCORE_MIN}, {SCORE_MAX}]")
    return value


class JudgeStats(msgspec.Struct, kw_only=True):
    """Judge results and their agreement with the exact match (over items with a judgement)."""

    scale: str = "binary 0/1"
    threshold: float
    n_scored: int
    n_missing: int
    mean_score: float | None
    pass_rate: float | None  # share of judged items with score >= threshold
    agreement_with_em: float | None
    kappa_with_em: float | None  # None when undefined (both raters constant and equal)


def cohen_kappa(a: Sequence[int], b: Sequence[int]) -> float | None:
    """Cohen's kappa of two binary raters; None when chance agreement is 1 (kappa undefined)."""
    n = len(a)
    if n == 0 or n != len(b):
        return None
    po = sum(1 for x, y in zip(a, b, strict=True) if x == y) / n
    pa, pb = sum(a) / n, sum(b) / n
    pe = pa * pb + (1 - pa) * (1 - pb)
    if pe >= 1.0:
        return None
    return (po - pe) / (1 - pe)


def judge_stats(
    scores: Mapping[int, float | None], em: Mapping[int, int], *, threshold: float = DEFAULT_THRESHOLD
) -> JudgeStats:
    """``scores``: item id -> judge score or None (failed after retries); ``em``: item id -> 0/1.

    Ids of ``em`` absent from ``scores`` count as missing judgements.
    """
    judged = [(i, s) for i, s in scores.items() if s is not None and i in em]
    n_missing = sum(1 for i in em if scores.get(i) is None)
    if not judged:
        return JudgeStats(
            threshold=threshold,
            n_scored=0,
            n_missing=n_missing,
            mean_score=None,
            pass_rate=None,
            agreement_with_em=None,
            kappa_with_em=None,
        )
    passed = [int(s >= threshold) for _, s in judged]
    ems = [int(em[i]) for i, _ in judged]
    n = len(judged)
    return JudgeStats(
        threshold=threshold,
        n_scored=n,
        n_missing=n_missing,
        mean_score=sum(s for _, s in judged) / n,
        pass_rate=sum(passed) / n,
        agreement_with_em=sum(1 for p, e in zip(passed, ems, strict=True) if p == e) / n,
        kappa_with_em=cohen_kappa(passed, ems),
    )


class JudgeScoreLine(msgspec.Struct):
    """One line of a judge-scores JSONL file: a score (``null`` = failed), or the judge's raw text;
    ``failed_calls``: how many of the item's judge calls failed (MERA's judge: each scored 0)."""

    id: int
    score: float | None = None
    text: str | None = None
    failed_calls: int = 0


def _our_reply_score(text: str) -> float | None:
    try:
        return parse_score(text)
    except JudgeParseError:
        return None


def load_mera_judge_scores(path: str | os.PathLike[str]) -> dict[int, float]:
    """The same JSONL for MERA's judge: ``score`` in [0, 1] (the rubric over 2), or the judge's raw ``text``
    read as MERA reads it; an unreadable reply or ``null`` scores 0, as in MERA."""
    return {i: s or 0.0 for i, s in load_judge_scores(path, reply_score=mera_judge_score).items()}


def count_failed_calls(path: str | os.PathLike[str]) -> int:
    """The judge calls a scores file records as failed (its lines' ``failed_calls``; read after
    :func:`load_judge_scores` has checked the file)."""
    decoder = msgspec.json.Decoder(JudgeScoreLine)
    return sum(decoder.decode(line).failed_calls for line in Path(path).read_bytes().splitlines() if line.strip())


def load_judge_scores(
    path: str | os.PathLike[str], *, reply_score: Callable[[str], float | None] = _our_reply_score
) -> dict[int, float | None]:
    """JSONL ``{"id": int, "score": number|null}`` or ``{"id": int, "text": "<judge reply>"}``.

    A raw text that does not parse is a missing judgement (None), as is ``"score": null``; a score
    outside the scale or a bad line is an :class:`InputError` naming the line. ``reply_score`` reads a
    raw reply (our binary judge's by default).
    """
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", file=str(p)) from None
    decoder = msgspec.json.Decoder(JudgeScoreLine)
    out: dict[int, float | None] = {}
    for lineno, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"line {lineno}"
        try:
            rec = decoder.decode(line)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise InputError(str(exc), file=str(p), record=where) from None
        reject_duplicate_keys(line, source=str(p), record=where)
        if rec.id in out:
            raise InputError(f"id {rec.id} repeated", file=str(p), record=where, field="id")
        score = rec.score
        if score is None and rec.text is not None:
            score = reply_score(rec.text)
        if rec.failed_calls < 0:
            raise InputError("failed_calls is negative", file=str(p), record=where, field="failed_calls")
        if score is not None and not SCORE_MIN <= score <= SCORE_MAX:
            message = f"score {score} outside [{SCORE_MIN:g}, {SCORE_MAX:g}]"
            raise InputError(message, file=str(p), record=where, field="score")
        out[rec.id] = score
    return out


def check_score(response: ProviderResponse) -> None:
    """The judge stage's response validator (``UnitSpec.check``): the answer must hold a valid score."""
    try:
        parse_score(response.texts[0])
    except Exception as exc:
        raise RetryableProviderError(f"judge answer has no valid score: {exc}") from None
