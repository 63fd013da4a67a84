"""Which solved items each question is shown (few-shot), as lm-eval chooses them for MERA's Humor.

MERA's ``benchmark_tasks/humor/humor.yaml`` (MERA-Evaluation/MERA at d49563a047f5260a21c91e057ca3b49e771226b7)
sets ``test_split: test``, ``fewshot_split: test`` and ``fewshot_config: {sampler: default}``; lm-eval's
``simple_evaluate`` seeds the sampler with ``fewshot_random_seed = 1234``. How lm-eval draws, in our words (the
harness fork artemorloff/lm-evaluation-harness: ``lm_eval/api/samplers.py`` and ``lm_eval/api/task.py`` at
18ec6c896bea9cfdf02db4919b15775eee3bc619, ``lm_eval/evaluator.py`` at 12ce2a142edd5fe8a1e5eaef956fc9dc5134c8fa):

* one ``random.Random(seed)`` for the whole task (``Task.set_fewshot_seed``), shared by every item and consumed
  in the order the items are evaluated (the test split's order, one rank);
* per item, ``n`` docs are drawn from the few-shot split: ``n = k + 1`` when the few-shot split is the test split
  (so that the item itself can be dropped), else ``k``; the ``default`` sampler draws ``rnd.sample(docs, n)``,
  ``first_n`` takes ``docs[:n]`` (and draws nothing from the generator);
* the item itself is dropped from the draw (``x != doc``, a comparison of every field) and the first ``k`` of
  the rest, in drawn order, are its shots (with ``fewshot_as_multiturn``, one draw per item).

So the shots of an item depend on every item before it: a run must walk the items in file order, and a run on a
subset of the test split draws differently from a run on the whole of it (as lm-eval's ``--limit`` does).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Literal

from punchline.data.errors import ConfigError
from punchline.pipelines.humor.data.schema import HumorItem

Sampler = Literal["default", "first_n"]
FewshotSplit = Literal["test", "shots"]
#: lm-eval's ``fewshot_random_seed`` default (``simple_evaluate``)
FEWSHOT_SEED = 1234
#: humor.yaml's ``fewshot_config.sampler`` and ``fewshot_split`` (== its ``test_split``)
MERA_SAMPLER: Sampler = "default"
MERA_FEWSHOT_SPLIT: FewshotSplit = "test"


def draws_per_item(k: int, *, same_split: bool) -> int:
    """How many docs lm-eval draws for one item: one more than ``k`` when the item may be among them."""
    return k + 1 if same_split else k


def lm_eval_shots(
    items: Sequence[HumorItem],
    pool: Sequence[HumorItem],
    k: int,
    *,
    sampler: Sampler = MERA_SAMPLER,
    seed: int = FEWSHOT_SEED,
    same_split: bool = True,
) -> list[list[HumorItem]]:
    """The shots of every item of ``items`` (in that order), drawn from ``pool`` as lm-eval draws them."""
    if k <= 0:
        return [[] for _ in items]
    n = draws_per_item(k, same_split=same_split)
    if n > len(pool):
        raise ConfigError(
            f"k_shot = {k} needs {n} few-shot docs to draw from, the few-shot split has {len(pool)}",
            field="humor.k_shot",
        )
    rnd = random.Random(seed)
    docs = list(pool)
    out = []
    for item in items:
        drawn = docs[:n] if sampler == "first_n" else rnd.sample(docs, n)
        out.append([doc for doc in drawn if doc != item][:k])
    return out


def first_k_shots(item: HumorItem, shots: Sequence[HumorItem], k: int) -> list[HumorItem]:
    """The ``punchline`` preset's shots: the first ``k`` of the shots file, never the item itself."""
    chosen = [s for s in shots if s != item][:k]
    if len(chosen) < k:
        raise ConfigError(f"not enough shots for item {item.id} once the item itself is excluded", field="humor.shots")
    return chosen
