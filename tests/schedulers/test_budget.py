"""The Redis budget: reservations against the cap, settlement, expiry of dead holders, accounting."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from punchline.data.errors import LedgerUnavailable
from punchline.data.provider_settings import ModelSettings, ProviderSettings
from punchline.data.requests import Message, ProviderRequest
from punchline.pipelines.puns.data.completions import sample_request
from punchline.schedulers.budget import (
    TEMPLATE_TOKENS_PER_MESSAGE,
    TEMPLATE_TOKENS_PER_REQUEST,
    Budget,
    estimate_request_cost,
    input_tokens_bound,
    text_tokens_bound,
)
from punchline.schedulers.server.redis_client import connect
from punchline.services.redis_server import free_port
from punchline.workers.providers import wire_calls


def test_reserve_refuses_past_the_cap_and_settle_frees(redis_client: redis.Redis) -> None:
    b = Budget(redis_client, "run1", 1.0)
    assert [b.reserve(0.3) for _ in range(4)] == [True, True, True, False]
    assert b.reserved_usd() == pytest.approx(0.9)
    b.settle(0.3, 0.1)  # a unit finished cheaper than estimated
    assert b.spent_usd() == pytest.approx(0.1)
    assert b.reserved_usd() == pytest.approx(0.6)
    assert b.reserve(0.3) is True
    assert b.reserve(0.01) is False  # 0.1 + 0.9 + 0.01 > 1.0
    b.settle(0.3, 0.0)  # a failed unit just releases
    assert b.reserve(0.25) is True


def test_concurrent_holders_share_one_budget(redis_client: redis.Redis) -> None:
    holders = [Budget(connect(_url(redis_client)), "r", 1.0) for _ in range(4)]

    def grab(b: Budget) -> int:
        return sum(b.reserve(0.01) for _ in range(60))

    with ThreadPoolExecutor(4) as pool:
        got = sum(pool.map(grab, holders))
    assert got == 100
    assert holders[0].reserved_usd() == pytest.approx(1.0)


def _url(client: redis.Redis) -> str:
    kw = client.connection_pool.connection_kwargs
    auth = f":{kw['password']}@" if kw.get("password") else ""  # the embedded server asks for its password
    return f"redis://{auth}{kw['host']}:{kw['port']}/{kw.get('db', 0)}"


def test_dead_holder_reservations_expire(redis_client: redis.Redis) -> None:
    dead = Budget(redis_client, "r2", 1.0, reservation_ttl_s=0.2)
    assert dead.reserve(0.9)
    alive = Budget(redis_client, "r2", 1.0)
    assert not alive.reserve(0.5)
    time.sleep(0.3)
    assert alive.reserve(0.5)
    assert alive.reserved_usd() == pytest.approx(0.5)


def test_no_cap_still_accounts(redis_client: redis.Redis) -> None:
    b = Budget(redis_client, "r3", None)
    assert all(b.reserve(100.0) for _ in range(3))
    b.settle(100.0, 1.5)
    b.record("collect", "m8", 120, 30, 0.75)
    b.record("collect", "m8", 80, 20, 0.75)
    b.record("classify", "claude", 10, 5, 0.01)
    assert b.spent_usd() == pytest.approx(1.5)
    rows = {(u.stage, u.model): u for u in b.usage()}
    assert rows[("collect", "m8")].input_tokens == 200 and rows[("collect", "m8")].usd == pytest.approx(1.5)
    assert rows[("classify", "claude")].output_tokens == 5


def test_estimate_is_the_bound_per_call_and_max_tokens_per_choice() -> None:
    settings = ProviderSettings(models={"8b": ModelSettings(id="m8", input_usd_per_mtok=1.0, output_usd_per_mtok=2.0)})
    req = sample_request("together", "m8", "x" * 400, n=20)
    tin, tout, usd = estimate_request_cost(settings, req, wire_calls(settings, req))
    text_bytes = sum(len(m.content.encode()) for m in req.messages)
    per_call = text_bytes + TEMPLATE_TOKENS_PER_MESSAGE * len(req.messages) + TEMPLATE_TOKENS_PER_REQUEST
    assert tin == per_call and tout == 5 * 20
    assert usd == pytest.approx((tin * 1.0 + tout * 2.0) / 1e6)
    split = ProviderSettings(supports_n=False, models=settings.models)
    assert estimate_request_cost(split, req, wire_calls(split, req))[0] == tin * 20  # split into its n calls
    claude = ProviderSettings(kind="anthropic", models=settings.models)  # a kind that never answers n in one call
    assert estimate_request_cost(claude, req, wire_calls(claude, req))[0] == tin * 20
    unpriced = sample_request("together", "another-model", "x")
    assert estimate_request_cost(settings, unpriced, 1)[2] == 0.0  # a model without a price costs 0


@pytest.mark.parametrize(
    ("text", "least_tokens"),
    [
        ("plain ASCII, one byte a character", 33),
        ("Кириллица: два байта на букву", 53),  # 2 bytes a letter
        ("漢字は三バイト", 21),  # 3 bytes a character
        ("🙂🙃", 8),  # 4 bytes a character
        ("\ufdfa", 33),  # NFKC spells this one character in 33 bytes
    ],
)
def test_a_text_is_bounded_by_its_bytes_whatever_the_script(text: str, least_tokens: int) -> None:
    """Issue 39: the bound counts one token per UTF-8 byte (a byte-level or byte-fallback token covers at least a
    byte), so a script of 2-4 bytes a character is never counted as a quarter token a character (the old chars / 4
    priced this Cyrillic line at 8 tokens where it may cost 53), and a character NFKC spells longer counts at its longer
    spelling."""
    assert text_tokens_bound(text) == least_tokens
    assert text_tokens_bound(text) >= len(text.encode())
    request = ProviderRequest(
        provider="p", model="m", messages=[Message(role="system", content="s"), Message(role="user", content=text)]
    )
    template = 2 * TEMPLATE_TOKENS_PER_MESSAGE + TEMPLATE_TOKENS_PER_REQUEST
    assert input_tokens_bound(request) == 1 + least_tokens + template


def test_unreachable_redis_fails_closed() -> None:
    client = redis.Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    b = Budget(client, "r5", 1.0)
    with pytest.raises(LedgerUnavailable):
        b.reserve(0.1)
