"""The ``litellm`` kind against the fake provider's OpenAI-compatible endpoint (LiteLLM's ``openai/<model>``
route with ``api_base``): answers, ``n`` choices, every failure mapped to our errors, the key never shown,
and a real prompts run through the engine (leases, the rate limiter, the response cache: a second run pays
for nothing)."""

from __future__ import annotations

import asyncio
import json
import logging
import traceback
from pathlib import Path
from typing import Any

import pytest

from punchline.cluster.run.driver import run
from punchline.cluster.stages.outputs import read_jsonl
from punchline.data.errors import FatalProviderError, ProviderError, RetryableProviderError
from punchline.data.provider_settings import ProviderSettings
from punchline.data.requests import ProviderRequest
from punchline.pipelines.puns.data.completions import greedy_request
from punchline.workers.fake.server import FakeProviderServer
from punchline.workers.providers import make_provider, wire_calls
from tests.cluster.run.test_faults import opts

MODEL = "meta-llama/Meta-Llama-3.1-8B-Instruct-Turbo"
ROUTE = f"openai/{MODEL}"  # LiteLLM's route to an OpenAI-compatible api_base: the fake sees MODEL


def _settings(fake: FakeProviderServer, **overrides: Any) -> ProviderSettings:
    return ProviderSettings(kind="litellm", base_url=fake.openai_base_url, **{"timeout_s": 5.0, **overrides})


async def _complete(settings: ProviderSettings, request: ProviderRequest) -> Any:
    provider = make_provider("lite", settings)
    try:
        return await provider.complete(request)
    except ProviderError as exc:
        return exc
    finally:
        await provider.aclose()


def test_answers_through_litellm_and_n_choices_in_one_call_or_n(fake: FakeProviderServer) -> None:
    request = greedy_request("lite", ROUTE, "The baker was happy because he kneaded the")
    answer = asyncio.run(_complete(_settings(fake), request))
    assert answer.texts and answer.texts[0] and answer.input_tokens > 0 and answer.model == MODEL
    assert fake.stats().calls_by_model == {MODEL: 1}

    many = ProviderRequest(
        provider="lite", model=ROUTE, messages=request.messages, n=3, temperature=0.9, max_tokens=8, sample_slot=1
    )
    fake.reset()
    one_call = asyncio.run(_complete(_settings(fake), many))
    assert len(one_call.texts) == 3 and fake.stats().total_calls == 1
    fake.reset()
    split = _settings(fake, supports_n=False)
    assert wire_calls(split, many) == 3
    three_calls = asyncio.run(_complete(split, many))
    # each call carries its choice offset: the same three samples as the one call
    assert three_calls.texts == one_call.texts and fake.stats().total_calls == 3


@pytest.mark.parametrize(
    ("knobs", "status"),
    [
        ({"fail_first_attempts": 1, "fail_status": 429, "fail_retry_after_s": 0.25}, 429),
        ({"error_500_rate": 1.0}, 500),
        ({"error_503_rate": 1.0}, 503),
        ({"status_for_model": {MODEL: 400}}, 400),
        ({"status_for_model": {MODEL: 404}}, 404),
        ({"hang_rate": 1.0, "hang_s": 5}, None),
    ],
)
def test_failures_map_to_our_errors(fake: FakeProviderServer, knobs: dict, status: int | None) -> None:
    fake.configure(**knobs)
    exc = asyncio.run(_complete(_settings(fake, timeout_s=0.5), greedy_request("lite", ROUTE, "A pun on")))
    if status is None:
        assert isinstance(exc, RetryableProviderError) and "timed out" in str(exc)
    elif status >= 429:
        assert isinstance(exc, RetryableProviderError) and exc.status == status, exc
    else:
        assert isinstance(exc, FatalProviderError) and exc.status == status, exc
    if status == 429:
        assert exc.retry_after_s == pytest.approx(0.25)
    assert fake.stats().total_calls == 1, "LiteLLM retried behind the engine's back"


def test_the_key_never_shows(
    fake: FakeProviderServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "sk-PUNCHLINE-SECRET-0123456789abcdef"
    monkeypatch.setenv("PUNCHLINE_TEST_KEY", secret)
    fake.configure(require_api_key="the-right-key")
    caplog.set_level(logging.DEBUG)
    settings = _settings(fake, api_key_env="PUNCHLINE_TEST_KEY")
    provider = make_provider("lite", settings)
    exc = asyncio.run(_complete(settings, greedy_request("lite", ROUTE, "The key to the")))
    assert isinstance(exc, FatalProviderError) and exc.status == 401
    assert fake.stats().faults["unauthorized"] == 1
    text = "".join(traceback.format_exception(exc)) + repr(exc) + repr(provider) + caplog.text
    for fragment in (secret, secret[:8], secret[-8:], "0123456789abcdef"):
        assert fragment not in text


def _prompts_config(tmp: Path, fake: FakeProviderServer) -> Path:
    rows = tmp / "rows.jsonl"
    rows.write_text(
        "".join(
            json.dumps({"id": f"r{i}", "question": f"Colour of {i}?", "options": ["red", "blue"]}) + "\n"
            for i in range(6)
        )
    )
    path = tmp / "lite.toml"
    path.write_text(
        f"""
[run]
pipeline = "prompts"
name = "lite"
shard_size = 4
lease_ms = 10000
workers_per_node = 1

[providers.lite]
kind = "litellm"
base_url = "{fake.openai_base_url}"
requests_per_minute = 6000
max_concurrency = 2
timeout_s = 5
max_retries = 8

[providers.lite.models]
small = {{ id = "openai/sim/llama-3b", input_usd_per_mtok = 1.0, output_usd_per_mtok = 2.0 }}

[prompts]
data = "{rows}"
provider = "lite"
models = ["small"]
n = 2
max_tokens = 16
seed = 3
prompt = \"\"\"{{{{ question }}}} Options: {{{{ options | join(" | ") }}}}\"\"\"
"""
    )
    return path


@pytest.mark.slow
def test_a_prompts_run_through_litellm_pays_each_request_once_and_a_second_run_nothing(
    tmp_path: Path, fake: FakeProviderServer, redis_url: str, ray_local: Any
) -> None:
    # 503s and the fake's own rate limit (429 beyond it): retried by the engine, through its rate limiter
    fake.configure(error_503_rate=0.2, requests_per_minute=1200, rate_limit_burst=2)
    cfg = _prompts_config(tmp_path, fake)
    first = run(str(cfg), opts(tmp_path, redis_url, "lite-1"))
    assert first.state == "finished", first.failures
    stats = fake.stats()
    assert stats.ok == 6, "a request was paid for twice (or not at all)"  # 6 rows x 1 model, n = 2 in one call
    assert len(stats.calls) == 6 and stats.calls_by_model == {"sim/llama-3b": stats.total_calls}
    assert first.counters["generate"].units_done == 6 and first.counters["generate"].units_failed == 0
    outputs = tmp_path / "store" / "lite-1" / "artifacts" / "outputs.jsonl"
    rows = list(read_jsonl(outputs.read_bytes()))
    assert len(rows) == 12 and all(r.text and r.error is None for r in rows)

    fake.reset()
    second = run(str(cfg), opts(tmp_path, redis_url, "lite-2"))
    assert second.state == "finished"
    assert fake.stats().total_calls == 0  # every answer from the response cache
    assert second.counters["generate"].cache_hits == 6
    assert (tmp_path / "store" / "lite-2" / "artifacts" / "outputs.jsonl").read_bytes() == outputs.read_bytes()
