"""One rate limiter for every worker on every node: GCRA in Redis, per provider (and optionally per model).

``requests_per_minute`` and ``tokens_per_minute`` of a ``[providers.<name>]`` table limit that provider
as a whole: all its models, all workers, all runs sharing the ledger, because that is what a provider's
quota means. A model may add its own, separate limit (``requests_per_minute`` on the model's entry);
a call then waits for both.

Each limited scope has two GCRA cells, one for requests and one for tokens, and the provider has a
*rate factor*. Reserving runs one Lua script that advances the cells' theoretical arrival times and
answers how long the caller must wait for its slot; the caller sleeps that long and then calls. Because
slots are handed out in Redis (with Redis' own clock), N workers on M nodes together send at most the
configured rate, evenly spaced. Tokens are reserved from an estimate (``max_tokens`` per choice plus
the prompt) and the unused part is given back when the answer's real usage is known.

The unit path does not call this module's scripts directly: :mod:`punchline.schedulers.leases` runs
:data:`GCRA_LUA` inside the lease script, so taking a request's lease and its rate slot is one round trip.
This class serves retries (each retry needs a new slot) and 429 feedback.

**Never past a window.** Slots are paced at ``headroom`` (0.99) of the configured rate with one
request of burst, from the first call: a provider that counts a 60 s window (most quote per-minute
limits) sees at most 99 % of its limit in any window, so the jitter of the calls' arrival (a few ms to
tens of ms) cannot push a window over. The 1 % margin is the price of having no 429s to recover from.

**After a 429, seconds, not halvings.** The provider's answer says what is wrong: ``Retry-After`` (or
``retry-after-ms``) says when its window frees, and ``x-ratelimit-limit-requests`` /
``anthropic-ratelimit-requests-limit`` what its limit really is. A 429 pushes the provider's request
cell to ``now + retry-after`` (every worker waits that long, once, instead of each retrying into more
429s), and a quoted limit below the configured one becomes the provider's rate cap at once (the
factor goes to ``quoted / configured`` and never recovers above it). A 429 without a quoted limit
lowers the factor by ``decrease_factor`` (0.9; at most once per ``throttle_cooldown_s``, however many
workers saw it), and every ``recover_window_s`` (1 s) without a new 429 it grows back by
``increase_step`` up to the cap: a wrong guess costs a few seconds at 90 %, not minutes at 50 %.

Redis unreachable -> :class:`~punchline.data.errors.LedgerUnavailable`: no Redis, no paid call (fail closed).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping

import msgspec
import redis

from punchline.data import settings as env_registry
from punchline.data.provider_settings import ProviderSettings
from punchline.data.requests import ProviderRequest
from punchline.schedulers import lua
from punchline.schedulers.keys import RateKeys
from punchline.schedulers.server.redis_client import redis_errors

# The GCRA cells as a Lua library (schedulers/lua/gcra.lua), also run inside the lease scripts, and the
# limiter's own scripts (schedulers/lua/rate_*.lua say their KEYS and ARGV).
GCRA_LUA = lua.script("gcra")
_RESERVE = lua.script("rate_reserve")
_REFUND = lua.script("rate_refund")
_THROTTLED = lua.script("rate_throttled")


class RateLimitSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The limiter's knobs; each has a ``PUNCHLINE_RATE_<FIELD>`` variable (:mod:`punchline.data.settings`,
    where their meaning and ranges are defined)."""

    namespace: str = env_registry.RATE_NAMESPACE.default
    burst_requests: float = env_registry.RATE_BURST_REQUESTS.default
    burst_s_tokens: float = env_registry.RATE_BURST_S_TOKENS.default
    headroom: float = env_registry.RATE_HEADROOM.default
    decrease_factor: float = env_registry.RATE_DECREASE_FACTOR.default
    min_factor: float = env_registry.RATE_MIN_FACTOR.default
    increase_step: float = env_registry.RATE_INCREASE_STEP.default
    recover_window_s: float = env_registry.RATE_RECOVER_WINDOW_S.default
    throttle_cooldown_s: float = env_registry.RATE_THROTTLE_COOLDOWN_S.default
    idle_ttl_s: float = env_registry.RATE_IDLE_TTL_S.default

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RateLimitSettings:
        """``PUNCHLINE_RATE_<FIELD>`` overrides each field (e.g. ``PUNCHLINE_RATE_RECOVER_WINDOW_S``)."""
        return cls(**env_registry.env_values(RATE_ENV, env))


RATE_ENV = {
    name: env_registry.BY_NAME[f"PUNCHLINE_RATE_{name.upper()}"] for name in RateLimitSettings.__struct_fields__
}


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """A provider's limits (all models together) and optional per-model limits by model id."""

    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    models: dict[str, tuple[float, float]] = {}

    @classmethod
    def from_provider(cls, settings: ProviderSettings) -> Limits:
        per_model = {m.id: settings.model_limits(m.id) for m in settings.models.values()}
        return cls(
            requests_per_minute=settings.requests_per_minute,
            tokens_per_minute=settings.tokens_per_minute,
            models={k: v for k, v in per_model.items() if v != (0.0, 0.0)},
        )

    @property
    def limited(self) -> bool:
        return bool(self.requests_per_minute or self.tokens_per_minute or self.models)


