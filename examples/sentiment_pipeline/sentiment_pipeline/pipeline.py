"""A two-stage punchline pipeline, written from punchline's docs (docs/architecture.md, "Pipelines").

Stage ``label``: one call per review asking a model for its sentiment (positive, negative or mixed).
Stage ``judge``: one call per answered review asking a second model whether the first one's answer is
right (an answer that is not a label is judged too: the judge decides).
The judge stage's reduce writes ``judged.jsonl`` (one row per review) and ``summary.json``.

Both ``plan`` methods are pure functions of the config and earlier artifacts, and both ``reduce``
methods pure functions of the results, which is all punchline needs for exactly-once, resume and
byte-identical artifacts.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import msgspec

from punchline.data.errors import ConfigError, InputError
from punchline.data.requests import Message, ProviderRequest
from punchline.data.units import UnitSpec

LABELS = ("positive", "negative", "mixed")
LABEL_SYSTEM = "You label the sentiment of product reviews. Answer with one word: positive, negative or mixed."
JUDGE_SYSTEM = "You check the sentiment labels of product reviews. Answer with one word: yes or no."


class StageSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    provider: str
    model: str
    max_tokens: Annotated[int, msgspec.Meta(ge=1, le=256)] = 4
    temperature: Annotated[float, msgspec.Meta(ge=0.0, le=2.0)] = 0.0


class SentimentSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    reviews: Annotated[str, msgspec.Meta(min_length=1)]  # JSONL: {"id": ..., "text": ...} per line
    label: StageSettings
    judge: StageSettings


class Review(msgspec.Struct, forbid_unknown_fields=True):
    id: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    text: Annotated[str, msgspec.Meta(min_length=1, max_length=20_000)]


class Labelled(msgspec.Struct, kw_only=True):
    id: str
    text: str
    label: str  # one of LABELS, or "unclear" when the answer is none of them, "failed" when the call failed
    answer: str | None


class Judged(Labelled, kw_only=True):
    verdict: str  # "agree" | "disagree" | "unclear" (neither) | "skipped" (no answer to judge)
    judge_answer: str | None


def reviews_path(cfg: Any) -> Path:
    """A relative path is relative to the config's folder."""
    path = Path(cfg.settings.reviews).expanduser()
    return path if path.is_absolute() or not cfg.source else Path(cfg.source).parent / path


def read_reviews(path: Path) -> list[Review]:
    """The reviews in file order; a bad line is one error naming file, line and field."""
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise InputError(f"cannot read the reviews: {exc.strerror}", file=str(path)) from None
    reviews: list[Review] = []
    seen: set[str] = set()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            review = msgspec.json.decode(line, type=Review)
        except msgspec.ValidationError as exc:
            field = str(exc).rpartition("at `$.")[2].rstrip("`") or None
            raise InputError(str(exc).partition(" - at")[0], file=str(path), record=n, field=field) from None
        except msgspec.DecodeError as exc:
            raise InputError(f"not a JSON object: {exc}", file=str(path), record=n) from None
        if review.id in seen:
            raise InputError(f"id {review.id!r} appears twice", file=str(path), record=n, field="id")
        seen.add(review.id)
        reviews.append(review)
    if not reviews:
        raise InputError("no reviews", file=str(path))
    return reviews


def first_word(text: str) -> str:
    words = text.strip().lower().split()
    return words[0].strip(".,!:;\"'") if words else ""


def request(cfg: Any, stage: StageSettings, system: str, user: str) -> ProviderRequest:
    return ProviderRequest(
        provider=stage.provider,
        model=cfg.provider(stage.provider).model_id(stage.model),
        messages=(Message("system", system), Message("user", user)),
        temperature=stage.temperature,
        max_tokens=stage.max_tokens,
    )


def judge_prompt(text: str, answer: str) -> str:
    return f"Review: {text}\nProposed sentiment: {answer.strip()}\nIs the proposed sentiment right?"


def unit_id(n: int) -> str:
    return f"{n:06d}"  # zero-padded: unit ids must come in strictly increasing order


