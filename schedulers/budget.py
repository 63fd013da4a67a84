"""Cost control: every paid call is accounted in Redis, and a new unit starts only if it fits the budget.

A worker *reserves* the estimated cost of a unit before its call and *settles* it afterwards (the
reservation is replaced by the actual cost). ``reserve`` refuses when spent + reserved + estimate
would exceed ``max_cost_usd``; units already in flight keep their reservation and finish, so the run
stops scheduling just before the cap. The estimate is an upper bound (:func:`estimate_request_cost`: every byte
of input a token, plus the chat template's, and ``max_tokens`` of output), so what a unit is billed fits in what
it held and spend never passes the cap (as far as answers tell: a call its provider billed but never answered, a
timeout, is not seen by anyone but the provider). All of it is one Lua script per step, so concurrent workers on
every node see one budget.

Reservations belong to a holder (one :class:`Budget` object, i.e. one worker) whose liveness expires
after ``reservation_ttl_s`` without activity, so a worker killed between reserve and settle does not
leak its reservation forever.
"""

from __future__ import annotations

import unicodedata
import uuid
from collections.abc import Mapping, Sequence

import msgspec
import redis

from punchline.data.provider_settings import ProviderSettings
from punchline.data.requests import ProviderRequest
from punchline.data.units import ShardUsage
from punchline.schedulers import lua
from punchline.schedulers.keys import NAMESPACE, BudgetKeys
from punchline.schedulers.server.redis_client import redis_errors

# The budget as a Lua library (schedulers/lua/budget.lua), also run inside the lease scripts, and the
# budget's own scripts (schedulers/lua/budget_*.lua say their KEYS and ARGV).
BUDGET_LUA = lua.script("budget")
_RESERVE = lua.script("budget_reserve")
_HOLD_ONCE = lua.script("budget_hold_once")
_SETTLE = lua.script("budget_settle")


def budget_keys(run_id: str, namespace: str = NAMESPACE) -> list[str]:
    """spent, reserved, alive: the keys every budget script of a run takes, in this order."""
    return BudgetKeys(namespace, run_id).scripted


def usage_key(run_id: str, namespace: str = NAMESPACE) -> str:
    return BudgetKeys(namespace, run_id).usage


def usage_field(stage: str, model: str, what: str) -> str:
    """A field of the usage hash: ``what`` is ``in``, ``out`` or ``usd``."""
    return f"{stage}\x1f{model}\x1f{what}"


class UsageRow(msgspec.Struct, kw_only=True):
    stage: str
    model: str
    input_tokens: int = 0
    output_tokens: int = 0
    usd: float = 0.0


class Budget:
    """The budget of one run, shared through Redis; one object per worker (its reservation holder)."""

    def __init__(
        self,
        client: redis.Redis,
        run_id: str,
        max_cost_usd: float | None,
        *,
        namespace: str = NAMESPACE,
        reservation_ttl_s: float = 900.0,
        holder: str | None = None,
    ) -> None:
        self.r = client
        self.run_id = run_id
        self.max_cost_usd = max_cost_usd
        self.holder = holder or uuid.uuid4().hex
        self.ttl_ms = int(reservation_ttl_s * 1000)
        self.namespace = namespace
        self._keys = budget_keys(run_id, namespace)
        self._usage_key = usage_key(run_id, namespace)
        self._reserve = client.register_script(_RESERVE)
        self._settle = client.register_script(_SETTLE)
        self._hold_once = client.register_script(_HOLD_ONCE)

    def reserve(self, estimate_usd: float) -> bool:
        """Hold ``estimate_usd`` for a unit about to run; False if it would break the cap."""
        cap = -1.0 if self.max_cost_usd is None else self.max_cost_usd
        with redis_errors("budget"):
            ok = self._reserve(keys=self._keys, args=[self.holder, repr(float(estimate_usd)), repr(cap), self.ttl_ms])
        return bool(int(ok))

    def hold_once(self, estimate_usd: float, *, force: bool = False) -> bool:
        """Reserve ``estimate_usd`` under this holder unless it holds a reservation already (then it is only
        kept alive); False if it would break the cap. ``force``: reserve past the cap (a batch that exists)."""
        cap = -1.0 if self.max_cost_usd is None else self.max_cost_usd
        with redis_errors("budget"):
            ok = self._hold_once(
                keys=self._keys,
                args=[self.holder, repr(float(estimate_usd)), repr(cap), self.ttl_ms, "1" if force else "0"],
            )
        return bool(int(ok))

    def settle(self, reserved_usd: float, actual_usd: float) -> None:
        """Replace a reservation by the actual cost (``actual_usd = 0`` to just release it)."""
        with redis_errors("budget"):
            self._settle(
                keys=self._keys,
                args=[self.holder, repr(float(reserved_usd)), repr(float(actual_usd)), self.ttl_ms],
            )

    def record(self, stage: str, model: str, input_tokens: int, output_tokens: int, usd: float) -> None:
        """Account tokens and dollars per (stage, model); reporting only, the cap uses ``settle``."""
        with redis_errors("budget"):
            pipe = self.r.pipeline(transaction=True)
            pipe.hincrby(self._usage_key, usage_field(stage, model, "in"), input_tokens)
            pipe.hincrby(self._usage_key, usage_field(stage, model, "out"), output_tokens)
            pipe.hincrbyfloat(self._usage_key, usage_field(stage, model, "usd"), usd)
            pipe.execute()

    def spent_usd(self) -> float:
        with redis_errors("budget"):
            raw = self.r.get(self._keys[0])
        return float(raw) if raw is not None else 0.0

    def reserved_usd(self) -> float:
        with redis_errors("budget"):
            values = self.r.hvals(self._keys[1])
        return sum(float(v) for v in values)

    def usage(self) -> list[UsageRow]:
        with redis_errors("budget"):
            raw = self.r.hgetall(self._usage_key)
        rows: dict[tuple[str, str], UsageRow] = {}
        for k, v in raw.items():
            stage, model, what = (k.decode() if isinstance(k, bytes) else str(k)).split("\x1f")
            row = rows.setdefault((stage, model), UsageRow(stage=stage, model=model))
            if what == "in":
                row.input_tokens = int(v)
            elif what == "out":
                row.output_tokens = int(v)
            else:
                row.usd = float(v)
        return [rows[k] for k in sorted(rows)]