def estimate_tokens(request: ProviderRequest) -> int:
    """Tokens one request is likely to bill: input (chars / 4) plus ``max_tokens`` per choice. A likely figure on
    purpose, not a bound: the limiter paces the run by it, and a bound (``schedulers.budget.input_tokens_bound``,
    every byte a token, what the budget holds) would pace a tokens-per-minute limit at a quarter of its rate or less."""
    chars = sum(len(m.content) for m in request.messages)
    return math.ceil(chars / 4) + request.max_tokens * request.n


class RateScope:
    """Keys and script arguments of one (provider, model) under a provider's limits; shared by the
    limiter below and the lease script, so both reserve from the same cells."""

    def __init__(self, namespace: str, provider: str, model: str, limits: Limits, settings: RateLimitSettings):
        self.keys = RateKeys(namespace, provider, model).scripted
        m_rpm, m_tpm = limits.models.get(model, (0.0, 0.0))
        self.configured = [limits.requests_per_minute or 0, limits.tokens_per_minute or 0, m_rpm, m_tpm]
        self.rates = [r * settings.headroom for r in self.configured]
        self.limited = any(self.rates)
        self.tail = [
            settings.burst_requests,
            settings.burst_s_tokens,
            settings.increase_step,
            int(settings.recover_window_s * 1000),
            int(settings.idle_ttl_s * 1000),
        ]

    def args(self, requests: int, tokens: int) -> list[float | int]:
        return [*self.rates, requests, tokens, *self.tail]


class RedisRateLimiter:
    """Cluster-wide limiter; every worker builds its own with its own client and the run's limits.

    ``limits`` maps a provider name to its :class:`Limits` (or its :class:`ProviderSettings`); a
    provider without limits is never delayed and costs no Redis call.
    """

    def __init__(
        self,
        client: redis.Redis,
        limits: Mapping[str, Limits | ProviderSettings],
        settings: RateLimitSettings | None = None,
    ) -> None:
        self.r = client
        self.settings = settings or RateLimitSettings()
        self.limits = {
            name: lim if isinstance(lim, Limits) else Limits.from_provider(lim) for name, lim in limits.items()
        }
        self._reserve = client.register_script(_RESERVE)
        self._refund = client.register_script(_REFUND)
        self._throttled = client.register_script(_THROTTLED)
        self._scopes: dict[tuple[str, str], RateScope | None] = {}

    def scope(self, provider: str, model: str) -> RateScope | None:
        """The limited scope of a (provider, model), or None if nothing limits it."""
        key = (provider, model)
        if key not in self._scopes:
            lim = self.limits.get(provider)
            scope = RateScope(self.settings.namespace, provider, model, lim, self.settings) if lim else None
            self._scopes[key] = scope if scope is not None and scope.limited else None
        return self._scopes[key]

    def reserve(self, provider: str, model: str, tokens: int = 0, requests: int = 1) -> float:
        """Reserve the next slot; returns the seconds to wait before using it (blocking Redis call)."""
        scope = self.scope(provider, model)
        if scope is None:
            return 0.0
        with redis_errors("rate limiter"):
            wait_ms, _ = self._reserve(keys=scope.keys, args=scope.args(requests, tokens))
        return max(0, int(wait_ms)) / 1000.0

    async def acquire(self, provider: str, model: str, tokens: int = 0, requests: int = 1) -> None:
        """Wait until this worker may send ``requests`` calls billing about ``tokens`` tokens."""
        if self.scope(provider, model) is None:
            return
        wait_s = await asyncio.to_thread(self.reserve, provider, model, tokens, requests)
        if wait_s > 0:
            await asyncio.sleep(wait_s)

    def refund(self, provider: str, model: str, unused_tokens: int) -> None:
        """Give back tokens reserved from an estimate that the answer did not use."""
        scope = self.scope(provider, model)
        if scope is None or unused_tokens <= 0:
            return
        with redis_errors("rate limiter"):
            self._refund(keys=scope.keys, args=[*scope.args(0, 0), unused_tokens])

    def throttled(
        self, provider: str, model: str, retry_after_s: float | None = None, quoted_rpm: float | None = None
    ) -> float:
        """Record a 429 cluster-wide: every worker waits ``retry_after_s`` once; a limit the provider quoted
        below the configured one caps the rate at it; without one the rate drops by ``decrease_factor``.
        Returns the new factor."""
        scope = self.scope(provider, model)
        if scope is None:
            return 1.0
        s = self.settings
        configured = scope.configured[0]
        quoted = quoted_rpm / configured if quoted_rpm and configured > 0 else 0.0
        args: list[float | int | str] = [
            s.decrease_factor,
            s.min_factor,
            int(s.throttle_cooldown_s * 1000),
            int(s.idle_ttl_s * 1000),
            round(max(0.0, retry_after_s or 0.0) * 1000),
            repr(quoted),
        ]
        with redis_errors("rate limiter"):
            factor = self._throttled(keys=[scope.keys[2], scope.keys[0]], args=args)
        return int(factor) / 1e6

    async def on_throttled(
        self, provider: str, model: str, retry_after_s: float | None = None, quoted_rpm: float | None = None
    ) -> None:
        await asyncio.to_thread(self.throttled, provider, model, retry_after_s, quoted_rpm)

    def factor(self, provider: str, model: str = "") -> float:
        """The provider's current rate factor (1 = full configured rate), as last written to Redis."""
        with redis_errors("rate limiter"):
            raw = self.r.hget(RateKeys(self.settings.namespace, provider).state, "f")
        return float(raw) if raw is not None else 1.0
