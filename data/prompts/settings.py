"""The ``[prompts]`` table of a run config, as typed, range-checked structs.

Every field is checked when the TOML is read (msgspec ``Meta`` ranges, unknown keys refused), and
:func:`check_settings` then compiles every template, regex and JSON schema, so a typo in any of
them stops the run with one line naming the key before a row is read or a provider is called.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from punchline.data.provider_settings import Mode

Text = Annotated[str, msgspec.Meta(min_length=1, max_length=1_000_000)]
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
Temperature = Annotated[float, msgspec.Meta(ge=0.0, le=2.0)]
TopP = Annotated[float, msgspec.Meta(gt=0.0, le=1.0)]
MaxTokens = Annotated[int, msgspec.Meta(ge=1, le=1_000_000)]
Seed = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
Stop = Annotated[list[Annotated[str, msgspec.Meta(min_length=1, max_length=200)]], msgspec.Meta(max_length=16)]


class MessageTemplate(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One chat message whose content is a Jinja2 template over the row's fields."""

    role: Literal["system", "user", "assistant"]
    content: Text


class Sampling(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Sampling settings; in ``[prompts.sampling.<model>]`` every field left out is the global one."""

    temperature: Temperature | None = None
    top_p: TopP | None = None
    max_tokens: MaxTokens | None = None
    seed: Seed | None = None
    stop: Stop | None = None


class ParseSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """How an answer becomes fields: a regex (its named groups) or a JSON schema (the answer's JSON object,
    also inside a fenced ```json block). Exactly one of ``regex`` and ``json_schema``."""

    regex: Annotated[str, msgspec.Meta(min_length=1, max_length=10_000)] | None = None
    flags: Annotated[str, msgspec.Meta(pattern=r"^[imsx]*$")] = ""  # re flags: i, m, s, x
    json_schema: dict[str, object] | None = None


class JudgeSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A second model reads each answer: its templates see the row's fields plus ``response`` (the
    answer), ``parsed`` (its parsed fields), ``model`` and ``sample``; its verdict has its own parse."""

    model: Name  # "nick" of [prompts] provider, or "provider:nick"
    prompt: Text | None = None
    system: Text | None = None
    messages: list[MessageTemplate] | None = None
    temperature: Temperature = 0.0
    max_tokens: MaxTokens = 256
    seed: Seed | None = None
    parse: ParseSettings | None = None
    mode: Mode | None = None  # this stage's units online or through batches; None: the provider's mode


class PromptsSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Rows x models x n samples, an optional parse step and an optional judge (``[prompts]``)."""

    data: Name  # a .jsonl, .csv or .parquet file, relative to the config file
    id_field: Annotated[str, msgspec.Meta(max_length=200)] = "id"  # "": the row's line number is its id
    provider: Name
    models: Annotated[list[Name], msgspec.Meta(min_length=1, max_length=1000)]
    prompt: Text | None = None  # the user message; or ``messages`` for a whole chat
    system: Text | None = None
    messages: list[MessageTemplate] | None = None
    n: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 1
    temperature: Temperature = 0.0
    top_p: TopP | None = None
    max_tokens: MaxTokens = 256
    seed: Seed | None = None
    stop: Stop = []
    sampling: dict[Name, Sampling] = {}  # per model (as listed in ``models``)
    parse: ParseSettings | None = None
    judge: JudgeSettings | None = None
    mode: Mode | None = None  # of the generate stage (the judge has its own)


class ResolvedSampling(msgspec.Struct, frozen=True, kw_only=True):
    temperature: float
    top_p: float | None
    max_tokens: int
    seed: int | None
    stop: tuple[str, ...]


def sampling_for(cfg: PromptsSettings, model: str) -> ResolvedSampling:
    """The sampling settings of one model: its own ``[prompts.sampling.<model>]`` over the global ones."""
    own = cfg.sampling.get(model, Sampling())
    return ResolvedSampling(
        temperature=cfg.temperature if own.temperature is None else own.temperature,
        top_p=cfg.top_p if own.top_p is None else own.top_p,
        max_tokens=cfg.max_tokens if own.max_tokens is None else own.max_tokens,
        seed=cfg.seed if own.seed is None else own.seed,
        stop=tuple(cfg.stop if own.stop is None else own.stop),
    )


def model_ref(entry: str, default_provider: str) -> tuple[str, str]:
    """``"nick"`` -> (default provider, nick); ``"provider:nick"`` -> (provider, nick)."""
    provider, sep, nick = entry.partition(":")
    return (provider, nick) if sep else (default_provider, entry)