def usage_rows(ledger: list[UsageRow], store: Mapping[str, ShardUsage]) -> list[UsageRow]:
    """Tokens and dollars per (stage, model): the ledger's rows, corrected by the shard files of finished
    stages (a wiped ledger forgets, the store does not); the larger figure wins, as for the counters."""
    rows = {(r.stage, r.model): msgspec.structs.replace(r) for r in ledger}
    for stage, usage in store.items():
        for model, m in usage.models.items():
            row = rows.setdefault((stage, model), UsageRow(stage=stage, model=model))
            row.input_tokens = max(row.input_tokens, m.input_tokens)
            row.output_tokens = max(row.output_tokens, m.output_tokens)
            row.usd = max(row.usd, m.cost_usd)
    return [rows[k] for k in sorted(rows)]


# What a chat template adds to the text of the messages, in tokens, generously. The template of every API we
# call wraps each message in a few tokens (OpenAI documents 3 per message, 4 with a name; Llama 3's header and
# end-of-turn markers are 5; Gemma's and Mistral's turn markers fewer) and a request once (OpenAI: 3 tokens that
# prime the answer; a begin-of-text token; Llama 3.1's template adds its "Cutting Knowledge Date" lines to every
# request, about 20 tokens; Qwen's adds a default system line when there is none). A SentencePiece tokenizer adds
# one "dummy prefix" token per text, and Anthropic joins system messages with two newlines: both are within the
# per-message figure. Twice or more what any of them adds, so that a provider's template never takes a request past
# what the budget held for it.
TEMPLATE_TOKENS_PER_MESSAGE = 8
TEMPLATE_TOKENS_PER_REQUEST = 64


def text_tokens_bound(text: str) -> int:
    """The most tokens any tokenizer we call can make of ``text``: its UTF-8 bytes. A byte-level BPE (OpenAI's,
    Llama 3's, the one Anthropic published) or a SentencePiece vocabulary with byte fallback (Llama 2's,
    Mistral's, Gemma's) covers at least one byte per token, and a character outside a vocabulary without byte
    fallback is one ``<unk>`` token; a tokenizer that normalizes first (NFKC) may spell a character longer
    (U+FDFA is 33 bytes), so the longer of the two spellings counts."""
    raw = len(text.encode())
    return raw if text.isascii() else max(raw, len(unicodedata.normalize("NFKC", text).encode()))


def messages_tokens_bound(contents: Sequence[str]) -> int:
    """The most input tokens one call with these messages' texts can be billed: each text at one token per byte,
    plus the chat template's tokens per message and per request (see the constants above)."""
    texts = sum(text_tokens_bound(c) for c in contents)
    return texts + TEMPLATE_TOKENS_PER_MESSAGE * len(contents) + TEMPLATE_TOKENS_PER_REQUEST


def input_tokens_bound(request: ProviderRequest) -> int:
    """The most input tokens one call of ``request`` can be billed (:func:`messages_tokens_bound`)."""
    return messages_tokens_bound([m.content for m in request.messages])


def estimate_request_cost(settings: ProviderSettings, request: ProviderRequest, calls: int) -> tuple[int, int, float]:
    """(input tokens, output tokens, dollars) a request may cost at most, what the budget holds before it is
    sent: input is :func:`input_tokens_bound` per call, output is ``max_tokens`` per choice (a provider stops
    there); a model without a price costs 0. ``calls``: the HTTP calls the request makes, which its provider kind
    knows (``workers.providers.wire_calls``: a kind that never returns ``n`` choices in one call, or a provider
    with ``supports_n = false``, splits it into ``n``). (A rate limiter wants what a request is likely to take
    instead: ``schedulers.rate_limit.estimate_tokens``.)"""
    input_tokens = input_tokens_bound(request) * calls
    output_tokens = request.max_tokens * request.n
    return input_tokens, output_tokens, settings.cost_usd(request.model, input_tokens, output_tokens)
