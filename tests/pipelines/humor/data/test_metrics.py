import pytest

from punchline.data.errors import InputError
from punchline.data.metrics.intervals import Interval, bootstrap_mean, wilson
from punchline.pipelines.humor.data.metrics import UNPARSED, compute_metrics
from punchline.pipelines.humor.data.schema import CLASSES
from tests.pipelines.humor.data.conftest import make_item


def _ans(cls: str, letter: str) -> str:
    return f"ОТВЕТ {cls}\nРЕШЕНИЕ {letter}"


ITEMS = [
    make_item(1, "ирония,Б"),
    make_item(2, "ирония,А"),
    make_item(3, "не анекдот,В"),
    make_item(4, "не анекдот,Г"),
    make_item(5, "каламбур,Г"),
]
PREDICTIONS = {
    1: _ans("Ирония", "Б"),  # em (robust and MERA: case is normalised)
    2: _ans("ирония", "В"),  # class right, letter wrong
    3: "ОТВЕТ: не анекдот\r\nРЕШЕНИЕ: В",  # em robust only (MERA keeps the CR of the CRLF in the class)
    4: _ans("ирония", "Г"),  # class wrong, letter right
    # 5 missing: counted as an empty answer
}


def test_hand_computed_metrics() -> None:
    m, scores = compute_metrics(ITEMS, PREDICTIONS, resamples=200, seed=1)
    assert [s.em for s in scores] == [1, 0, 1, 0, 0]
    assert [s.em_mera for s in scores] == [1, 0, 0, 0, 0]
    assert m.n == 5 and m.n_missing == 1
    assert m.em == pytest.approx(2 / 5)
    assert m.em_mera == pytest.approx(1 / 5)
    assert m.class_accuracy == pytest.approx(3 / 5)
    assert m.letter_accuracy == pytest.approx(3 / 5)
    assert m.parse_failure_rate == pytest.approx(1 / 5)
    assert m.class_parse_failure_rate == pytest.approx(1 / 5)
    # ирония: support 2, predicted 3 (items 1, 2, 4), correct 2
    ir = m.per_class["ирония"]
    assert (ir.support, ir.predicted, ir.correct) == (2, 3, 2)
    assert ir.precision == pytest.approx(2 / 3) and ir.recall == 1.0
    assert ir.f1 == pytest.approx(0.8)
    # не анекдот: support 2, predicted 1, correct 1
    assert m.not_a_joke_precision == 1.0 and m.not_a_joke_recall == 0.5
    assert m.per_class["не анекдот"].f1 == pytest.approx(2 / 3)
    # каламбур: support 1, never predicted -> precision undefined (None, shown n/a: never 0.0), recall 0, f1 0
    kal = m.per_class["каламбур"]
    assert kal.precision is None and kal.recall == 0.0 and kal.f1 == 0.0
    assert m.per_class_ci95["каламбур"].precision is None and m.per_class_ci95["каламбур"].recall == wilson(0, 1)
    # a class neither present nor predicted: everything undefined
    absent = m.per_class["оксюморон"]
    assert (absent.precision, absent.recall, absent.f1) == (None, None, None)
    assert m.per_class_ci95["оксюморон"].f1 is None
    assert m.macro_f1 == pytest.approx((0.8 + 2 / 3 + 0.0) / 3)
    conf = m.confusion
    assert conf.cols[-1] == UNPARSED and len(conf.counts) == 12 and all(len(r) == 13 for r in conf.counts)
    ir_i, nj_i, kal_i = (CLASSES.index(c) for c in ("ирония", "не анекдот", "каламбур"))
    assert conf.counts[ir_i][ir_i] == 2
    assert conf.counts[nj_i][nj_i] == 1 and conf.counts[nj_i][ir_i] == 1
    assert conf.counts[kal_i][12] == 1
    assert sum(map(sum, conf.counts)) == 5
    assert m.predicted_letters == {"А": 0, "Б": 1, "В": 2, "Г": 1, UNPARSED: 1}
    assert m.reference_letters == {"А": 1, "Б": 1, "В": 1, "Г": 2}
    assert m.em_ci95 == wilson(2, 5) and m.em_mera_ci95 == wilson(1, 5)  # rates: Wilson's interval
    assert m.class_accuracy_ci95 == wilson(3, 5)
    assert m.per_class_ci95["ирония"].precision == wilson(2, 3)


