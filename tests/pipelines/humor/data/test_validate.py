import msgspec
import pytest

from punchline.pipelines.humor.data.validate import chi2_sf_3dof, chi2_uniform, validate_items
from tests.pipelines.humor.data.conftest import make_item


@pytest.mark.parametrize(
    ("x", "p"), [(0.0, 1.0), (7.814727903251178, 0.05), (11.344866730144373, 0.01), (1.0, 0.8012519569012)]
)
def test_chi2_sf_matches_tabulated_values(x: float, p: float) -> None:
    assert chi2_sf_3dof(x) == pytest.approx(p, rel=1e-9)


def test_chi2_uniform() -> None:
    assert chi2_uniform([5, 5, 5, 5]) == (0.0, 1.0)
    stat, p = chi2_uniform([10, 0, 0, 0])  # type: ignore[misc]
    assert stat == pytest.approx(30.0) and p < 1e-5
    assert chi2_uniform([0, 0, 0, 0]) is None


def test_clean_items() -> None:
    items = [make_item(i, out) for i, out in enumerate(["ирония,А", "ирония,Б", "не анекдот,В", "каламбур,Г"])]
    rep = validate_items(items)
    assert rep.ok and rep.n == rep.n_labeled == 4 and rep.warnings == []
    assert rep.per_class["ирония"] == 2 and rep.per_class["не анекдот"] == 1 and rep.per_class["эллипсис"] == 0
    assert rep.letters == {"А": 1, "Б": 1, "В": 1, "Г": 1}
    assert rep.chi2 == 0.0 and rep.chi2_p_value == 1.0


def test_every_error_kind() -> None:
    items = [
        make_item(1, "ирония,А"),
        make_item(1, "ирония,Б"),  # duplicate id
        make_item(2, "сарказм,Б"),  # unknown class
        make_item(3, "ирония,Д"),  # bad letter
        make_item(4, "ирония Б"),  # no comma
        make_item(5, "ирония,А", instruction="{context} {main_text} {option_a} {option_b} {option_c}"),
        make_item(6, "", main="текст А 6"),  # option А == main text; no reference: warning
    ]
    rep = validate_items(items)
    assert not rep.ok
    assert rep.duplicate_ids == [1]
    by_id = {(e.id, e.field) for e in rep.errors}
    assert by_id == {
        (1, "meta.id"),
        (2, "outputs"),
        (3, "outputs"),
        (4, "outputs"),
        (5, "instruction"),
        (6, "inputs.option_a"),
    }
    assert "{option_d}" in next(e.message for e in rep.errors if e.id == 5)
    assert [(w.id, w.field) for w in rep.warnings] == [(6, "outputs")]
    assert rep.n_labeled == 3
    # letters А=2, Б=1, В=0, Г=0; expected 0.75 each: (1.5625 + 0.0625 + 0.5625 + 0.5625) / 0.75
    assert rep.letters == {"А": 2, "Б": 1, "В": 0, "Г": 0}
    assert rep.chi2 == pytest.approx(2.75 / 0.75)
    assert rep.chi2_p_value == pytest.approx(chi2_sf_3dof(2.75 / 0.75))
    # the report is JSON-encodable for --json
    assert msgspec.json.decode(msgspec.json.encode(rep))["n"] == 7
