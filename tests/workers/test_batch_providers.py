"""The batch endpoints of the fake provider, spoken to by the batch clients (official SDKs) over HTTP.

A batch must answer exactly what the online call answers (the response cache does not care which paid
for it), bill each succeeded request once, and resubmitted requests must get a fresh draw of faults. A
request split into single-choice parts can be submitted part by part, and its parts merge into the online
answer."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest

from punchline.data.errors import RetryableProviderError
from punchline.data.provider_settings import ProviderSettings
from punchline.data.requests import ProviderRequest, ProviderResponse
from punchline.pipelines.puns.data.completions import sample_request
from punchline.workers.batch_provider import merge_parts, parts
from punchline.workers.fake.server import FakeProviderServer, fetch_batch_stats
from punchline.workers.providers import make_batch_provider, make_provider

KINDS = ["openai", "anthropic"]
MODEL = "meta-llama/Meta-Llama-3.1-8B-Instruct-Turbo"
PROMPTS = [
    "The baker was happy because he kneaded the",
    "I used to be a banker but I lost",
    "The math teacher called the meeting because it had too many",
    "A bicycle cannot stand on its own because it is two",
]


def _requests(n: int = 3) -> list[ProviderRequest]:
    return [sample_request("fake", MODEL, p, n=n) for p in PROMPTS]


async def _online(
    fake: FakeProviderServer, kind: str, requests: list[ProviderRequest], settings: ProviderSettings | None = None
) -> list[ProviderResponse]:
    provider = make_provider("fake", settings or fake.provider_settings(kind))
    try:
        return [await provider.complete(r) for r in requests]
    finally:
        await provider.aclose()


@pytest.mark.parametrize("kind", KINDS)
def test_batch_answers_equal_online_answers_and_bill_once(fake: FakeProviderServer, kind: str) -> None:
    requests = _requests()
    batches = make_batch_provider("fake", fake.provider_settings(kind))
    info = batches.create("k1", requests)
    assert info.status == "in_progress"
    done = batches.retrieve(info.batch_id)
    assert done.status == "ended"
    assert done.succeeded == done.total == (12 if kind == "anthropic" else 4)
    got = batches.results(info.batch_id)
    assert len(got) == done.total
    outcomes = [merge_parts(r, got, batches.settings) for r in requests]
    online = asyncio.run(_online(fake, kind, requests))
    assert [o.response for o in outcomes] == online
    assert [o.key for o in outcomes] == [r.key() for r in requests]
    stats = fetch_batch_stats(fake.url)
    assert stats.batches_created == 1
    assert set(stats.billed.values()) == {1}
    assert len(stats.billed) == done.total
    # the online calls above are counted on their own, per wire key, like the batch's billed_keys
    assert sorted(stats.billed_keys) == sorted(fake.stats().calls)


@pytest.mark.parametrize("kind", KINDS)
def test_errored_and_expired_requests_are_not_billed_and_get_a_fresh_draw(fake: FakeProviderServer, kind: str) -> None:
    fake.configure(batch_error_rate=0.3, batch_expire_rate=0.3, seed=3)
    requests = [sample_request("fake", MODEL, f"Joke number {i} ends with a", n=1) for i in range(40)]
    batches = make_batch_provider("fake", fake.provider_settings(kind))
    info = batches.create("k2", requests)
    got = batches.results(info.batch_id)
    outcomes = [merge_parts(r, got, batches.settings) for r in requests]
    failed = [o for o in outcomes if o.response is None]
    kinds = {o.error.split(":")[0] for o in failed}
    assert kinds == {"errored", "expired"}
    ended = batches.retrieve(info.batch_id)
    assert ended.failed == len(failed)
    if kind == "openai":
        assert ended.provider_status == "expired"
    stats = fake.batch_stats()
    assert stats.errored + stats.expired == len(failed)
    assert len(stats.billed) == len(requests) - len(failed)
    # resubmitting only the failed ones: a fresh draw, and nobody is billed twice
    fake.configure(seed=3)
    retry = [r for r, o in zip(requests, outcomes, strict=True) if o.response is None]
    again = batches.results(batches.create("k3", retry).batch_id)
    assert all(merge_parts(r, again, batches.settings).response is not None for r in retry)
    assert set(fake.batch_stats().billed.values()) == {1}
    assert len(fake.batch_stats().billed) == len(requests)


@pytest.mark.parametrize("kind", KINDS)
def test_cancel_before_processing_bills_nothing(fake: FakeProviderServer, kind: str) -> None:
    fake.configure(batch_delay_s=30)
    requests = _requests(n=1)
    batches = make_batch_provider("fake", fake.provider_settings(kind))
    info = batches.create("k4", requests)
    assert batches.retrieve(info.batch_id).status == "in_progress"
    cancelled = batches.cancel(info.batch_id)
    assert cancelled.status == "ended"
    assert set(batches.results(info.batch_id).values()) == {"canceled"}
    assert fake.batch_stats().billed == {}


SPLIT = [("anthropic", {}), ("openai", {"supports_n": False})]


@pytest.mark.parametrize(("kind", "overrides"), SPLIT)
def test_a_split_request_is_submitted_part_by_part_and_merges_into_the_online_answer(
    fake: FakeProviderServer, kind: str, overrides: dict[str, Any]
) -> None:
    settings = fake.provider_settings(kind, **overrides)
    requests = _requests(n=3)
    later = {parts(settings, r)[1].custom_id for r in requests}  # the middle choice of each, asked for later
    assert all(len(parts(settings, r)) == 3 for r in requests)
    batches = make_batch_provider("fake", settings)
    first = batches.create("p1", requests, skip=later)
    got = batches.results(first.batch_id)
    every = {p.custom_id for r in requests for p in parts(settings, r)}
    assert first.total == 8 and set(got) == every - later
    assert {merge_parts(r, got, settings).error for r in requests} == {"missing"}
    second = batches.create("p2", requests, skip=set(got))
    got |= batches.results(second.batch_id)
    assert second.total == 4
    stats = fake.batch_stats()
    assert set(stats.submitted.values()) == {1} and set(stats.billed.values()) == {1} and len(stats.billed) == 12
    # held parts and the rest, merged in choice offset order: exactly the online answer
    online = asyncio.run(_online(fake, kind, requests, settings))
    assert [merge_parts(r, got, settings).response for r in requests] == online
    assert all(len(a.texts) == 3 for a in online)


def test_openai_batches_carry_the_batch_key_in_metadata_and_file_name(fake: FakeProviderServer) -> None:
    settings = fake.provider_settings("openai")
    batches = make_batch_provider("fake", settings)
    for key in ("aaa", "bbb", "ccc"):
        batches.create(key, _requests(n=1))
    listed = list(batches.listing())
    assert [b.batch_key for b in listed] == ["ccc", "bbb", "aaa"]  # newest first
    client = openai.OpenAI(base_url=settings.base_url, api_key="x")
    batch = client.batches.retrieve(listed[0].batch_id)
    assert client.files.retrieve(batch.input_file_id).filename == "punchline-ccc.jsonl"


@pytest.mark.parametrize("kind", KINDS)
def test_crash_after_create_leaves_a_batch_the_client_never_heard_of(fake: FakeProviderServer, kind: str) -> None:
    fake.configure(batch_crash_point="after_create", hang_s=5)
    batches = make_batch_provider("fake", fake.provider_settings(kind, timeout_s=0.5))
    with pytest.raises(RetryableProviderError):
        batches.create("k5", _requests(n=1))
    stats = fake.batch_stats()
    assert stats.batches_created == 1
    assert stats.crashes == {"after_create": 1}
    fake.configure()
    [found] = list(batches.listing())
    assert found.total == 4
    assert found.batch_key == ("k5" if kind == "openai" else "")


@pytest.mark.parametrize("kind", KINDS)
def test_crash_before_create_creates_nothing(fake: FakeProviderServer, kind: str) -> None:
    fake.configure(batch_crash_point="before_create", hang_s=5)
    batches = make_batch_provider("fake", fake.provider_settings(kind, timeout_s=0.5))
    with pytest.raises(RetryableProviderError):
        batches.create("k6", _requests(n=1))
    assert fake.batch_stats().batches_created == 0
    fake.configure()
    assert list(batches.listing()) == []


def _two_model_requests() -> list[ProviderRequest]:
    other = "meta-llama/Meta-Llama-3.1-70B-Instruct-Turbo"
    return [sample_request("fake", MODEL, PROMPTS[0], n=1), sample_request("fake", other, PROMPTS[1], n=1)]


def test_an_openai_file_with_two_models_fails_validation_naming_the_reason(fake: FakeProviderServer) -> None:
    batches = make_batch_provider("fake", fake.provider_settings("openai"))
    info = batches.create("mixed", _two_model_requests())
    ended = batches.retrieve(info.batch_id)
    assert ended.status == "ended" and ended.provider_status == "failed"
    assert "mismatched_model" in ended.error and "line 2" in ended.error and "\n" not in ended.error
    assert ended.total == 0 and batches.results(info.batch_id) == {}
    stats = fake.batch_stats()
    assert stats.failed_validation == 1 and stats.billed == {}
    # the rule is a knob (on by default, as at OpenAI); Anthropic's Message Batches take mixed models
    fake.configure(batch_one_model_per_file=False)
    assert batches.retrieve(batches.create("mixed2", _two_model_requests()).batch_id).provider_status == "completed"
    fake.configure()
    claude = make_batch_provider("fake", fake.provider_settings("anthropic"))
    assert claude.retrieve(claude.create("mixed3", _two_model_requests()).batch_id).succeeded == 2


def test_an_openai_file_over_the_request_limit_fails_validation(fake: FakeProviderServer) -> None:
    fake.configure(batch_max_file_requests=3)
    batches = make_batch_provider("fake", fake.provider_settings("openai"))
    ended = batches.retrieve(batches.create("big", _requests(n=1)).batch_id)
    assert ended.provider_status == "failed" and "too_many_requests" in ended.error and "4 requests" in ended.error


def test_listings_page_at_the_providers_page_sizes_back_to_a_given_time(fake: FakeProviderServer) -> None:
    import time

    import anthropic

    now = time.time()
    old = fake.seed_foreign_batches("openai", 30, created_at=now - 3600)
    fake.seed_foreign_batches("openai", 220, created_at=now - 60)
    fake.seed_foreign_batches("anthropic", 1100, created_at=now - 60)
    openai_settings, claude_settings = fake.provider_settings("openai"), fake.provider_settings("anthropic")
    raw = openai.OpenAI(base_url=openai_settings.base_url, api_key="x", max_retries=0)
    first = raw.batches.list()  # the default page: 20, and more to come
    assert len(first.data) == 20 and first.has_more
    with pytest.raises(openai.BadRequestError):
        raw.batches.list(limit=101)
    claude_raw = anthropic.Anthropic(base_url=claude_settings.base_url, api_key="x", max_retries=0)
    page = claude_raw.messages.batches.list(limit=1000)
    assert len(page.data) == 1000 and page.has_more and page.last_id
    newer = claude_raw.messages.batches.list(limit=5, before_id=page.data[10].id)
    assert [b.id for b in newer.data] == [b.id for b in page.data[5:10]]
    with pytest.raises(anthropic.BadRequestError):
        claude_raw.messages.batches.list(limit=1001)
    # the clients page through everything back to the time asked for, newest first
    listed = list(make_batch_provider("fake", openai_settings).listing(since=now - 600))
    assert len(listed) == 220 and not {b.batch_id for b in listed} & set(old)
    assert len(list(make_batch_provider("fake", openai_settings).listing())) == 250
    assert [b.created_at for b in listed] == sorted((b.created_at for b in listed), reverse=True)
    assert len(list(make_batch_provider("fake", claude_settings).listing(since=now - 600))) == 1100
    # other users' batches are not this account holder's counters
    stats = fake.batch_stats()
    assert stats.batches_created == 0 and stats.foreign_batches == 1350 and stats.billed == {}


def test_foreign_batches_can_be_seeded_over_http(fake: FakeProviderServer) -> None:
    import json
    import urllib.request

    body = json.dumps({"api": "anthropic", "count": 2, "requests": 3, "delay_s": 300}).encode()
    req = urllib.request.Request(f"{fake.url}/batch-seed", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        ids = json.loads(resp.read())["ids"]
    claude = make_batch_provider("fake", fake.provider_settings("anthropic"))
    listed = {b.batch_id: b for b in claude.listing()}
    assert set(listed) == set(ids) and all(b.total == 3 and b.status == "in_progress" for b in listed.values())
