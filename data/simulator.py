"""What the simulated provider (:mod:`punchline.workers.fake`) and a pipeline's own simulated answers share.

The fake provider is the engine's: it speaks the providers' HTTP APIs, injects faults and answers any prompt
generically. What a *pipeline's* prompts should get back (a pun for a pun prompt, a benchmark's answer that is
right as often as the model's size says) is the pipeline's to say: its object may have a ``simulate(request)`` hook,
given a :class:`SimRequest` (one choice of one request), returning the answer's text or None (not one of its
prompts). The fake finds every installed pipeline through the ``punchline.pipelines`` entry points
(:data:`PIPELINES_GROUP`) when it starts, and asks them in name order before its generic answers; a pipeline's
own knobs (an answer key, per-model skills) are its table in :attr:`FakeConfig.pipeline_knobs`, decoded into the
pipeline's ``simulate_knobs`` Struct. So this module, on the ground floor, is all either side imports.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from importlib import resources
from typing import Annotated, Any, Literal

import msgspec

from punchline.data.plugins import PIPELINES

#: the entry-point group a package declares its pipelines in (punchline's own built-ins too)
PIPELINES_GROUP = PIPELINES.name


def installed_pipelines() -> dict[str, str]:
    """Installed pipelines: entry-point name -> ``module:attr`` (read afresh: a test may add a dist-info)."""
    return PIPELINES.targets()


Rate = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]  # a probability per attempt
Ms = Annotated[float, msgspec.Meta(ge=0.0, le=3_600_000.0)]
PerMinute = Annotated[float, msgspec.Meta(ge=1e-6, le=1e12)]


class FakeConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Knobs of the fake provider; rates are probabilities per attempt in [0, 1]."""

    seed: Annotated[int, msgspec.Meta(description="seed of the simulated answers and faults")] = 0
    latency_ms_min: Annotated[Ms, msgspec.Meta(description="least latency of an answer, ms")] = 0.0
    latency_ms_max: Annotated[Ms, msgspec.Meta(description="most latency of an answer, ms (>= latency_ms_min)")] = 0.0
    requests_per_minute: Annotated[
        PerMinute | None, msgspec.Meta(description="the simulator's own rate limit (429 beyond it)")
    ] = None
    rate_limit_burst: Annotated[
        PerMinute | None, msgspec.Meta(description="requests of burst; default one second's worth (at least 1)")
    ] = None
    rate_limit_window_s: Annotated[
        float,
        msgspec.Meta(
            description="> 0: count a sliding window of this many seconds instead of GCRA, as providers that quote "
            "per-minute limits do",
            ge=0.0,
            le=86_400.0,
        ),
    ] = 0.0
    error_500_rate: Annotated[Rate, msgspec.Meta(description="share of attempts answered 500")] = 0.0
    error_503_rate: Annotated[Rate, msgspec.Meta(description="share of attempts answered 503")] = 0.0
    hang_rate: Annotated[Rate, msgspec.Meta(description="share of attempts that hang for hang_s")] = 0.0
    hang_s: Annotated[float, msgspec.Meta(description="how long a hanging attempt hangs, s", ge=0.0, le=3600.0)] = 30.0
    truncated_body_rate: Annotated[Rate, msgspec.Meta(description="share of answers cut mid-body")] = 0.0
    malformed_rate: Annotated[Rate, msgspec.Meta(description="share of answers that are not valid JSON")] = 0.0
    fail_first_attempts: Annotated[
        int,
        msgspec.Meta(
            description="the first this many attempts of every request fail with fail_status", ge=0, le=1_000_000
        ),
    ] = 0
    fail_status: Annotated[int, msgspec.Meta(description="the HTTP status of those failures", ge=100, le=599)] = 503
    fail_retry_after_s: Annotated[
        Annotated[float, msgspec.Meta(ge=0.0, le=86_400.0)] | None,
        msgspec.Meta(description="sent as Retry-After / retry-after-ms with fail_status"),
    ] = None
    status_for_model: Annotated[
        dict[str, Annotated[int, msgspec.Meta(ge=100, le=599)]],
        msgspec.Meta(description="model id -> an HTTP status every call to it gets"),
    ] = {}
    latency_ms_for_model: Annotated[
        dict[str, Ms], msgspec.Meta(description="model id -> fixed latency, ms (instead of the min-max range)")
    ] = {}
    require_api_key: Annotated[
        str | None, msgspec.Meta(description="when set, any other key gets 401 (echoing a masked key)")
    ] = None
    noise_rate: Annotated[Rate, msgspec.Meta(description="share of completions that are noise")] = 0.15
    format_variant_rate: Annotated[
        Rate, msgspec.Meta(description="share of answers in a variant format (quotes, case, padding)")
    ] = 0.2
    simulators: Annotated[
        list[Annotated[str, msgspec.Meta(min_length=3, max_length=300)]],
        msgspec.Meta(
            description="pipelines asked for their simulated answers besides the installed ones, as "
            "'package.module:Name' (a run's own pipeline named so is added by itself)",
            max_length=100,
        ),
    ] = []
    pipeline_knobs: Annotated[
        dict[str, dict[str, Any]],
        msgspec.Meta(
            description="pipeline name -> the knobs of its own simulated answers (its simulate_knobs, e.g. "
            "[simulator.pipeline_knobs.<name>] answer_key = [...]); a pipeline's reference lists them"
        ),
    ] = {}
    judge_flip_rate: Annotated[
        Rate, msgspec.Meta(description="how often the judge's grade disagrees with the reference")
    ] = 0.05
    accuracy: Annotated[
        dict[Annotated[str, msgspec.Meta(min_length=1, max_length=300)], Rate],
        msgspec.Meta(
            description="model (its nick, provider:nick or id) -> the share of a generic stage's answers (a "
            "Generate's, a Judge's verdicts) the simulator draws right; a model left out: by its size (a judge: "
            "1 - judge_flip_rate)"
        ),
    ] = {}
    # batch endpoints (workers/fake/batches.py): processing delay, per-request outcomes, a crash point
    batch_delay_s: Annotated[float, msgspec.Meta(description="how long a batch takes, s", ge=0.0, le=86_400.0)] = 0.0
    batch_error_rate: Annotated[Rate, msgspec.Meta(description="share of a batch's requests that fail")] = 0.0
    batch_expire_rate: Annotated[Rate, msgspec.Meta(description="share of a batch's requests that expire")] = 0.0
    batch_crash_point: Annotated[
        Literal["", "before_create", "after_create", "late_create", "results"],
        msgspec.Meta(description="where a batch call crashes once (tests of the batch intent)"),
    ] = ""
    # OpenAI's validation of an input file: one model (and one endpoint) per file, at most this many lines;
    # a file that breaks a rule makes a batch that ends ``failed`` with the reason in its ``errors``
    batch_one_model_per_file: Annotated[
        bool, msgspec.Meta(description="refuse a batch file with more than one model, as OpenAI")
    ] = True
    batch_max_file_requests: Annotated[
        int, msgspec.Meta(description="refuse a batch file with more lines than this, as OpenAI", ge=1, le=10_000_000)
    ] = 50_000
    billing: Annotated[
        Literal["chars", "worst_case"],
        msgspec.Meta(
            description="the tokens it bills: chars (characters / 4 of each message and answer) or worst_case (the "
            "most a real provider may bill: each UTF-8 byte of input a token plus a chat template's tokens per "
            "message and per request, and max_tokens per answer)"
        ),
    ] = "chars"


class SimRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One choice of one request, as a pipeline's ``simulate`` hook sees it. Every answer must be a pure function
    of these fields (so a replayed request gets the same text, and n single calls the texts of one n call):
    draw from :meth:`rng`, never from the global random."""

    key: str  # the request's wire key (of its n = 1 form): the same for every choice
    choice: int  # which of the request's n answers (with the choice offset of a split request)
    model: str  # the model id
    system: str  # the system messages, joined by blank lines
    user: str  # the last user message
    temperature: float
    seed: int  # the simulator's seed
    noise_rate: float  # share of answers with noise (the simulator's knob)
    format_variant_rate: float  # share of answers in a variant format
    judge_flip_rate: float  # how often a judge's grade disagrees with the reference
    knobs: Any = None  # the pipeline's own knobs: its ``simulate_knobs`` Struct (else the table as a dict)

    @property
    def text(self) -> str:
        """The system and user messages together, where a prompt family's marker is looked for."""
        return f"{self.system}\n{self.user}"

    @property
    def greedy(self) -> bool:
        """Temperature 0: every choice of the request gets the same text."""
        return self.temperature == 0

    def rng(self) -> random.Random:
        """The answer's own random stream: seeded by (seed, key, choice), the choice 0 when greedy."""
        return rng_for(self.seed, self.key, 0 if self.greedy else self.choice)


def rng_for(seed: int, key: str, choice: int, salt: str = "") -> random.Random:
    """A random stream that is a pure function of its arguments."""
    digest = hashlib.sha256(f"{seed}|{key}|{choice}|{salt}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


_SIZE_RE = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)b(?![a-z])")


def model_size_b(model: str) -> float | None:
    """Parameter count in billions parsed from a model id (``"...-405B-..."`` -> 405)."""
    sizes = [float(m) for m in _SIZE_RE.findall(model.lower())]
    return sizes[-1] if sizes else None


def by_size(model: str, overrides: dict[str, float], *, base: float, per_decade: float, cap: float) -> float:
    """A per-model probability: the override whose pattern is in the model id, else one that grows with
    the log of the model's size (8B when the id names none)."""
    for pattern, value in overrides.items():
        if pattern in model:
            return value
    size = model_size_b(model) or 8.0
    return min(cap, base + per_decade * math.log10(max(size, 1.0)))


def sample_file(name: str) -> str | None:
    """The path of a sample file punchline ships (``data/samples/<name>``), if it is there: a simulator's
    default answer key."""
    try:
        path = resources.files("punchline.data") / "samples" / name
    except (ModuleNotFoundError, TypeError):
        return None
    return str(path) if path.is_file() else None
