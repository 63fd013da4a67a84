"""Scores of a set of model answers against the references.

``em`` uses the robust :mod:`punchline.pipelines.humor.data.parser` (class compared by
:func:`~punchline.pipelines.humor.data.schema.class_key`, i.e. case-insensitive with ё == е, and the letter);
``em_mera`` is the official reading (:mod:`punchline.pipelines.humor.data.mera`). ``ambiguous`` counts the answers
the parser refused because they hedge (several classes or letters) or contradict themselves; they are
also parse failures. Items without a prediction are scored as an empty answer (wrong) and counted in
``n_missing``. The precision of a class never predicted, the recall of a class absent from the references, are
undefined (``None``, shown ``n/a``), not 0; F1 is ``2·correct / (support + predicted)``, undefined only for a class
neither present nor predicted (so a class present but never predicted has F1 0, as sklearn's
``zero_division=0`` gives it). Intervals are 95 % (:mod:`punchline.data.metrics`): Wilson score intervals for the
rates (EM under both readings, class accuracy, each class's precision and recall), and for each class's F1 a
percentile bootstrap over items, seeded so reports are reproducible.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

import msgspec

from punchline.data.errors import InputError
from punchline.data.metrics.intervals import Interval, quantile, ratio, wilson
from punchline.pipelines.humor.data.mera import em_mera as _em_mera
from punchline.pipelines.humor.data.parser import ParsedAnswer, parse_answer
from punchline.pipelines.humor.data.schema import CLASSES, LETTERS, NOT_A_JOKE, HumorItem, class_key, split_output

UNPARSED = "<unparsed>"


class ClassStats(msgspec.Struct):
    support: int  # reference items of the class
    predicted: int  # items predicted as the class
    correct: int
    precision: float | None  # None: undefined (the class was never predicted)
    recall: float | None  # None: undefined (no reference item of the class)
    f1: float | None  # None: undefined (neither present nor predicted)


class ClassIntervals(msgspec.Struct):
    """95 % intervals of one class's precision and recall (Wilson) and F1 (bootstrap); None where undefined."""

    precision: Interval | None
    recall: Interval | None
    f1: Interval | None


class ConfusionMatrix(msgspec.Struct):
    """``counts[i][j]``: items of reference class ``rows[i]`` predicted as ``cols[j]``."""

    rows: list[str]
    cols: list[str]  # the 12 classes, then UNPARSED
    counts: list[list[int]]


class HumorMetrics(msgspec.Struct, kw_only=True):
    n: int
    n_missing: int
    em: float
    em_mera: float
    class_accuracy: float
    letter_accuracy: float
    parse_failure_rate: float  # no full "class,letter" could be read
    class_parse_failure_rate: float
    letter_parse_failure_rate: float
    ambiguous: int  # answers that named several classes or letters, or disagreed with themselves: never credited
    ambiguous_rate: float
    macro_f1: float | None  # over the classes present (None: no item)
    per_class: dict[str, ClassStats]
    confusion: ConfusionMatrix
    not_a_joke_precision: float | None
    not_a_joke_recall: float | None
    predicted_letters: dict[str, int]  # А, Б, В, Г and UNPARSED: position bias
    reference_letters: dict[str, int]
    em_ci95: Interval | None  # Wilson; None only without items
    em_mera_ci95: Interval | None
    class_accuracy_ci95: Interval | None
    per_class_ci95: dict[str, ClassIntervals]
    bootstrap_resamples: int  # the F1 intervals' (and MERA's judge score's, in the report)
    bootstrap_seed: int


class ItemScore(msgspec.Struct):
    id: int
    reference: str
    parsed: ParsedAnswer
    em: int
    em_mera: int
    class_correct: int
    letter_correct: int


def _reference(item: HumorItem) -> tuple[str, str]:
    ref = split_output(item.outputs)
    if ref is None:
        raise InputError(
            f"no usable reference answer {item.outputs!r} (the private test file cannot be scored)",
            record=item.id,
            field="outputs",
        )
    return ref


def score_item(item: HumorItem, text: str) -> ItemScore:
    cls, letter = _reference(item)
    parsed = parse_answer(text)
    class_ok = int(parsed.cls is not None and class_key(parsed.cls) == class_key(cls))
    letter_ok = int(parsed.letter == letter)
    return ItemScore(
        id=item.id,
        reference=item.outputs,
        parsed=parsed,
        em=class_ok * letter_ok,
        em_mera=_em_mera(item.outputs, text),
        class_correct=class_ok,
        letter_correct=letter_ok,
    )


def _ratio(a: int | float, b: int | float) -> float:
    """A rate over the items (0 without items: every item-level rate is defined whenever there is an item)."""
    return a / b if b else 0.0


def _prf(correct: int, predicted: int, support: int) -> tuple[float | None, float | None, float | None]:
    """Precision, recall and F1 of one class; ``None`` where undefined (0/0)."""
    return ratio(correct, predicted), ratio(correct, support), ratio(2 * correct, support + predicted)


