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

    role: Annotated[Literal["system", "user", "assistant"], msgspec.Meta(description="who says it")]
    content: Annotated[Text, msgspec.Meta(description="a Jinja2 template over the row's fields")]


class Sampling(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Sampling settings; in ``[prompts.sampling.<model>]`` every field left out is the global one."""

    temperature: Annotated[
        Temperature | None, msgspec.Meta(description="sampling temperature (left out: the global one)")
    ] = None
    top_p: Annotated[TopP | None, msgspec.Meta(description="nucleus sampling mass (left out: the global one)")] = None
    max_tokens: Annotated[
        MaxTokens | None, msgspec.Meta(description="answer length cap (left out: the global one)")
    ] = None
    seed: Annotated[
        Seed | None, msgspec.Meta(description="sampling seed, where the provider takes one (left out: the global one)")
    ] = None
    stop: Annotated[Stop | None, msgspec.Meta(description="stop sequences (left out: the global ones)")] = None


class ParseSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """How an answer becomes fields: a regex (its named groups) or a JSON schema (the answer's JSON object,
    also inside a fenced ```json block). Exactly one of ``regex`` and ``json_schema``."""

    regex: Annotated[
        Annotated[str, msgspec.Meta(min_length=1, max_length=10_000)] | None,
        msgspec.Meta(description="a regex whose named groups are the parsed fields"),
    ] = None
    flags: Annotated[str, msgspec.Meta(pattern=r"^[imsx]*$", description="the regex's flags: i, m, s, x")] = ""
    json_schema: Annotated[
        dict[str, object] | None, msgspec.Meta(description="a JSON schema the answer's JSON value must meet")
    ] = None
    structured: Annotated[
        bool,
        msgspec.Meta(
            description="send json_schema as the provider's structured-output format (OpenAI kind: response_format); "
            "the parse step checks every answer either way"
        ),
    ] = False


class JudgeSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A second model reads each answer: its templates see the row's fields plus ``response`` (the
    answer), ``parsed`` (its parsed fields), ``model`` and ``sample``; its verdict has its own parse."""

    model: Annotated[Name, msgspec.Meta(description="nick of the [prompts] provider, or provider:nick")]
    prompt: Annotated[Text | None, msgspec.Meta(description="the judge's user message (a Jinja2 template)")] = None
    system: Annotated[Text | None, msgspec.Meta(description="the judge's system message")] = None
    messages: Annotated[list[MessageTemplate] | None, msgspec.Meta(description="a whole chat instead of prompt")] = None
    temperature: Annotated[Temperature, msgspec.Meta(description="the judge's sampling temperature")] = 0.0
    max_tokens: Annotated[MaxTokens, msgspec.Meta(description="the judge's answer length cap")] = 256
    seed: Annotated[Seed | None, msgspec.Meta(description="the judge's sampling seed")] = None
    parse: Annotated[ParseSettings | None, msgspec.Meta(description="how the verdict becomes fields")] = None
    mode: Annotated[
        Mode | None,
        msgspec.Meta(
            description="the judge stage's units online or through the batch API (default: the provider's mode)"
        ),
    ] = None
    where: Annotated[
        Annotated[str, msgspec.Meta(min_length=1, max_length=10_000)] | None,
        msgspec.Meta(
            description="judge only the answers where this Jinja2 expression is true (it sees what the "
            'judge\'s template sees, e.g. "parsed.answer != row.answer"); none: every answer'
        ),
    ] = None
    fraction: Annotated[
        float,
        msgspec.Meta(gt=0.0, le=1.0, description="judge this share of the answers, drawn by fraction_seed"),
    ] = 1.0
    fraction_seed: Annotated[
        Seed, msgspec.Meta(description="the draw of fraction: the same seed judges the same answers")
    ] = 0


class PromptsSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Rows x models x n samples, an optional parse step and an optional judge (``[prompts]``)."""

    data: Annotated[Name, msgspec.Meta(description="a .jsonl, .csv or .parquet file, relative to the config file")]
    id_field: Annotated[
        str,
        msgspec.Meta(
            max_length=200, description="the column with each row's id (unique); empty: rows are numbered 1, 2, ..."
        ),
    ] = "id"
    provider: Annotated[Name, msgspec.Meta(description="the provider of models given by nickname")]
    models: Annotated[
        list[Name],
        msgspec.Meta(min_length=1, max_length=1000, description="nicknames of provider's models, or provider:nick"),
    ]
    prompt: Annotated[
        Text | None, msgspec.Meta(description="the user message (a Jinja2 template over the row's fields); or messages")
    ] = None
    system: Annotated[Text | None, msgspec.Meta(description="a system message (a Jinja2 template)")] = None
    messages: Annotated[list[MessageTemplate] | None, msgspec.Meta(description="a whole chat instead of prompt")] = None
    n: Annotated[int, msgspec.Meta(ge=1, le=1000, description="samples per row and model")] = 1
    temperature: Annotated[Temperature, msgspec.Meta(description="sampling temperature")] = 0.0
    top_p: Annotated[TopP | None, msgspec.Meta(description="nucleus sampling mass")] = None
    max_tokens: Annotated[MaxTokens, msgspec.Meta(description="answer length cap")] = 256
    seed: Annotated[Seed | None, msgspec.Meta(description="sampling seed, where the provider takes one")] = None
    stop: Annotated[Stop, msgspec.Meta(description="stop sequences (at most 16)")] = []
    sampling: Annotated[
        dict[Name, Sampling],
        msgspec.Meta(description="per model (as listed in models): sampling over the global settings"),
    ] = {}
    parse: Annotated[
        ParseSettings | None, msgspec.Meta(description="how an answer becomes fields (none: no parse step)")
    ] = None
    reference: Annotated[
        Annotated[str, msgspec.Meta(min_length=1, max_length=200)] | None,
        msgspec.Meta(
            description="the column holding each row's expected answer (of the parsed field of its name, else of "
            "the first); the simulated provider answers it right at [simulator] accuracy. Left out: a column "
            "named like a parsed field, else answer, reference, expected, label, gold or target, if the rows have one"
        ),
    ] = None
    judge: Annotated[
        JudgeSettings | None, msgspec.Meta(description="a second model grades every answer (none: no judge)")
    ] = None
    mode: Annotated[
        Mode | None,
        msgspec.Meta(
            description="the generate stage's units online or through the batch API (default: the provider's mode)"
        ),
    ] = None
    null: Annotated[
        Annotated[str, msgspec.Meta(max_length=1000)],
        msgspec.Meta(
            description='a null cell a template renders: "error" (one line naming the row and column, before any '
            'call), "empty" (the empty text), or any other text (rendered as written)'
        ),
    ] = "error"
    max_request_chars: Annotated[
        int,
        msgspec.Meta(
            ge=1,
            le=100_000_000,
            description="the most characters one request's rendered messages may have (checked before any call)",
        ),
    ] = 400_000


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
