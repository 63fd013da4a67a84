import json
from pathlib import Path

from punchline.pipelines.humor.data.loaders import load_items
from punchline.pipelines.humor.data.prompts import load_official_templates, missing_placeholders, render_prompt
from punchline.pipelines.humor.data.schema import CLASSES, LETTERS, split_output
from punchline.pipelines.humor.data.validate import validate_items


def test_sample_passes_validation_and_is_balanced(sample_path: Path) -> None:
    items = load_items(sample_path)
    rep = validate_items(items)
    assert rep.ok, rep.errors
    assert rep.warnings == []
    assert rep.n == rep.n_labeled >= 24
    assert all(count >= 2 for count in rep.per_class.values())
    assert max(rep.letters.values()) - min(rep.letters.values()) <= 2
    assert rep.chi2_p_value is not None and rep.chi2_p_value > 0.5
    assert len({it.id for it in items}) == len(items)


def test_sample_uses_official_templates_round_robin_and_context(sample_path: Path, shared_humor: Path) -> None:
    templates = load_official_templates(shared_humor / "dataset_meta.json")
    seed = (shared_humor.parents[1] / "seeds" / "humor.md").read_text(encoding="utf-8")
    example = json.loads(seed[seed.index("Data Example") + len("Data Example") : seed.index("\nPrompts")])
    items = load_items(sample_path)
    for i, item in enumerate(items):
        assert item.instruction == templates[i % 5]
        assert item.inputs.context == example["inputs"]["context"]
        assert missing_placeholders(item.instruction) == []
        assert "{" not in render_prompt(item).replace(item.inputs.context, "")


def test_sample_options_have_exactly_one_of_the_main_class(sample_path: Path) -> None:
    items = load_items(sample_path)
    label_of = {}
    for it in items:
        ref = split_output(it.outputs)
        assert ref is not None
        label_of[it.inputs.main_text] = ref[0]
    for it in items:
        cls, letter = split_output(it.outputs)  # type: ignore[misc]
        assert cls in CLASSES
        correct = it.inputs.option(letter)
        assert correct != it.inputs.main_text
        if correct in label_of:
            assert label_of[correct] == cls
        for other in LETTERS:
            text = it.inputs.option(other)
            if other != letter and text in label_of:
                assert label_of[text] != cls, (it.id, other)
