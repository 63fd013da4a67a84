"""Both SDK providers against the fake server: every failure kind maps to the right error type,
and the API key never shows up in an error, a repr or a log line."""

from __future__ import annotations

import asyncio
import logging
import time
import traceback

import pytest

from punchline.data.errors import ConfigError, FatalProviderError, ProviderError, RetryableProviderError
from punchline.data.provider_settings import ProviderSettings
from punchline.pipelines.puns.data.completions import greedy_request
from punchline.workers.fake.server import FakeProviderServer
from punchline.workers.providers import make_provider, parse_retry_after, wire_calls

KINDS = ["openai", "anthropic"]
MODEL = "meta-llama/Meta-Llama-3.1-8B-Instruct-Turbo"


async def _attempt(fake: FakeProviderServer, kind: str, **settings: object) -> ProviderError | None:
    provider = make_provider("fake", fake.provider_settings(kind, **settings))  # type: ignore[arg-type]
    try:
        await provider.complete(greedy_request("fake", MODEL, "The baker was happy because he kneaded the"))
    except ProviderError as exc:
        return exc
    finally:
        await provider.aclose()
    return None


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("knobs", "status"),
    [
        ({"fail_first_attempts": 1, "fail_status": 429, "fail_retry_after_s": 0.25}, 429),
        ({"error_500_rate": 1.0}, 500),
        ({"error_503_rate": 1.0}, 503),
        ({"truncated_body_rate": 1.0}, None),
        ({"malformed_rate": 1.0}, None),
    ],
)
def test_retryable_failures(fake: FakeProviderServer, kind: str, knobs: dict, status: int | None) -> None:
    fake.configure(**knobs)
    exc = asyncio.run(_attempt(fake, kind, timeout_s=5))
    assert isinstance(exc, RetryableProviderError), exc
    assert exc.status == status
    if status == 429:
        assert exc.retry_after_s == pytest.approx(0.25)
    assert fake.stats().total_calls == 1


@pytest.mark.parametrize("kind", KINDS)
def test_hang_past_timeout_is_retryable(fake: FakeProviderServer, kind: str) -> None:
    fake.configure(hang_rate=1.0, hang_s=5)
    exc = asyncio.run(_attempt(fake, kind, timeout_s=0.3))
    assert isinstance(exc, RetryableProviderError) and "timed out" in str(exc)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("status", [400, 401, 403, 404])
def test_fatal_statuses(fake: FakeProviderServer, kind: str, status: int) -> None:
    fake.configure(status_for_model={MODEL: status})
    exc = asyncio.run(_attempt(fake, kind, timeout_s=5))
    assert isinstance(exc, FatalProviderError) and exc.status == status
    assert f"HTTP {status}" in str(exc) and "fake/" in str(exc)


