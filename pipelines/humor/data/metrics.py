"""Scores of a set of model answers against the references.

``em`` uses the robust :mod:`punchline.pipelines.humor.data.parser` (class compared by
:func:`~punchline.pipelines.humor.data.schema.class_key`, i.e. case-insensitive with ё == е, and the letter);
``em_mera`` is the official reading (:mod:`punchline.pipelines.humor.data.mera`). ``ambiguous`` counts the answers
the parser refused because they hedge (several classes or letters) or contradict themselves; they are
also parse failures. Items without a prediction are scored as an empty answer (wrong) and counted in
``n_missing``. Precision of a class never predicted is 0 (sklearn's
``zero_division=0``). Bootstrap intervals are 95 % percentile intervals over items (the same resamples
for every per-class figure), seeded so reports are reproducible: on EM (both readings), class accuracy and
each class's precision, recall and F1.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

import msgspec

from punchline.data.errors import InputError
from punchline.pipelines.humor.data.mera import em_mera as _em_mera
from punchline.pipelines.humor.data.parser import ParsedAnswer, parse_answer
from punchline.pipelines.humor.data.schema import CLASSES, LETTERS, NOT_A_JOKE, HumorItem, class_key, split_output

UNPARSED = "<unparsed>"


class Interval(msgspec.Struct):
    low: float
    high: float


class ClassStats(msgspec.Struct):
    support: int  # reference items of the class
    predicted: int  # items predicted as the class
    correct: int
    precision: float
    recall: float
    f1: float


class ClassIntervals(msgspec.Struct):
    """95 % bootstrap intervals of one class's precision, recall and F1."""

    precision: Interval
    recall: Interval
    f1: Interval


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
    macro_f1: float
    per_class: dict[str, ClassStats]
    confusion: ConfusionMatrix
    not_a_joke_precision: float
    not_a_joke_recall: float
    predicted_letters: dict[str, int]  # А, Б, В, Г and UNPARSED: position bias
    reference_letters: dict[str, int]
    em_ci95: Interval
    em_mera_ci95: Interval
    class_accuracy_ci95: Interval
    per_class_ci95: dict[str, ClassIntervals]
    bootstrap_resamples: int
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
    return a / b if b else 0.0


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not sorted_values:
        return 0.0
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def bootstrap_ci(values: Sequence[int | float], *, resamples: int = 1000, seed: int = 0) -> Interval:
    """95 % percentile bootstrap interval of the mean of ``values``."""
    n = len(values)
    if n == 0:
        return Interval(0.0, 0.0)
    rng = random.Random(seed)
    means = sorted(sum(rng.choices(values, k=n)) / n for _ in range(resamples))
    return Interval(_quantile(means, 0.025), _quantile(means, 0.975))


def _prf(correct: int, predicted: int, support: int) -> tuple[float, float, float]:
    p, r = _ratio(correct, predicted), _ratio(correct, support)
    return p, r, _ratio(2 * p * r, p + r)


def per_class_bootstrap(
    pairs: Sequence[tuple[str, str | None]], *, resamples: int = 1000, seed: int = 0
) -> dict[str, ClassIntervals]:
    """Per-class precision/recall/F1 intervals: ``pairs`` are (reference class, predicted class or None)
    per item; each resample draws items with replacement and recomputes all three for every class."""
    n = len(pairs)
    rng = random.Random(seed)
    draws: dict[str, list[list[float]]] = {c: [[], [], []] for c in CLASSES}
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
            for values, x in zip(draws[c], _prf(correct[c], predicted[c], support[c]), strict=True):
                values.append(x)

    def interval(values: list[float]) -> Interval:
        values.sort()
        return Interval(_quantile(values, 0.025), _quantile(values, 0.975))

    return {c: ClassIntervals(*(interval(v) for v in draws[c])) for c in CLASSES}


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
        macro_f1=_ratio(sum(st.f1 for st in present), len(present)),
        per_class=per_class,
        confusion=ConfusionMatrix(rows=list(CLASSES), cols=[*CLASSES, UNPARSED], counts=counts),
        not_a_joke_precision=per_class[NOT_A_JOKE].precision,
        not_a_joke_recall=per_class[NOT_A_JOKE].recall,
        predicted_letters=predicted_letters,
        reference_letters=reference_letters,
        em_ci95=bootstrap_ci(em, resamples=resamples, seed=seed),
        em_mera_ci95=bootstrap_ci([s.em_mera for s in scores], resamples=resamples, seed=seed + 2),
        class_accuracy_ci95=bootstrap_ci(cls_ok, resamples=resamples, seed=seed + 1),
        per_class_ci95=per_class_bootstrap(
            [(_reference_of(s)[0], s.parsed.cls) for s in scores], resamples=resamples, seed=seed + 3
        ),
        bootstrap_resamples=resamples,
        bootstrap_seed=seed,
    )
    return metrics, scores


def _reference_of(score: ItemScore) -> tuple[str, str]:
    ref = split_output(score.reference)
    assert ref is not None  # checked in score_item
    return ref
