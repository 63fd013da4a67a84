"""Differential test: the ``mera`` preset's messages against lm-eval's own few-shot code, transcribed.

The transcription below follows, as closely as Python allows and independently of ``pipelines/humor/data/shots.py``:

* ``lm_eval/api/samplers.py`` of artemorloff/lm-evaluation-harness at 18ec6c896bea9cfdf02db4919b15775eee3bc619
  (``ContextSampler.get_chat_context`` with ``fewshot_as_multiturn``, ``ContextSampler.sample`` =
  ``self.rnd.sample(self.docs, n)``, ``FirstNSampler.sample`` = ``self.docs[:n]``);
* ``lm_eval/api/task.py`` at the same commit (``ConfigurableTask.__init__`` builds the sampler over
  ``list(self.fewshot_docs())``; ``Task.set_fewshot_seed`` replaces its generator by ``random.Random(seed)``;
  ``build_all_requests`` walks the eval docs in order; ``add_test_sample`` / ``append_target_question`` add the
  item as the last user turn);
* ``lm_eval/evaluator.py`` at 12ce2a142edd5fe8a1e5eaef956fc9dc5134c8fa (``fewshot_random_seed = 1234``, set on
  every task by ``_adjust_config``);
* MERA-Evaluation/MERA ``benchmark_tasks/humor/humor.yaml`` at d49563a047f5260a21c91e057ca3b49e771226b7
  (``test_split: test``, ``fewshot_split: test``, ``sampler: default``, ``doc_to_target: "{{ outputs.strip() }}"``)
  and ``benchmark_tasks/humor/utils.py`` at b2dc51c1c129b770e427d1489c9cd6da1c77dee7 (``doc_to_text``).

Docs are plain dicts, as the Hugging Face dataset yields them; the generator is Python's own ``random.Random``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest

from punchline.data.errors import ConfigError
from punchline.pipelines.humor.data.loaders import load_items
from punchline.pipelines.humor.data.prompts import mera_answer_request
from punchline.pipelines.humor.data.schema import CLASSES, LETTERS, HumorItem
from punchline.pipelines.humor.data.shots import first_k_shots, lm_eval_shots

from .conftest import SAMPLE, make_item

# --- lm-eval, transcribed ------------------------------------------------------------------------------------


@dataclass
class HumorYaml:
    test_split: str = "test"
    fewshot_split: str = "test"
    sampler: str = "default"


def doc_to_text(doc: dict[str, Any]) -> str:
    return doc["instruction"].format(**doc["inputs"])


def doc_to_target(doc: dict[str, Any]) -> str:
    return doc["outputs"].strip()  # the Jinja template "{{ outputs.strip() }}"


class ContextSampler:
    def __init__(self, docs: list[dict[str, Any]], config: HumorYaml, rnd: random.Random) -> None:
        self.docs = docs
        self.config = config
        self.rnd = rnd

    def get_chat_context(self, doc: dict[str, Any], num_fewshot: int) -> list[dict[str, str]]:
        chat_history = []
        n_samples = num_fewshot + 1 if self.config.fewshot_split == self.config.test_split else num_fewshot
        fewshotex = self.sample(n_samples)
        selected_docs = [x for x in fewshotex if x != doc][:num_fewshot]
        for d in selected_docs:  # fewshot_as_multiturn
            chat_history.append({"role": "user", "content": doc_to_text(d)})
            chat_history.append({"role": "assistant", "content": doc_to_target(d)})
        return chat_history

    def sample(self, n: int) -> list[dict[str, Any]]:
        return self.rnd.sample(self.docs, n)


class FirstNSampler(ContextSampler):
    def sample(self, n: int) -> list[dict[str, Any]]:
        assert n <= len(self.docs)
        return self.docs[:n]


SAMPLER_REGISTRY = {"default": ContextSampler, "first_n": FirstNSampler}


def lm_eval_chats(
    eval_docs: list[dict[str, Any]],
    fewshot_docs: list[dict[str, Any]],
    num_fewshot: int,
    config: HumorYaml,
    fewshot_random_seed: int = 1234,
) -> list[list[dict[str, str]]]:
    """``build_all_requests`` with ``apply_chat_template`` and ``fewshot_as_multiturn``: every item's chat."""
    sampler = SAMPLER_REGISTRY[config.sampler](list(fewshot_docs), config, rnd=random.Random())
    sampler.rnd = random.Random(fewshot_random_seed)  # set_fewshot_seed
    chats = []
    for doc in eval_docs:
        labeled_examples = sampler.get_chat_context(doc, num_fewshot) if num_fewshot > 0 else []
        labeled_examples.append({"role": "user", "content": doc_to_text(doc)})  # add_test_sample (multiturn)
        chats.append(labeled_examples)
    return chats


