"""Rendering Humor prompts from an item's own instruction template, optionally with k shots.

The texts contain braces (and can contain ``{option_a}`` literally), so ``str.format`` is unsafe:
placeholders are replaced in a single regex pass, and the substituted texts are never re-scanned.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

import msgspec

from punchline.data.errors import InputError
from punchline.data.requests import Message, ProviderRequest
from punchline.pipelines.humor.data.schema import PLACEHOLDERS, HumorInputs, HumorItem, split_output

_PLACEHOLDER_RE = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")
SHOT_SEPARATOR = "\n\n"
#: lm-eval's default ``max_gen_toks`` for ``generate_until`` tasks (MERA's Humor sets none): room for the
#: reasoning some models write before the two answer lines. MERA generates greedily.
ANSWER_MAX_TOKENS = 256


def render_instruction(template: str, inputs: HumorInputs) -> str:
    """``template`` with ``{context}``, ``{main_text}``, ``{option_a}``..``{option_d}`` filled in."""
    values = {name: str(getattr(inputs, name)) for name in PLACEHOLDERS}
    return _PLACEHOLDER_RE.sub(lambda m: values[m.group(1)], template)


def mera_task_text(item: HumorItem) -> str:
    """The task text as MERA renders it (``doc_to_text`` / ``mera_judge.task_instruction``): Python's
    ``str.format`` over the inputs, or the bare instruction when formatting fails (stray braces)."""
    try:
        return item.instruction.format(**msgspec.structs.asdict(item.inputs))
    except (KeyError, IndexError, ValueError):
        return item.instruction


def missing_placeholders(template: str) -> list[str]:
    present = set(_PLACEHOLDER_RE.findall(template))
    return [name for name in PLACEHOLDERS if name not in present]


def shot_answer(item: HumorItem) -> str:
    """A shot's reference answer in the two-line format the instruction asks for."""
    ref = split_output(item.outputs)
    if ref is None:
        raise InputError(f"a shot needs a reference answer, got {item.outputs!r}", record=item.id, field="outputs")
    cls, letter = ref
    return f"ОТВЕТ {cls}\nРЕШЕНИЕ {letter}"


def render_prompt(item: HumorItem, shots: Sequence[HumorItem] = ()) -> str:
    """The user prompt: each shot (its prompt, then its answer), then the item's prompt."""
    parts = [f"{render_instruction(s.instruction, s.inputs)}\n{shot_answer(s)}" for s in shots]
    parts.append(render_instruction(item.instruction, item.inputs))
    return SHOT_SEPARATOR.join(parts)


def answer_request(
    provider: str,
    model_id: str,
    item: HumorItem,
    shots: Sequence[HumorItem] = (),
    *,
    max_tokens: int = ANSWER_MAX_TOKENS,
) -> ProviderRequest:
    """The greedy (temperature 0) request for one item, as MERA generates (``do_sample: false``)."""
    return ProviderRequest(
        provider=provider,
        model=model_id,
        messages=(Message("user", render_prompt(item, shots)),),
        temperature=0.0,
        max_tokens=max_tokens,
    )


#: ``[humor] preset``: ``"punchline"`` (our layout: shots inline in one user message, answered in the two-line
#: format, no stop) or ``"mera"`` (lm-eval's Humor run, see :func:`mera_answer_request`).
PRESETS = ("punchline", "mera")
MERA_STOP = ("\n\n",)  # lm-eval's default `until`: humor.yaml sets none


def mera_answer_request(
    provider: str,
    model_id: str,
    item: HumorItem,
    shots: Sequence[HumorItem] = (),
    *,
    max_tokens: int = ANSWER_MAX_TOKENS,
) -> ProviderRequest:
    """The request lm-eval makes for MERA's Humor (chat, few-shot as multi-turn): each shot as a user turn
    (its task text) and an assistant turn (``outputs.strip()``, i.e. ``<class>,<letter>``), then the item;
    greedy, stop at ``"\\n\\n"``, 256 tokens."""
    messages: list[Message] = []
    for shot in shots:
        messages += [Message("user", mera_task_text(shot)), Message("assistant", shot.outputs.strip())]
    messages.append(Message("user", mera_task_text(item)))
    return ProviderRequest(
        provider=provider,
        model=model_id,
        messages=tuple(messages),
        temperature=0.0,
        max_tokens=max_tokens,
        stop=MERA_STOP,
    )


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """``text`` up to the first stop sequence, as lm-eval cuts a generation (also where a provider ignores
    a stop: Anthropic refuses whitespace-only stop sequences)."""
    cut = len(text)
    for s in stop:
        at = text.find(s) if s else -1
        if at >= 0:
            cut = min(cut, at)
    return text[:cut]


def load_official_templates(path: str | os.PathLike[str]) -> list[str]:
    """The five prompt templates of ``dataset_meta.json`` (``{"prompts": [...]}``)."""
    p = Path(path)
    try:
        meta = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read: {exc}", file=str(p)) from None
    prompts = meta.get("prompts") if isinstance(meta, dict) else None
    if not isinstance(prompts, list) or not all(isinstance(x, str) for x in prompts):
        raise InputError("expected a list of strings", file=str(p), field="prompts")
    return prompts
