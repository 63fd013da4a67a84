"""One rate limiter for every worker on every node: GCRA in Redis, per (provider, model).

Each (provider, model) has two GCRA cells, one for requests and one for tokens, and a shared *rate
factor*. ``acquire`` runs one Lua script that *reserves* the next conformant slot in both cells
(advancing their theoretical arrival times) and answers how long the caller must wait for it; the
caller sleeps that long and then calls. Because slots are handed out in Redis (with Redis' own
clock), N workers on M nodes together send at most the configured rate, evenly spaced, instead of
each sending 1/N of it in bursts.

Throttling is AIMD: a 429 anywhere calls :meth:`RedisRateLimiter.on_throttled`, which multiplies the
factor of that (provider, model) by ``decrease_factor`` (at most once per ``throttle_cooldown_s``, so a
burst of 429s seen by many workers counts once), and every ``recover_window_s`` without a new 429 the
factor grows back by ``increase_step`` up to 1. Every worker reads the factor in the same script, so a
slowdown is cluster-wide at once.

Redis unreachable -> :class:`~punchline.data.errors.LedgerUnavailable`: no Redis, no paid call (fail closed).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping

import msgspec
import redis

from punchline.data.provider_settings import ProviderSettings
from punchline.schedulers.redis_client import redis_errors

# KEYS: req_tat, tok_tat, state ; ARGV: rpm, tpm, requests, tokens, burst_requests, burst_s_tokens,
#       increase_step, recover_window_ms, idle_ttl_ms.  Returns the wait in ms and the factor (x1e6).
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local factor = tonumber(redis.call('HGET', KEYS[3], 'f') or '1')
local changed = tonumber(redis.call('HGET', KEYS[3], 'c') or '0')
local window = tonumber(ARGV[8])
if factor < 1 and now - changed >= window then
  local steps = math.floor((now - changed) / window)
  factor = math.min(1, factor + steps * tonumber(ARGV[7]))
  redis.call('HSET', KEYS[3], 'f', tostring(factor), 'c', tostring(changed + steps * window))
  redis.call('PEXPIRE', KEYS[3], ARGV[9])
end
local wait = 0
local function cell(key, per_min, cost, burst)
  local interval = 60000 / (per_min * factor)
  local tat = tonumber(redis.call('GET', key) or '0')
  if tat < now then tat = now end
  local new_tat = tat + interval * cost
  local w = new_tat - burst * interval - now
  if w > wait then wait = w end
  redis.call('SET', key, tostring(new_tat), 'PX', math.ceil(new_tat - now) + tonumber(ARGV[9]))
end
local rpm = tonumber(ARGV[1])
local tpm = tonumber(ARGV[2])
if rpm > 0 then cell(KEYS[1], rpm, tonumber(ARGV[3]), tonumber(ARGV[5])) end
if tpm > 0 and tonumber(ARGV[4]) > 0 then
  cell(KEYS[2], tpm, tonumber(ARGV[4]), tpm / 60 * tonumber(ARGV[6]))
end
return {math.ceil(wait), math.floor(factor * 1000000)}
"""

# KEYS: state ; ARGV: decrease_factor, min_factor, cooldown_ms, idle_ttl_ms.  Returns factor (x1e6).
_THROTTLED = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local factor = tonumber(redis.call('HGET', KEYS[1], 'f') or '1')
local last = tonumber(redis.call('HGET', KEYS[1], 'd') or '0')
if now - last >= tonumber(ARGV[3]) then
  factor = math.max(tonumber(ARGV[2]), factor * tonumber(ARGV[1]))
  redis.call('HSET', KEYS[1], 'f', tostring(factor), 'c', tostring(now), 'd', tostring(now))
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
end
return math.floor(factor * 1000000)
"""


class RateLimitSettings(msgspec.Struct, frozen=True, kw_only=True):
    namespace: str = "pl"
    burst_requests: float = 1.0  # requests that may go back to back after an idle spell
    burst_s_tokens: float = 1.0  # token burst, in seconds' worth of the token rate
    decrease_factor: float = 0.5
    min_factor: float = 0.05
    increase_step: float = 0.1
    recover_window_s: float = 5.0
    throttle_cooldown_s: float = 2.0
    idle_ttl_s: float = 3600.0  # Redis forgets a (provider, model) idle this long

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RateLimitSettings:
        """``PUNCHLINE_RATE_<FIELD>`` overrides each field (e.g. ``PUNCHLINE_RATE_RECOVER_WINDOW_S``)."""
        source = os.environ if env is None else env
        values: dict[str, object] = {}
        for name in cls.__struct_fields__:
            raw = source.get(f"PUNCHLINE_RATE_{name.upper()}")
            if raw is not None and raw.strip():
                values[name] = raw.strip() if name == "namespace" else float(raw)
        return msgspec.convert(values, cls)


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None

    @classmethod
    def from_provider(cls, settings: ProviderSettings) -> Limits:
        return cls(requests_per_minute=settings.requests_per_minute, tokens_per_minute=settings.tokens_per_minute)


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
        self._acquire = client.register_script(_ACQUIRE)
        self._throttled = client.register_script(_THROTTLED)

    def _keys(self, provider: str, model: str) -> list[str]:
        base = f"{self.settings.namespace}:rl:{provider}:{model}"
        return [f"{base}:req", f"{base}:tok", f"{base}:state"]

    def _limited(self, provider: str) -> Limits | None:
        lim = self.limits.get(provider)
        if lim is None or not (lim.requests_per_minute or lim.tokens_per_minute):
            return None
        return lim

    def reserve(self, provider: str, model: str, tokens: int = 0, requests: int = 1) -> float:
        """Reserve the next slot; returns the seconds to wait before using it (blocking Redis call)."""
        lim = self._limited(provider)
        if lim is None:
            return 0.0
        s = self.settings
        args = [
            lim.requests_per_minute or 0,
            lim.tokens_per_minute or 0,
            requests,
            tokens,
            s.burst_requests,
            s.burst_s_tokens,
            s.increase_step,
            int(s.recover_window_s * 1000),
            int(s.idle_ttl_s * 1000),
        ]
        with redis_errors("rate limiter"):
            wait_ms, _ = self._acquire(keys=self._keys(provider, model), args=args)
        return max(0, int(wait_ms)) / 1000.0

    async def acquire(self, provider: str, model: str, tokens: int = 0, requests: int = 1) -> None:
        """Wait until this worker may send ``requests`` calls billing about ``tokens`` tokens."""
        if self._limited(provider) is None:
            return
        wait_s = await asyncio.to_thread(self.reserve, provider, model, tokens, requests)
        if wait_s > 0:
            await asyncio.sleep(wait_s)

    def throttled(self, provider: str, model: str) -> float:
        """Record a 429: lower the rate of (provider, model) cluster-wide; returns the new factor."""
        if self._limited(provider) is None:
            return 1.0
        s = self.settings
        args = [s.decrease_factor, s.min_factor, int(s.throttle_cooldown_s * 1000), int(s.idle_ttl_s * 1000)]
        with redis_errors("rate limiter"):
            factor = self._throttled(keys=self._keys(provider, model)[2:], args=args)
        return int(factor) / 1e6

    async def on_throttled(self, provider: str, model: str) -> None:
        await asyncio.to_thread(self.throttled, provider, model)

    def factor(self, provider: str, model: str) -> float:
        """The current rate factor (1 = full configured rate), as last written to Redis."""
        with redis_errors("rate limiter"):
            raw = self.r.hget(self._keys(provider, model)[2], "f")
        return float(raw) if raw is not None else 1.0