@pytest.mark.parametrize("kind", KINDS)
def test_api_key_never_leaks(
    fake: FakeProviderServer, kind: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "sk-PUNCHLINE-SECRET-0123456789abcdef"
    monkeypatch.setenv("PUNCHLINE_TEST_KEY", secret)
    fake.configure(require_api_key="the-right-key")
    caplog.set_level(logging.DEBUG)
    provider = make_provider("fake", fake.provider_settings(kind, api_key_env="PUNCHLINE_TEST_KEY", timeout_s=5))  # type: ignore[arg-type]

    async def go() -> ProviderError:
        try:
            await provider.complete(greedy_request("fake", MODEL, "The key to the"))
        except ProviderError as exc:
            logging.getLogger("punchline.test").exception("provider failed")
            return exc
        finally:
            await provider.aclose()
        raise AssertionError("no error")

    exc = asyncio.run(go())
    assert isinstance(exc, FatalProviderError) and exc.status == 401
    assert fake.stats().faults["unauthorized"] == 1
    text = "".join(traceback.format_exception(exc)) + repr(exc) + repr(provider) + caplog.text
    for fragment in (secret, secret[:8], secret[-8:], "0123456789abcdef"):
        assert fragment not in text


def test_missing_key_env_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PUNCHLINE_ABSENT_KEY", raising=False)
    with pytest.raises(ConfigError, match="PUNCHLINE_ABSENT_KEY"):
        make_provider("x", ProviderSettings(api_key_env="PUNCHLINE_ABSENT_KEY"))


def test_wire_calls_and_retry_after_parsing() -> None:
    req = greedy_request("p", "m", "x")
    many = req.__class__(**{**{f: getattr(req, f) for f in req.__struct_fields__}, "n": 5})
    assert wire_calls(ProviderSettings(), many) == 1
    assert wire_calls(ProviderSettings(supports_n=False), many) == 5
    assert wire_calls(ProviderSettings(kind="anthropic"), many) == 5
    assert parse_retry_after({"retry-after": "2"}) == 2.0
    assert parse_retry_after({"retry-after-ms": "150", "retry-after": "1"}) == 0.15
    assert parse_retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0
    assert parse_retry_after({}) is None


def test_max_concurrency_bounds_calls_in_flight(fake: FakeProviderServer) -> None:
    fake.configure(latency_ms_min=200, latency_ms_max=200)
    provider = make_provider("fake", fake.provider_settings("openai", max_concurrency=2, timeout_s=5))

    async def go() -> float:
        started = time.monotonic()
        await asyncio.gather(*(provider.complete(greedy_request("fake", MODEL, f"Call {i} of the")) for i in range(6)))
        await provider.aclose()
        return time.monotonic() - started

    assert asyncio.run(go()) >= 0.6  # 6 calls of 200 ms, two at a time
    assert fake.stats().ok == 6


@pytest.mark.parametrize(
    ("kind", "supports_n", "reason"),
    [("openai", True, "stop"), ("openai", False, "stop"), ("anthropic", True, "end_turn")],
)
def test_finish_reasons_are_kept_per_choice_and_top_p_is_sent(
    fake: FakeProviderServer, kind: str, supports_n: bool, reason: str
) -> None:
    from punchline.data.requests import Message, ProviderRequest
    from punchline.workers.providers.anthropic import message_body
    from punchline.workers.providers.openai_compat import chat_body

    request = ProviderRequest(
        provider="fake", model=MODEL, messages=(Message("user", "Options: a | b | c"),), n=3, temperature=0.7, top_p=0.9
    )
    assert chat_body(request, 3)["top_p"] == message_body(request)["top_p"] == 0.9
    assert "top_p" not in chat_body(greedy_request("fake", MODEL, "x"), 1)
    provider = make_provider("fake", fake.provider_settings(kind, supports_n=supports_n, timeout_s=5))  # type: ignore[arg-type]

    async def go() -> list[str]:
        try:
            response = await provider.complete(request)
        finally:
            await provider.aclose()
        assert len(response.texts) == 3
        return response.finish_reasons

    assert asyncio.run(go()) == [reason] * 3


def test_a_request_without_top_p_keeps_the_key_it_had_before_the_field() -> None:
    """Answers cached before ``top_p`` existed stay found: the key of a request without it is unchanged."""
    import hashlib

    import msgspec

    from punchline.data.requests import Message, ProviderRequest

    class Before(msgspec.Struct, frozen=True, kw_only=True):  # ProviderRequest as it was
        provider: str
        model: str
        messages: tuple[Message, ...]
        temperature: float = 0.0
        max_tokens: int = 16
        n: int = 1
        stop: tuple[str, ...] = ()
        seed: int | None = None
        sample_slot: int = 0

    fields = {"provider": "p", "model": "m", "messages": (Message("user", "hi"),), "n": 5, "seed": 3, "stop": ("\n",)}
    old = hashlib.sha256(msgspec.msgpack.Encoder(order="deterministic").encode(Before(**fields))).hexdigest()[:40]  # type: ignore[arg-type]
    assert ProviderRequest(**fields).key() == old  # type: ignore[arg-type]
    assert ProviderRequest(**fields, top_p=0.9).key() != old  # type: ignore[arg-type]