def test_bootstrap_is_seeded_and_degenerate_cases() -> None:
    values = [1, 0, 1, 1, 0, 0, 1, 0, 1, 1]
    assert bootstrap_mean(values, seed=3) == bootstrap_mean(values, seed=3)
    assert bootstrap_mean([1] * 20) == Interval(1.0, 1.0)
    wide = bootstrap_mean(values, resamples=2000)
    assert wide is not None and 0.2 < wide.low < 0.6 < wide.high < 0.95


def test_unknown_prediction_id_and_unlabeled_item_are_errors() -> None:
    with pytest.raises(InputError, match="not in the data"):
        compute_metrics(ITEMS, {99: "x"})
    with pytest.raises(InputError, match="private") as err:
        compute_metrics([make_item(7, "")], {7: _ans("ирония", "Б")})
    assert err.value.record == 7 and err.value.field == "outputs"


def test_all_correct() -> None:
    preds = {item.id: _ans(*item.outputs.split(",")) for item in ITEMS}
    m, _ = compute_metrics(ITEMS, preds, resamples=50)
    assert m.em == m.em_mera == m.class_accuracy == m.letter_accuracy == 1.0
    assert m.parse_failure_rate == 0.0 and m.n_missing == 0
    assert m.macro_f1 == 1.0


def test_hedges_are_counted_as_ambiguous_and_never_credited() -> None:
    preds = {
        1: "ОТВЕТ ирония\nРЕШЕНИЕ А, Б",  # the right letter among two: a hedge
        2: "ОТВЕТ ирония\nРЕШЕНИЕ А\nОТВЕТ каламбур",  # two classes: the right one and another
        3: _ans("не анекдот", "В"),
        4: "ОТВЕТ ирония\nРЕШЕНИЕ Г",
        5: "ОТВЕТ каламбур\nРЕШЕНИЕ Г\nИли нет: ОТВЕТ ирония\nРЕШЕНИЕ А",  # two answers that disagree
    }
    m, scores = compute_metrics(ITEMS, preds, resamples=50)
    assert [s.parsed.ambiguous for s in scores] == [True, True, False, False, True]
    assert [s.em for s in scores] == [0, 0, 1, 0, 0]
    assert (m.ambiguous, m.ambiguous_rate) == (3, pytest.approx(3 / 5))
    assert m.parse_failure_rate == pytest.approx(3 / 5)  # an ambiguous answer is also unparsed


def test_per_class_and_em_mera_intervals_are_seeded_and_cover_the_estimates() -> None:
    import random

    rng = random.Random(3)
    items, preds = [], {}
    for i in range(240):
        cls, letter = CLASSES[i % 12], "АБВГ"[i % 4]
        items.append(make_item(i, f"{cls},{letter}"))
        said = cls if rng.random() < 0.6 else CLASSES[(i + 1) % 12]
        preds[i] = _ans(said, letter) if rng.random() < 0.5 else f"ОТВЕТ: {said}\r\nРЕШЕНИЕ {letter}"
    m1, _ = compute_metrics(items, preds, resamples=300, seed=7)
    m2, _ = compute_metrics(items, preds, resamples=300, seed=7)
    assert m1.per_class_ci95 == m2.per_class_ci95 and m1.em_mera_ci95 == m2.em_mera_ci95
    assert m1.em_mera_ci95 is not None and m1.em_mera_ci95.low < m1.em_mera < m1.em_mera_ci95.high
    assert 0.0 < m1.em_mera < m1.em  # the CRLF answers: MERA keeps the CR in the class
    for cls in CLASSES:
        st, ci = m1.per_class[cls], m1.per_class_ci95[cls]
        for value, iv in ((st.precision, ci.precision), (st.recall, ci.recall), (st.f1, ci.f1)):
            assert value is not None and iv is not None
            assert iv.low <= value <= iv.high and iv.high - iv.low < 0.8
        assert ci.f1 is not None and ci.f1.high - ci.f1.low > 0.0  # 20 items per class: a real interval