def per_class_bootstrap(
    pairs: Sequence[tuple[str, str | None]], *, resamples: int = 1000, seed: int = 0
) -> dict[str, Interval | None]:
    """Per-class F1 intervals: ``pairs`` are (reference class, predicted class or None) per item; each resample
    draws items with replacement and recomputes every class's F1 (a resample where a class's F1 is undefined
    adds nothing to its interval; None when no resample defines it)."""
    n = len(pairs)
    rng = random.Random(seed)
    draws: dict[str, list[float]] = {c: [] for c in CLASSES}
    for _ in range(resamples if n else 0):
        support = dict.fromkeys(CLASSES, 0)
        predicted = dict.fromkeys(CLASSES, 0)
        correct = dict.fromkeys(CLASSES, 0)
        for ref, pred in rng.choices(pairs, k=n):
            support[ref] += 1
            if pred is not None:
                predicted[pred] += 1
                correct[pred] += pred == ref
        for c in CLASSES:
            f1 = ratio(2 * correct[c], support[c] + predicted[c])
            if f1 is not None:
                draws[c].append(f1)

    def interval(values: list[float]) -> Interval | None:
        values.sort()
        return Interval(quantile(values, 0.025), quantile(values, 0.975)) if values else None

    return {c: interval(draws[c]) for c in CLASSES}


def per_class_intervals(
    per_class: Mapping[str, ClassStats], f1: Mapping[str, Interval | None]
) -> dict[str, ClassIntervals]:
    """Each class's Wilson intervals of precision (correct of predicted) and recall (correct of support), beside
    its F1's bootstrap interval."""
    return {
        c: ClassIntervals(wilson(st.correct, st.predicted), wilson(st.correct, st.support), f1[c])
        for c, st in per_class.items()
    }


def _tallies(scores: Sequence[ItemScore]) -> tuple[list[list[int]], dict[str, int], dict[str, int]]:
    """The confusion counts (rows: reference class; columns: predicted class, then unparsed) and the letters
    predicted and referenced."""
    col_index = {c: j for j, c in enumerate(CLASSES)}
    counts = [[0] * (len(CLASSES) + 1) for _ in CLASSES]
    predicted_letters = dict.fromkeys((*LETTERS, UNPARSED), 0)
    reference_letters = dict.fromkeys(LETTERS, 0)
    for s in scores:
        ref_cls, ref_letter = _reference_of(s)
        j = col_index[s.parsed.cls] if s.parsed.cls is not None else len(CLASSES)
        counts[col_index[ref_cls]][j] += 1
        predicted_letters[s.parsed.letter or UNPARSED] += 1
        reference_letters[ref_letter] += 1
    return counts, predicted_letters, reference_letters


def _per_class(counts: list[list[int]]) -> dict[str, ClassStats]:
    """Support, predictions, hits and precision/recall/F1 of each class, from the confusion counts."""
    per_class: dict[str, ClassStats] = {}
    for i, cls in enumerate(CLASSES):
        support = sum(counts[i])
        predicted = sum(row[i] for row in counts)
        correct = counts[i][i]
        per_class[cls] = ClassStats(support, predicted, correct, *_prf(correct, predicted, support))
    return per_class


def compute_metrics(
    items: Sequence[HumorItem],
    predictions: Mapping[int, str],
    *,
    resamples: int = 1000,
    seed: int = 0,
) -> tuple[HumorMetrics, list[ItemScore]]:
    """All metrics of ``predictions`` (item id -> raw model text), and the per-item scores."""
    known = {item.id for item in items}
    unknown = sorted(set(predictions) - known)
    if unknown:
        raise InputError(f"predictions for ids not in the data: {unknown[:10]}", field="id")
    scores = [score_item(item, predictions.get(item.id, "")) for item in items]
    n = len(scores)
    counts, predicted_letters, reference_letters = _tallies(scores)
    per_class = _per_class(counts)
    present = [st for st in per_class.values() if st.support]
    em = [s.em for s in scores]
    cls_ok = [s.class_correct for s in scores]
    metrics = HumorMetrics(
        n=n,
        n_missing=sum(1 for item in items if item.id not in predictions),
        em=_ratio(sum(em), n),
        em_mera=_ratio(sum(s.em_mera for s in scores), n),
        class_accuracy=_ratio(sum(cls_ok), n),
        letter_accuracy=_ratio(sum(s.letter_correct for s in scores), n),
        parse_failure_rate=_ratio(sum(1 for s in scores if s.parsed.as_output() is None), n),
        class_parse_failure_rate=_ratio(sum(1 for s in scores if s.parsed.cls is None), n),
        letter_parse_failure_rate=_ratio(sum(1 for s in scores if s.parsed.letter is None), n),
        ambiguous=sum(1 for s in scores if s.parsed.ambiguous),
        ambiguous_rate=_ratio(sum(1 for s in scores if s.parsed.ambiguous), n),
        macro_f1=ratio(sum(st.f1 or 0.0 for st in present), len(present)),  # a present class's F1 is defined
        per_class=per_class,
        confusion=ConfusionMatrix(rows=list(CLASSES), cols=[*CLASSES, UNPARSED], counts=counts),
        not_a_joke_precision=per_class[NOT_A_JOKE].precision,
        not_a_joke_recall=per_class[NOT_A_JOKE].recall,
        predicted_letters=predicted_letters,
        reference_letters=reference_letters,
        em_ci95=wilson(sum(em), n),
        em_mera_ci95=wilson(sum(s.em_mera for s in scores), n),
        class_accuracy_ci95=wilson(sum(cls_ok), n),
        per_class_ci95=per_class_intervals(
            per_class,
            per_class_bootstrap(
                [(_reference_of(s)[0], s.parsed.cls) for s in scores], resamples=resamples, seed=seed + 3
            ),
        ),
        bootstrap_resamples=resamples,
        bootstrap_seed=seed,
    )
    return metrics, scores


def _reference_of(score: ItemScore) -> tuple[str, str]:
    ref = split_output(score.reference)
    assert ref is not None  # checked in score_item
    return ref