class LabelStage:
    name = "label"

    def plan(self, ctx: Any) -> list[UnitSpec]:
        s = ctx.cfg.settings
        return [
            UnitSpec(unit_id=unit_id(n), request=request(ctx.cfg, s.label, LABEL_SYSTEM, r.text))
            for n, r in enumerate(read_reviews(reviews_path(ctx.cfg)))
        ]

    def reduce(self, ctx: Any, results: Any) -> list[str]:
        rows = []
        for n, r in enumerate(read_reviews(reviews_path(ctx.cfg))):
            result = results.get(unit_id(n))
            answer = result.response.texts[0] if result is not None and result.response else None
            word = first_word(answer) if answer is not None else ""
            label = word if word in LABELS else ("failed" if answer is None else "unclear")
            rows.append(Labelled(id=r.id, text=r.text, label=label, answer=answer))
        ctx.write_artifact("labels.jsonl", b"".join(msgspec.json.encode(row) + b"\n" for row in rows))
        return ["labels.jsonl"]


def read_labels(ctx: Any) -> list[Labelled]:
    return [msgspec.json.decode(line, type=Labelled) for line in ctx.read_artifact("labels.jsonl").splitlines()]


class JudgeStage:
    name = "judge"

    def plan(self, ctx: Any) -> list[UnitSpec]:
        s = ctx.cfg.settings
        return [
            UnitSpec(
                unit_id=unit_id(n), request=request(ctx.cfg, s.judge, JUDGE_SYSTEM, judge_prompt(r.text, r.answer))
            )
            for n, r in enumerate(read_labels(ctx))
            if r.answer is not None
        ]

    def reduce(self, ctx: Any, results: Any) -> list[str]:
        rows = []
        for n, r in enumerate(read_labels(ctx)):
            result = results.get(unit_id(n))
            answer = result.response.texts[0] if result is not None and result.response else None
            word = first_word(answer) if answer is not None else ""
            verdict = {"yes": "agree", "no": "disagree"}.get(word, "unclear" if answer is not None else "skipped")
            rows.append(Judged(**msgspec.structs.asdict(r), verdict=verdict, judge_answer=answer))
        ctx.write_artifact("judged.jsonl", b"".join(msgspec.json.encode(row) + b"\n" for row in rows))
        summary = {
            "reviews": len(rows),
            "labels": dict(sorted(Counter(r.label for r in rows).items())),
            "verdicts": dict(sorted(Counter(r.verdict for r in rows).items())),
        }
        ctx.write_artifact("summary.json", msgspec.json.format(msgspec.json.encode(summary), indent=2) + b"\n")
        return ["judged.jsonl", "summary.json"]


class Sentiment:
    """The pipeline object punchline's registry loads (``sentiment_pipeline.pipeline:Sentiment``)."""

    name = "sentiment"
    settings_type = SentimentSettings

    def check_settings(self, settings: SentimentSettings, source: str) -> None:
        if not settings.reviews.endswith(".jsonl"):
            raise ConfigError("the reviews file must be JSONL (*.jsonl)", file=source, field="sentiment.reviews")

    def provider_refs(self, settings: SentimentSettings) -> list[tuple[str, str]]:
        return [
            ("sentiment.label.provider", settings.label.provider),
            ("sentiment.judge.provider", settings.judge.provider),
        ]

    def stage_mode(self, settings: SentimentSettings, stage: str) -> None:
        return None  # the providers' own mode (online or batch)

    def input_paths(self, settings: SentimentSettings) -> list[str]:
        return [settings.reviews]

    def check_inputs(self, cfg: Any) -> None:
        read_reviews(reviews_path(cfg))

    def stages(self, cfg: Any) -> list[Any]:
        return [LabelStage(), JudgeStage()]

    def estimate(self, cfg: Any, stage: str) -> list[UnitSpec]:
        """For ``punchline plan``: the judge stage judges at most every review (priced with a one-word answer)."""
        if stage != "judge":
            return []
        s = cfg.settings
        reviews = read_reviews(reviews_path(cfg))
        return [
            UnitSpec(unit_id=unit_id(n), request=request(cfg, s.judge, JUDGE_SYSTEM, judge_prompt(r.text, "positive")))
            for n, r in enumerate(reviews)
        ]

    def headlines(self, ctx: Any) -> list[str]:
        try:
            summary = msgspec.json.decode(ctx.read_artifact("summary.json"))
        except FileNotFoundError:
            return []
        labels = ", ".join(f"{k} {v}" for k, v in summary["labels"].items())
        verdicts = ", ".join(f"{k} {v}" for k, v in summary["verdicts"].items())
        return [f"**sentiment** of {summary['reviews']} reviews: {labels}; the judge: {verdicts}"]

    def simulator_knobs(self, cfg: Any, sim: Any) -> Any:
        return sim
