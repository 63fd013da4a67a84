"""The fake provider over HTTP: SDK compatibility, determinism, stats, and the answer families."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.error
import urllib.request
from pathlib import Path

import msgspec
import pytest

from punchline.data.errors import RetryableProviderError
from punchline.data.requests import Message, ProviderRequest
from punchline.data.simulator import FakeConfig, SimRequest, model_size_b
from punchline.pipelines.humor.data.judge import JUDGE_MARKER
from punchline.pipelines.humor.simulate import HUMOR_CLASSES
from punchline.pipelines.puns.data.completions import greedy_request, sample_request, truncate_before_blank
from punchline.pipelines.puns.simulate import JokeBook
from punchline.workers.fake.answers import GENERIC_WORDS
from punchline.workers.fake.server import FakeProviderServer, fetch_stats, request_wire_key
from punchline.workers.fake.simulators import find_simulators
from punchline.workers.providers import make_provider
from tests.fixtures.simulated import ask

M405 = "meta-llama/Meta-Llama-3.1-405B-Instruct-Turbo"
M3 = "meta-llama/Llama-3.2-3B-Instruct-Turbo"
TAILOR = "The tailor won his court case because he had an excellent"


async def _complete(fake: FakeProviderServer, request: ProviderRequest, kind: str = "openai", **kw: object):
    provider = make_provider("fake", fake.provider_settings(kind, timeout_s=5, **kw))  # type: ignore[arg-type]
    try:
        return await provider.complete(request)
    finally:
        await provider.aclose()


def test_openai_n_choices_usage_and_determinism(fake: FakeProviderServer) -> None:
    req = sample_request("fake", M405, TAILOR)
    first = asyncio.run(_complete(fake, req))
    second = asyncio.run(_complete(fake, req))
    assert len(first.texts) == 20
    assert first.texts == second.texts
    assert first.input_tokens > 0 and first.output_tokens > 0
    assert first.model == M405
    words = {re.sub(r"[^a-z]", "", t.lower()) for t in first.texts}
    assert words & {"lawyer", "alibi", "attorney", "suit", "memory", "defense"}
    stats = fake.stats()
    assert stats.calls == {request_wire_key(req): 2}
    assert stats.ok == 2 and stats.total_calls == 2


def test_split_n_equals_one_n_call_and_slots_differ(fake: FakeProviderServer) -> None:
    req = sample_request("fake", M405, TAILOR, n=6)
    whole = asyncio.run(_complete(fake, req))
    split = asyncio.run(_complete(fake, req, supports_n=False))
    assert split.texts == whole.texts
    slot1 = asyncio.run(_complete(fake, sample_request("fake", M405, TAILOR, n=6, sample_slot=1)))
    assert slot1.texts != whole.texts
    stats = fake.stats()
    assert stats.calls[request_wire_key(req, supports_n=False)] == 6


def test_greedy_is_stable_and_anthropic_works(fake: FakeProviderServer) -> None:
    greedy = asyncio.run(_complete(fake, greedy_request("fake", M3, TAILOR)))
    assert len(greedy.texts) == 1
    msgs = asyncio.run(_complete(fake, sample_request("fake", "claude-test", TAILOR, n=3), kind="anthropic"))
    assert len(msgs.texts) == 3 and all(t.strip() for t in msgs.texts)
    key = request_wire_key(sample_request("fake", "claude-test", TAILOR, n=3), kind="anthropic")
    assert fake.stats().calls[key] == 3


def test_stats_and_reset_over_http(fake: FakeProviderServer) -> None:
    asyncio.run(_complete(fake, greedy_request("fake", M3, "Hello there my")))
    stats = fetch_stats(fake.url)
    assert stats.total_calls == 1 and stats.calls_by_model == {M3: 1}
    assert len(stats.calls) == 1
    brief = fetch_stats(fake.url, brief=True)  # what a poller asks for: the totals without the per-key counts
    assert brief.calls == {} and brief.total_calls == 1 and brief.calls_by_model == {M3: 1}
    with urllib.request.urlopen(urllib.request.Request(f"{fake.url}/reset", data=b"{}", method="POST")) as r:
        assert json.loads(r.read()) == {"ok": True}
    assert fetch_stats(fake.url).total_calls == 0


def test_a_call_still_held_at_a_reset_is_not_the_next_tests_in_flight(fake: FakeProviderServer) -> None:
    """The peak of calls held at once counts the calls since the last reset: a call an earlier test left hanging
    (a timed-out client's) ends unseen, so a test measuring a client's in-flight bound sees only its own."""

    async def go() -> int:
        fake.configure(latency_ms_for_model={"slow": 1500.0})
        hung = asyncio.create_task(_complete(fake, greedy_request("fake", "slow", "Left hanging")))
        while fake.stats().peak_in_flight < 1:
            await asyncio.sleep(0.01)
        fake.reset()  # the next test starts while it is held
        assert fake.stats().peak_in_flight == 0
        await asyncio.gather(*(_complete(fake, greedy_request("fake", M3, f"Own call {i}")) for i in range(2)))
        peak = fake.stats().peak_in_flight
        await hung
        after = fake.stats().peak_in_flight
        return peak if peak == after else -1

    assert asyncio.run(go()) in (1, 2)  # its own two calls, never the hung one (3)


def test_configure_over_http_then_defaults_restored(fake: FakeProviderServer) -> None:
    body = json.dumps({"status_for_model": {"x": 404}}).encode()
    req = urllib.request.Request(f"{fake.url}/configure", data=body, method="POST")
    with urllib.request.urlopen(req) as r:
        assert json.loads(r.read())["status_for_model"] == {"x": 404}
    assert fake.config.status_for_model == {"x": 404}
    fake.restore_defaults()
    assert fake.config.status_for_model == {}


def test_rate_limit_answers_429_with_retry_after(fake: FakeProviderServer) -> None:
    fake.configure(requests_per_minute=60, rate_limit_burst=2)

    async def burst() -> list[BaseException | None]:
        provider = make_provider("fake", fake.provider_settings("openai", timeout_s=5))
        out: list[BaseException | None] = []
        for i in range(4):
            try:
                await provider.complete(greedy_request("fake", M3, f"Prompt number {i} is"))
                out.append(None)
            except RetryableProviderError as exc:
                out.append(exc)
        await provider.aclose()
        return out

    results = asyncio.run(burst())
    assert results[:2] == [None, None]
    errors = [e for e in results[2:] if e is not None]
    assert len(errors) == 2
    assert all(isinstance(e, RetryableProviderError) and e.status == 429 for e in errors)
    assert all(e.retry_after_s is not None and 0 < e.retry_after_s <= 3 for e in errors)  # type: ignore[attr-defined]
    assert fake.stats().faults["rate_limited"] == 2


def test_faults_are_deterministic_per_key_and_attempt(fake: FakeProviderServer) -> None:
    fake.configure(error_500_rate=0.5, seed=7)

    async def outcomes() -> list[bool]:
        provider = make_provider("fake", fake.provider_settings("openai", timeout_s=5))
        out = []
        for i in range(12):
            try:
                await provider.complete(greedy_request("fake", M3, f"Sentence {i % 4} goes"))
                out.append(True)
            except RetryableProviderError:
                out.append(False)
        await provider.aclose()
        return out

    first = asyncio.run(outcomes())
    fake.reset()
    second = asyncio.run(outcomes())
    assert first == second
    assert 0 < sum(first) < 12


# --- answers (pure functions, no HTTP) ----------------------------------------------------------


@pytest.fixture(scope="module")
def book(shared_puns: Path) -> JokeBook:
    return JokeBook.load(str(shared_puns / "puns_205.json"))


@pytest.fixture(scope="module")
def knobs(shared_puns: Path) -> dict[str, dict[str, object]]:
    """The puns simulator's knobs: the jokes of ``book``."""
    return {"puns": {"answer_key": str(shared_puns / "puns_205.json")}}


def test_model_size_parsing() -> None:
    assert model_size_b(M3) == 3
    assert model_size_b(M405) == 405
    assert model_size_b("meta-llama/Llama-3.3-70B-Instruct-Turbo") == 70
    assert model_size_b("gpt-4o") is None


def _funny_rate(book: JokeBook, knobs: dict[str, dict[str, object]], model: str, context: str = "") -> float:
    from punchline.pipelines.puns.data.completions import SYSTEM_PROMPT

    funny = total = 0
    for joke in book.jokes[:60]:
        prompt = truncate_before_blank(joke.sentence)
        punny = {w.lower() for w in joke.punny}
        for c in range(10):
            text = ask(
                f"{context}{prompt}",
                key=f"{model}{prompt}{context}",
                choice=c,
                model=model,
                system=SYSTEM_PROMPT,
                temperature=0.8,
                noise_rate=0.0,
                knobs=knobs,
            )
            funny += text.lower() in punny
            total += 1
    return funny / total


def test_larger_models_and_punny_context_are_funnier(book: JokeBook, knobs: dict[str, dict[str, object]]) -> None:
    small, large = _funny_rate(book, knobs, M3), _funny_rate(book, knobs, M405)
    assert small < large
    a, b = book.jokes[100], book.jokes[101]
    punny_ctx = f"{a.sentence.replace('___', a.punny[0])} {b.sentence.replace('___', b.punny[0])} "
    assert _funny_rate(book, knobs, M3, punny_ctx) > small + 0.2


def test_classification_humor_judge_rating_answers(knobs: dict[str, dict[str, object]]) -> None:
    rates = {"noise_rate": 1.0, "format_variant_rate": 0.0}
    prompt = (
        "For each joke below, classify each candidate word as:\n"
        "Joke index 0:\n  Sentence: x ___\n  Known straight: ['lawyer']\n  Known punny: ['suit']\n"
        "  Candidates: ['suit', 'banana']\n\nJoke index 5:\n  Candidates: ['dog']\n"
    )
    text = ask(prompt, key="k", model="claude", knobs=knobs, **rates)
    assert text.startswith("```")
    parsed = json.loads(text.strip("`").removeprefix("json"))
    assert parsed["0"]["suit"] == "funny" and set(parsed["0"]) == {"suit", "banana"}
    assert parsed["5"]["dog"] in {"straight", "funny", "other"}

    humor = ask("... ОТВЕТ ... РЕШЕНИЕ ...", key="h", knobs=knobs, **rates)
    cls_line, letter_line = humor.split("\n")
    assert cls_line.removeprefix("ОТВЕТ ") in HUMOR_CLASSES
    assert letter_line.removeprefix("РЕШЕНИЕ ") in {"А", "Б", "В", "Г"}

    judge = ask("ОТВЕТ РЕШЕНИЕ", key="j", system=JUDGE_MARKER, knobs=knobs, **rates)
    assert re.fullmatch(r"SCORE: [01]", judge)

    rating = ask("Rate as a JSON array:\n1. a\n2. b\n3. c", key="r", knobs=knobs, **rates)
    assert len(json.loads(rating)) == 3


def test_unknown_sentence_and_message_struct(knobs: dict[str, dict[str, object]]) -> None:
    from punchline.pipelines.puns.data.completions import SYSTEM_PROMPT

    text = ask(
        "A totally new sentence about",
        key="u",
        model=M3,
        system=SYSTEM_PROMPT,
        temperature=0.8,
        noise_rate=0,
        knobs=knobs,
    )
    assert text.isalpha()
    assert Message("user", "x").content == "x"


def test_greedy_cloze_priming_moves_answers(book: JokeBook, knobs: dict[str, dict[str, object]]) -> None:
    """Greedy (temperature 0) cloze prompts: the same answer for every call, funnier after puns."""
    from punchline.pipelines.puns.data.completions import SYSTEM_PROMPT

    funny = {"straight": 0, "funny": 0}
    for i in range(0, 120, 3):
        a, b, c = book.jokes[i], book.jokes[i + 1], book.jokes[i + 2]
        for kind in funny:
            pick = (lambda j: j.punny[0]) if kind == "funny" else (lambda j: j.straight[0])
            prompt = (
                f"{a.sentence.replace('___', pick(a))} {b.sentence.replace('___', pick(b))} "
                f"{truncate_before_blank(c.sentence)}"
            )
            texts = {
                ask(prompt, key=prompt, choice=ch, model=M405, system=SYSTEM_PROMPT, noise_rate=0.0, knobs=knobs)
                for ch in range(3)
            }
            assert len(texts) == 1
            funny[kind] += texts.pop().lower() in {w.lower() for w in c.punny}
    assert funny["funny"] > funny["straight"] + 10


# --- the pipelines' own answers ---------------------------------------------------------------------


def test_the_fake_asks_the_pipelines_it_is_given_first_then_answers_generically() -> None:
    from punchline.workers.fake.simulators import Simulator

    def echo(request: SimRequest) -> str | None:
        return f"pong {request.choice}" if request.user.startswith("ping") else None

    with FakeProviderServer(simulators=[Simulator("echo", echo)]) as server:
        ping = asyncio.run(
            _complete(server, ProviderRequest(provider="fake", model="m", messages=(Message("user", "ping"),), n=2))
        )
        other = asyncio.run(
            _complete(server, ProviderRequest(provider="fake", model="m", messages=(Message("user", "hello"),)))
        )
    assert ping.texts == ["pong 0", "pong 1"]
    assert other.texts[0] in GENERIC_WORDS  # no pipeline claims it: the fake's own generic answer


def test_the_installed_pipelines_knobs_are_theirs_and_checked() -> None:
    names = {s.name for s in find_simulators()}
    assert {"puns", "humor", "curate"} <= names  # found through the entry points, not imported by the fake
    with pytest.raises(ValueError, match=r"pipeline_knobs\.nope"):
        FakeProviderServer(FakeConfig(pipeline_knobs={"nope": {}}))
    with pytest.raises(ValueError, match=r"pipeline_knobs\.humor: .*skil"):
        FakeProviderServer(FakeConfig(pipeline_knobs={"humor": {"skil": {"3B": 1.0}}}))
    server = FakeProviderServer(FakeConfig(pipeline_knobs={"humor": {"skill": {"3B": 1.0}}}))
    with pytest.raises(ValueError, match=r"pipeline_knobs\.puns"):
        server.configure(pipeline_knobs={"puns": {"funny_propensity": {"3B": 2.0}}})
    assert server.config.pipeline_knobs == {"humor": {"skill": {"3B": 1.0}}}  # a refused change changes nothing


def test_worst_case_billing_bills_what_the_budget_holds_and_the_default_is_unchanged(fake: FakeProviderServer) -> None:
    """Issue 39: ``billing = "worst_case"`` bills what a real provider may at most (each UTF-8 byte of input a
    token, plus a chat template's per message and per request; ``max_tokens`` per answer), which is the bound the
    budget holds before a call: an OpenAI call is billed exactly that, an Anthropic one (its system message
    joined into one) no more. The default still bills characters / 4, so the demos' artifacts do not change."""
    from punchline.schedulers.budget import estimate_request_cost
    from punchline.workers.fake.wire import tokens

    messages = [Message(role="system", content="Réponds en un mot."), Message(role="user", content="Пуля — ___")]
    req = ProviderRequest(provider="fake", model=M405, messages=messages, max_tokens=7, n=3, temperature=1.0)
    default = asyncio.run(_complete(fake, req))
    assert default.input_tokens == sum(tokens(m.content) for m in messages)
    assert default.output_tokens == sum(tokens(t) for t in default.texts)
    fake.configure(billing="worst_case")
    settings = fake.provider_settings("openai")
    bound_in, bound_out, _ = estimate_request_cost(settings, req, 1)
    worst = asyncio.run(_complete(fake, req))
    assert worst.texts == default.texts  # the answers are the same; only the bill differs
    assert (worst.input_tokens, worst.output_tokens) == (bound_in, bound_out) == (bound_in, 7 * 3)
    assert worst.input_tokens > default.input_tokens * 3
    one = msgspec.structs.replace(req, n=1)
    claude = asyncio.run(_complete(fake, one, "anthropic"))
    assert 0 < claude.input_tokens <= estimate_request_cost(fake.provider_settings("anthropic"), one, 1)[0]
    assert claude.output_tokens == 7
    assert fake.stats().input_tokens == default.input_tokens + worst.input_tokens + claude.input_tokens


def _post(url: str, body: dict, headers: dict[str, str]) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_each_wire_refuses_and_errs_in_its_own_shape(fake: FakeProviderServer) -> None:
    """The handler names no API: the path says which wire reads the body and writes the error, and a refused
    key on the models list is answered in the shape of the SDK whose headers came."""
    status, openai = _post(f"{fake.openai_base_url}/chat/completions", {"model": "m"}, {})
    assert status == 400 and openai["error"] == {
        "message": "model and messages are required",
        "type": "invalid_request_error",
        "code": 400,
    }
    status, claude = _post(f"{fake.anthropic_base_url}/v1/messages", {"messages": []}, {})
    assert status == 400 and claude == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "model and messages are required"},
    }
    assert fake.stats().total_calls == 0  # refused for free, as a real API does
    fake.configure(require_api_key="sk-right-key-1234")
    for headers, shape in (({"x-api-key": "sk-wrong-key-5678"}, "type"), ({"Authorization": "Bearer x"}, "error")):
        req = urllib.request.Request(f"{fake.url}/v1/models", headers=headers)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req, timeout=5)
        assert refused.value.code == 401
        assert next(iter(json.loads(refused.value.read()))) == shape


def test_a_runs_simulator_keeps_no_count_per_key_and_answers_the_same() -> None:
    """A run's simulator (``per_key=False``) serves runs of any size in the driver (issue 42): no call count per
    key, attempts numbered only while a knob reads them, and the same answers and faults as a test's server."""
    requests = [greedy_request("fake", M3, f"Question {i}") for i in range(5)]
    with FakeProviderServer() as counted, FakeProviderServer(per_key=False) as lean:
        for req in requests:
            assert asyncio.run(_complete(counted, req)).texts == asyncio.run(_complete(lean, req)).texts
        assert len(counted.stats().calls) == 5
        assert lean.stats().calls == {} and lean.stats().total_calls == 5
        assert len(lean._state.attempts) == 0
        lean.configure(fail_first_attempts=1)  # a knob that reads the attempt: numbered again, exactly
        with pytest.raises(RetryableProviderError):
            asyncio.run(_complete(lean, requests[0]))
        assert asyncio.run(_complete(lean, requests[0])).texts == asyncio.run(_complete(counted, requests[0])).texts