# --- ours ---------------------------------------------------------------------------------------------------


def as_doc(item: HumorItem) -> dict[str, Any]:
    return msgspec.to_builtins(item)


def our_chats(items: list[HumorItem], pool: list[HumorItem], k: int, **how: Any) -> list[list[dict[str, str]]]:
    shots = lm_eval_shots(items, pool, k, **how)
    return [
        [{"role": m.role, "content": m.content} for m in mera_answer_request("p", "m", item, s).messages]
        for item, s in zip(items, shots, strict=True)
    ]


def synthetic(n: int, seed: int) -> list[HumorItem]:
    rng = random.Random(seed)
    return [make_item(1000 + i, f"{rng.choice(CLASSES)},{rng.choice(LETTERS)}") for i in range(n)]


SAMPLE_ITEMS = load_items(SAMPLE)
TEST_600 = synthetic(600, seed=5)
SHOTS_5 = synthetic(5, seed=6)


@pytest.mark.parametrize("k", [1, 5, 8])
@pytest.mark.parametrize("sampler", ["default", "first_n"])
def test_every_item_gets_the_messages_lm_eval_builds_from_the_test_split(k: int, sampler: str) -> None:
    for items in (SAMPLE_ITEMS, TEST_600):
        docs = [as_doc(it) for it in items]
        theirs = lm_eval_chats(docs, docs, k, HumorYaml(sampler=sampler))
        ours = our_chats(items, items, k, sampler=sampler, same_split=True)
        assert len(ours) == len(items)
        differing = [i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b]
        assert not differing, f"{len(differing)} of {len(items)} items differ, e.g. item {differing[0]}"
        assert all(len(chat) == 2 * k + 1 for chat in ours)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_a_separate_shots_split_draws_k_and_may_give_fewer(k: int) -> None:
    """``fewshot_split`` other than the test split: lm-eval draws ``k``, no extra one to drop the item with."""
    for items, pool in ((SAMPLE_ITEMS, SHOTS_5), (SAMPLE_ITEMS[:6], SAMPLE_ITEMS)):
        theirs = lm_eval_chats(
            [as_doc(i) for i in items], [as_doc(s) for s in pool], k, HumorYaml(fewshot_split="shots")
        )
        assert our_chats(items, pool, k, same_split=False) == theirs
    # the item is in the shots: lm-eval shows it k - 1 shots (when drawn), and so do we
    chats = our_chats(SAMPLE_ITEMS[:1], SAMPLE_ITEMS[:5], 5, sampler="first_n", same_split=False)
    assert len(chats[0]) == 2 * 4 + 1


def test_the_seed_matters_and_the_first_k_differ_from_lm_evals_draw() -> None:
    docs = [as_doc(it) for it in TEST_600]
    theirs = lm_eval_chats(docs, docs, 5, HumorYaml())
    assert our_chats(TEST_600, TEST_600, 5, seed=1235) != theirs
    first_k = [
        [
            {"role": m.role, "content": m.content}
            for m in mera_answer_request("p", "m", it, first_k_shots(it, TEST_600, 5)).messages
        ]
        for it in TEST_600
    ]
    same = sum(a == b for a, b in zip(first_k, theirs, strict=True))
    assert same < len(TEST_600) // 50  # the order of the file is not lm-eval's choice


def test_an_item_depends_on_the_draws_before_it() -> None:
    """One generator for the whole task: dropping the first item changes the shots of the others."""
    whole = lm_eval_shots(TEST_600, TEST_600, 5)
    later = lm_eval_shots(TEST_600[1:], TEST_600, 5)
    assert whole[1:] != later


def test_too_few_docs_to_draw_from() -> None:
    with pytest.raises(ConfigError, match="needs 6 few-shot docs"):
        lm_eval_shots(SHOTS_5, SHOTS_5, 5)
    assert lm_eval_shots(SHOTS_5, SHOTS_5, 0) == [[]] * 5
