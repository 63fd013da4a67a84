"""The batch runner against real Redis, a real store and the fake provider's batch endpoints (no Ray):
answers land under the online path's cache keys, failed requests (and failed parts of a request split into
single calls) are resubmitted alone, and an intent whose create outcome is unknown is reconciled with the
provider before anything is paid again."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from rich.console import Console

from punchline.cluster.records.run_batches import declare_not_ours
from punchline.cluster.run.executors.batches import BatchesCancelled, BatchFailed, BatchOptions, BatchRunner
from punchline.data.errors import BudgetExceeded, InputError
from punchline.data.provider_settings import ModelSettings, ProviderSettings
from punchline.data.requests import ProviderResponse
from punchline.data.storage.response_cache import ResponseCache
from punchline.data.stores.local import LocalStore
from punchline.data.units import UnitSpec
from punchline.pipelines.puns.data.completions import sample_request
from punchline.schedulers import keys
from punchline.schedulers.batches import (
    BatchRecord,
    BatchRecords,
    batch_key,
    batch_owner,
    new_tag,
    parts_prefix,
    request_cancel,
)
from punchline.schedulers.budget import Budget, estimate_request_cost
from punchline.schedulers.ledger import request_key
from punchline.workers.batch_provider import part_id, parts
from punchline.workers.fake.batches import BatchStats
from punchline.workers.fake.server import FakeProviderServer
from punchline.workers.providers import make_batch_provider, wire_calls

MODEL = "meta-llama/Meta-Llama-3.1-8B-Instruct-Turbo"
# fault tests inject 20-30 % failures per round: 8 rounds keep a request from failing every one of them
FAST = BatchOptions(poll_min_s=0.01, poll_max_s=0.05, lease_ms=5_000, max_rounds=8)


def live_leases(client: Any) -> list[bytes]:
    """Request keys still leased: a released batch leaves only done markers (``=<pack>``, gone in seconds)."""
    return [k for k in client.keys(keys.request("pl", "*")) if not (client.get(k) or b"=").startswith(b"=")]


def _settings(fake: FakeProviderServer, kind: str, **kw: object) -> ProviderSettings:
    base = fake.provider_settings(kind, timeout_s=3.0)  # generous: a loaded machine answers slowly
    model = ModelSettings(id=MODEL, input_usd_per_mtok=1.0, output_usd_per_mtok=2.0)
    return ProviderSettings(kind=kind, base_url=base.base_url, mode="batch", models={"8b": model}, **kw)  # type: ignore[arg-type]


def _units(n: int, provider: str = "p", samples: int = 2) -> list[UnitSpec]:
    return [
        UnitSpec(unit_id=f"u{i:04d}", request=sample_request(provider, MODEL, f"Joke {i} ends with a", n=samples))
        for i in range(n)
    ]


def billed_parts(stats: BatchStats) -> dict[str, int]:
    """Requests billed per part, whatever intent's tag they were submitted under: a part billed in two batches
    shows as 2 here (per wire id it would be two ids billed once each)."""
    out: dict[str, int] = {}
    for wire, n in stats.billed.items():
        out[part_id(wire)] = out.get(part_id(wire), 0) + n
    return out


def _runner(
    fake: FakeProviderServer, redis_client: redis.Redis, store: LocalStore, kind: str, run_id: str = "r1", **kw: object
) -> BatchRunner:
    settings = {"p": _settings(fake, kind, **kw)}
    return BatchRunner(
        batches=BatchRecords(redis_client, store, run_id),
        cache=ResponseCache(store),
        settings=settings,
        clients={"p": make_batch_provider("p", settings["p"])},
        stage="collect",
        options=FAST,
        sleep=lambda s: None,
    )


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_batch_answers_go_into_the_online_cache_keys_at_half_price(
    fake: FakeProviderServer, redis_client: redis.Redis, tmp_path: Path, kind: str
) -> None:
    store = LocalStore(tmp_path)
    units = _units(10)
    totals = _runner(fake, redis_client, store, kind, batch_max_requests=8).run(units)
    cache = ResponseCache(store)
    assert all(cache.contains(u.request.key()) for u in units)
    records = BatchRecords(redis_client, store, "r1").records()
    assert all(r.state == "collected" and r.batch_id for r in records)
    per_request = 2 if kind == "anthropic" else 1  # anthropic has no n: two single calls per request
    assert sum(r.requests for r in records) == 10 * per_request
    assert all(r.requests <= 8 for r in records)
    assert totals.batches == len(records) == fake.batch_stats().batches_created
    assert totals.cost_usd == pytest.approx(sum(r.online_cost_usd for r in records) / 2)
    assert set(billed_parts(fake.batch_stats()).values()) == {1}
    assert live_leases(redis_client) == []  # the batches' leases are gone
    # a second run of the same units pays for nothing
    again = _runner(fake, redis_client, store, kind, run_id="r2").run(units)
    assert again.batches == 0 and fake.batch_stats().batches_created == len(records)


def _answers(store: LocalStore, units: list[UnitSpec]) -> dict[str, ProviderResponse]:
    cache = ResponseCache(store)
    out = {}
    for u in units:
        hit = cache.get(u.request.key())
        assert hit is not None, f"{u.unit_id} has no cached answer"
        out[u.unit_id] = hit.response
    return out


def _clean_answers(
    fake: FakeProviderServer,
    redis_client: redis.Redis,
    tmp_path: Path,
    kind: str,
    units: list[UnitSpec],
    seed: int,
    **kw: Any,
) -> dict[str, ProviderResponse]:
    """What a batch run without a single failure caches for ``units`` (then the fake's counters are reset)."""
    fake.configure(seed=seed)  # the seed picks the fake's answers too
    store = LocalStore(tmp_path / "clean")
    _runner(fake, redis_client, store, kind, run_id="clean", **kw).run(units)
    fake.reset()
    return _answers(store, units)


# (kind, provider settings, samples per request): single calls, and requests split into n single-choice parts
RESUBMIT = [
    ("openai", {}, 1),
    ("anthropic", {}, 1),
    ("anthropic", {}, 3),
    ("openai", {"supports_n": False}, 3),
]


@pytest.mark.slow  # processes killed and resumed: the full suite, not `make test-fast`
@pytest.mark.parametrize(("kind", "kw", "samples"), RESUBMIT)
def test_only_errored_and_expired_requests_are_resubmitted(
    fake: FakeProviderServer, redis_client: redis.Redis, tmp_path: Path, kind: str, kw: dict[str, Any], samples: int
) -> None:
    units = _units(60, samples=samples)
    expected = _clean_answers(fake, redis_client, tmp_path, kind, units, 7, **kw)
    fake.configure(batch_error_rate=0.10, batch_expire_rate=0.05, seed=7)
    store = LocalStore(tmp_path)
    totals = _runner(fake, redis_client, store, kind, **kw).run(units)
    # the cached answers are the ones a batch without failures gives: same texts, same order, same tokens
    assert _answers(store, units) == expected
    assert totals.requests_answered == 60
    stats = fake.batch_stats()
    assert stats.errored > 0 and stats.expired > 0
    assert set(billed_parts(stats).values()) == {1}
    parts_total = 60 * samples
    assert len(stats.billed) == parts_total
    records = BatchRecords(redis_client, store, "r1").records()
    first, *later = records
    assert first.failed > 0 and first.requests == parts_total and first.succeeded + first.failed == parts_total
    # each later batch holds exactly what failed before it: every failure is asked for once more, and no part
    # that succeeded is ever submitted again
    assert sum(r.requests for r in later) == stats.errored + stats.expired == sum(r.failed for r in records)
    assert sum(stats.submitted.values()) == parts_total + stats.errored + stats.expired
    assert all(r.requests < first.requests for r in later)
    if samples > 1:  # requests partly answered were asked only for their missing parts
        assert any(r.held_parts for r in later)
        assert all(r.requests == sum(samples for _ in r.keys) - len(r.held_parts) for r in records)
    assert list(store.list(parts_prefix("r1"))) == []  # every part file went once its request was cached
    assert live_leases(redis_client) == []
    assert sum(r.cost_usd for r in records) == pytest.approx(sum(r.online_cost_usd for r in records) / 2)


class Killed(BaseException):
    """What kill -9 does to the runner: nothing after this point happens."""


@pytest.mark.slow  # processes killed and resumed: the full suite, not `make test-fast`
@pytest.mark.parametrize(("kind", "kw"), [("anthropic", {}), ("openai", {"supports_n": False})])
def test_a_driver_killed_after_keeping_parts_before_collected_resumes_billing_each_part_once(
    fake: FakeProviderServer,
    redis_client: redis.Redis,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
    kw: dict[str, Any],
) -> None:
    units = _units(12, samples=3)
    expected = _clean_answers(fake, redis_client, tmp_path, kind, units, 11, **kw)
    fake.configure(batch_error_rate=0.25, batch_expire_rate=0.05, seed=11)
    store = LocalStore(tmp_path)
    runner = _runner(fake, redis_client, store, kind, **kw)
    write = runner.batches.write

    def killing_write(rec: BatchRecord) -> None:
        if rec.state == "collected":  # the part files are written; the record never says collected
            raise Killed
        write(rec)

    monkeypatch.setattr(runner.batches, "write", killing_write)
    with pytest.raises(Killed):
        runner.run(units)
    [rec] = BatchRecords(redis_client, store, "r1").records()
    assert rec.state == "submitted"
    held = BatchRecords(redis_client, store, "r1").held_parts()
    assert held, "no request was partly answered: pick another seed"
    billed_before = billed_parts(fake.batch_stats())
    assert all(cid in billed_before for h in held.values() for cid in h.parts)

    _runner(fake, redis_client, store, kind, **kw).run(units)  # the resumed driver (same run, same store)
    assert _answers(store, units) == expected
    stats = fake.batch_stats()
    assert set(billed_parts(stats).values()) == {1} and len(stats.billed) == 36
    records = BatchRecords(redis_client, store, "r1").records()
    assert records[0].batch_id == rec.batch_id and records[0].state == "collected"
    assert stats.batches_created == len(records)
    assert any(r.held_parts for r in records[1:])
    # nothing that succeeded was asked for again: each failure is submitted once more, and that is all
    assert sum(stats.submitted.values()) == 36 + stats.errored + stats.expired
    assert list(store.list(parts_prefix("r1"))) == []
    assert live_leases(redis_client) == []


def test_a_batch_of_missing_parts_created_by_a_dead_driver_is_found_by_its_count(
    fake: FakeProviderServer, redis_client: redis.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver dies right after creating a batch of only the missing parts (no id recorded): the resumed
    driver's intent counts the same parts, so Anthropic's listing (count and time) finds that batch."""
    units = _units(12, samples=3)
    fake.configure(batch_error_rate=0.25, seed=11)
    store = LocalStore(tmp_path)
    runner = _runner(fake, redis_client, store, "anthropic")
    client = runner.clients["p"]
    create = client.create

    def dying_create(key: str, requests: list[Any], skip: Any = (), tag: str = "") -> Any:
        info = create(key, requests, skip, tag)
        if skip:  # a batch that leaves held parts out was created; the driver dies before recording it
            raise Killed
        return info

    monkeypatch.setattr(client, "create", dying_create)
    with pytest.raises(Killed):
        runner.run(units)
    intent = [r for r in BatchRecords(redis_client, store, "r1").records() if r.state == "intent"]
    assert len(intent) == 1 and intent[0].held_parts
    fake.configure()
    _runner(fake, redis_client, store, "anthropic").run(units)
    records = BatchRecords(redis_client, store, "r1").records()
    assert fake.batch_stats().batches_created == len(records)  # adopted, never created again
    assert all(r.state == "collected" and r.batch_id for r in records)
    assert set(billed_parts(fake.batch_stats()).values()) == {1} and len(fake.batch_stats().billed) == 36
    assert all(ResponseCache(store).contains(u.request.key()) for u in units)


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_an_intent_whose_batch_was_created_is_adopted_not_submitted_again(
    fake: FakeProviderServer, redis_client: redis.Redis, tmp_path: Path, kind: str
) -> None:
    store = LocalStore(tmp_path)
    units = _units(6)
    fake.configure(batch_crash_point="after_create", hang_s=6)  # well past the 3 s client timeout
    runner = _runner(fake, redis_client, store, kind)
    runner.opt = BatchOptions(poll_min_s=0.01, poll_max_s=0.05, lease_ms=5_000, max_rounds=1)
    # the create call times out after the batch was made: the runner asks the listing and finds it
    runner.run(units)
    assert fake.batch_stats().batches_created == 1
    [rec] = BatchRecords(redis_client, store, "r1").records()
    assert rec.state == "collected" and rec.batch_id
    assert set(billed_parts(fake.batch_stats()).values()) == {1}


def _intent_left_behind(
    ledger: BatchRecords, units: list[UnitSpec], requests: int, create_started: bool = True
) -> BatchRecord:
    """What a driver killed after writing an intent leaves behind: its create call started (a batch may or may
    not exist), or not yet."""
    keys = sorted(u.request.key() for u in units)
    rec = BatchRecord(
        batch_key=batch_key(keys),
        run_id="r1",
        stage="collect",
        provider="p",
        model=MODEL,
        tag=new_tag(),
        keys=keys,
        requests=requests,
        intent_at=time.time(),
        create_at=time.time() if create_started else 0.0,
    )
    ledger.write(rec)
    return rec


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_dead_drivers_batch_is_found_behind_150_newer_batches_of_others(
    fake: FakeProviderServer, redis_client: redis.Redis, tmp_path: Path, kind: str
) -> None:
    """Killed between the create call and recording the id, then 150 other batches on the account (for
    Anthropic with the same request count and time, and the same requests: each is checked by its results),
    then resume: the dead driver's batch is found on the listing's second page / among look-alikes and adopted;
    nothing is created or billed twice."""
    store = LocalStore(tmp_path)
    units = _units(5)
    ledger = BatchRecords(redis_client, store, "r1")
    per_request = 2 if kind == "anthropic" else 1
    rec = _intent_left_behind(ledger, units, requests=5 * per_request)
    client = make_batch_provider("p", _settings(fake, kind))
    created = client.create(rec.batch_key, [u.request for u in units], tag=rec.tag)
    look_alike = sorted(p.custom_id for u in units for p in parts(client.settings, u.request))
    fake.seed_foreign_batches(kind, 150, requests=len(look_alike), custom_ids=look_alike, created_at=time.time() + 1)
    totals = _runner(fake, redis_client, store, kind).run(units)
    [after] = ledger.records()
    assert after.batch_id == created.batch_id and after.state == "collected"
    assert totals.batches == 1 and totals.requests_answered == 5
    stats = fake.batch_stats()
    assert stats.batches_created == 1 and stats.foreign_cancelled == 0
    assert set(billed_parts(stats).values()) == {1} and len(billed_parts(stats)) == 5 * per_request
    assert all(ResponseCache(store).contains(u.request.key()) for u in units)


def test_a_foreign_anthropic_batch_with_the_same_count_and_time_is_never_adopted_or_cancelled(
    fake: FakeProviderServer, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """The driver died in its create call, which never reached the provider. On the account: another user's
    batch of the very same requests
    (ended), and another's open batch with the same count, both created at the intent's time. Neither carries
    the intent's tag: the ended one is ruled out by its results, the open one holds the intent back (nothing
    is created while it might be ours) until its results rule it out too; then the run creates its own."""
    store = LocalStore(tmp_path)
    units = _units(4, samples=1)
    ledger = BatchRecords(redis_client, store, "r1")
    rec = _intent_left_behind(ledger, units, requests=4)
    settings = _settings(fake, "anthropic")
    same = sorted(p.custom_id for u in units for p in parts(settings, u.request))
    [twin] = fake.seed_foreign_batches("anthropic", 1, requests=4, custom_ids=same, created_at=rec.intent_at)
    [slow] = fake.seed_foreign_batches("anthropic", 1, requests=4, created_at=rec.intent_at + 1, delay_s=1.0)
    seen: list[str] = []

    def sleep(s: float) -> None:  # what the intent's record says while the open batch may still be ours
        stored = ledger.read(rec.batch_key)
        seen.append(stored.provider_status if stored else "")
        time.sleep(0.05)

    runner = _runner(fake, redis_client, store, "anthropic")
    runner.sleep = sleep
    runner.run(units)
    [after] = ledger.records()
    assert after.state == "collected" and after.batch_id not in (twin, slow)
    assert any(slow in status for status in seen)  # it waited for the open one to tell, and said so
    stats = fake.batch_stats()
    assert stats.batches_created == 1 and stats.foreign_cancelled == 0
    assert set(billed_parts(stats).values()) == {1} and len(billed_parts(stats)) == 4
    assert all(ResponseCache(store).contains(u.request.key()) for u in units)


def test_batches_hold_one_model_each_so_openai_validates_them(
    fake: FakeProviderServer, redis_client: redis.Redis, tmp_path: Path
) -> None:
    other = "meta-llama/Meta-Llama-3.1-70B-Instruct-Turbo"
    units = _units(6) + [
        UnitSpec(unit_id=f"v{i}", request=sample_request("p", other, f"Joke {i} ends with a", n=2)) for i in range(6)
    ]
    store = LocalStore(tmp_path)
    runner = _runner(fake, redis_client, store, "openai")
    runner.settings["p"].models["70b"] = ModelSettings(id=other, input_usd_per_mtok=3.0, output_usd_per_mtok=4.0)
    totals = runner.run(units)  # the fake enforces one model per input file (the default, as OpenAI)
    records = BatchRecords(redis_client, store, "r1").records()
    assert sorted(r.model for r in records) == sorted([MODEL, other])
    assert all(r.state == "collected" and r.succeeded == r.requests == 6 for r in records)
    assert fake.batch_stats().failed_validation == 0 and totals.requests_answered == 12
    assert all(r.cost_usd == pytest.approx(r.online_cost_usd / 2) and r.cost_usd > 0 for r in records)


@pytest.mark.parametrize("fallback", ["fail", "online"])
def test_a_batch_the_provider_refuses_is_recorded_with_its_reason_and_never_paid_online_unasked(
    fake: FakeProviderServer, redis_client: redis.Redis, tmp_path: Path, fallback: str
) -> None:
    fake.configure(batch_max_file_requests=3)  # the runner's batches hold up to 8: the first one is refused
    store = LocalStore(tmp_path)
    units = _units(10)
    runner = _runner(fake, redis_client, store, "openai", batch_max_requests=8, batch_fallback=fallback)
    if fallback == "fail":
        with pytest.raises(BatchFailed) as err:
            runner.run(units)
        line = str(err.value)
        assert "\n" not in line and "too_many_requests" in line and 'batch_fallback = "online"' in line
    else:
        assert runner.run(units).online_fallback == 8
    refused, ok = BatchRecords(redis_client, store, "r1").records()
    assert refused.state == "failed" and "too_many_requests" in refused.error and refused.requests == 8
    assert ok.state == "collected" and ok.succeeded == 2
    assert (refused.fallback, refused.online_requests) == (("online", 8) if fallback == "online" else ("", 0))
    cache = ResponseCache(store)
    assert sum(cache.contains(u.request.key()) for u in units) == 2  # never resubmitted, nothing paid online here
    assert fake.batch_stats().batches_created == 2 and fake.stats().total_calls == 0
    assert live_leases(redis_client) == []  # the refused batch's units are free for the online path (or none)


@pytest.mark.parametrize("fallback", ["fail", "online"])
def test_requests_failing_every_round_stop_the_stage_unless_online_is_allowed(
    fake: FakeProviderServer, redis_client: redis.Redis, tmp_path: Path, fallback: str
) -> None:
    fake.configure(batch_error_rate=1.0)
    store = LocalStore(tmp_path)
    runner = _runner(fake, redis_client, store, "openai", batch_fallback=fallback)
    runner.opt = BatchOptions(poll_min_s=0.01, poll_max_s=0.05, lease_ms=5_000, max_rounds=2)
    if fallback == "fail":
        with pytest.raises(BatchFailed, match=rf"3 requests failed in 2 batches each: 3 to p/{MODEL} \(last: errored"):
            runner.run(_units(3))
    else:
        assert runner.run(_units(3)).online_fallback == 3
    records = BatchRecords(redis_client, store, "r1").records()
    assert len(records) == 2 and fake.batch_stats().billed == {}
    assert records[-1].online_requests == (3 if fallback == "online" else 0)


def test_requests_failing_every_round_are_named_per_provider_and_model_with_their_counts(
    fake: FakeProviderServer, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """Issue 39 item 8a: the stop names each provider and model with its own count (it named the first request's
    provider for all of them: "9 to anthropic" where 7 were Anthropic's and 2 Together's)."""
    fake.configure(batch_error_rate=1.0)
    store = LocalStore(tmp_path)
    settings = {"claude": _settings(fake, "anthropic"), "together": _settings(fake, "openai")}
    runner = BatchRunner(
        batches=BatchRecords(redis_client, store, "r1"),
        cache=ResponseCache(store),
        settings=settings,
        clients={name: make_batch_provider(name, s) for name, s in settings.items()},
        stage="collect",
        options=BatchOptions(poll_min_s=0.01, poll_max_s=0.05, lease_ms=5_000, max_rounds=2),
        sleep=lambda s: None,
    )
    units = _units(7, "claude", samples=1) + [
        UnitSpec(unit_id=f"t{i}", request=sample_request("together", MODEL, f"Pun {i} ends with a", n=1))
        for i in range(2)
    ]
    with pytest.raises(BatchFailed) as stopped:
        runner.run(units)
    message = str(stopped.value)
    assert f"9 requests failed in 2 batches each: 7 to claude/{MODEL} (last: " in message, message
    assert f"2 to together/{MODEL} (last: " in message, message
    assert 'batch_fallback = "online" in [providers.claude] and [providers.together]' in message, message


def test_a_cancel_recorded_while_the_runner_is_live_stops_it_resending(
    fake: FakeProviderServer, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """``punchline batches --cancel`` records the cancel; the live runner cancels what it has open (also a
    batch the command could not know of), sends nothing more, keeps what came back, and stops; a resume
    submits the rest."""
    fake.configure(batch_delay_s=300)
    store = LocalStore(tmp_path)
    units = _units(6)
    runner = _runner(fake, redis_client, store, "openai", batch_max_requests=4)
    calls: list[int] = []

    def sleep(_: float) -> None:
        calls.append(1)
        if len(calls) == 2:  # both batches are open: the command records a cancel (and cancels nothing itself)
            request_cancel(store, "r1", time.time())

    runner.sleep = sleep
    with pytest.raises(BatchesCancelled) as err:
        runner.run(units)
    assert "6 requests are unanswered" in str(err.value) and "\n" not in str(err.value)
    records = BatchRecords(redis_client, store, "r1").records()
    assert len(records) == 2 and all(r.cancelled_at and r.state == "collected" for r in records)
    stats = fake.batch_stats()
    assert stats.batches_created == 2 and stats.cancelled == 6 and stats.billed == {}
    assert sum(stats.submitted.values()) == 6  # nothing was sent again
    fake.configure()
    _runner(fake, redis_client, store, "openai").run(units)  # the resume: the cancel is history
    assert all(ResponseCache(store).contains(u.request.key()) for u in units)
    assert set(billed_parts(fake.batch_stats()).values()) == {1} and len(fake.batch_stats().billed) == 6


def test_units_leased_by_someone_else_wait_instead_of_being_submitted(
    fake: FakeProviderServer, redis_client: redis.Redis, tmp_path: Path
) -> None:
    store = LocalStore(tmp_path)
    units = _units(4)
    held = units[0].request.key()
    redis_client.set(request_key("pl", held), "online-worker|1", px=60_000)
    cache = ResponseCache(store)
    calls = []

    def sleep(_: float) -> None:  # the online holder finishes while the batch runner waits
        calls.append(1)
        if len(calls) == 3:
            cache.put(units[0].request, cache.get(units[1].request.key()).response)  # type: ignore[union-attr]

    runner = _runner(fake, redis_client, store, "openai")
    runner.sleep = sleep
    runner.run(units)
    assert held not in fake.batch_stats().billed_keys
    assert len(fake.batch_stats().billed) == 3
    assert redis_client.get(request_key("pl", held)) == b"online-worker|1"
    assert batch_owner("r1", "k")  # owner names are per run and batch


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_create_that_lands_after_the_client_gave_up_is_adopted_not_made_twice(
    fake: FakeProviderServer, redis_client: redis.Redis, tmp_path: Path, kind: str
) -> None:
    """The create call times out and the provider creates the batch a moment later: the listing shows nothing
    at first, and the runner waits out ``create_grace_s`` before creating again, so it finds that batch."""
    fake.configure(batch_crash_point="late_create", hang_s=1.5)
    store = LocalStore(tmp_path)
    units = _units(4, samples=1)
    runner = _runner(fake, redis_client, store, kind, timeout_s=0.5)  # the client gives up before it lands
    runner.opt = BatchOptions(poll_min_s=0.05, poll_max_s=0.1, lease_ms=5_000, create_grace_s=30)

    def sleep(s: float) -> None:
        time.sleep(s)
        if fake.batch_stats().crashes.get("late_create") and fake.batch_stats().hanging == 0:
            fake.configure()  # the batch has landed: the provider is healthy again

    runner.sleep = sleep
    runner.run(units)
    [rec] = BatchRecords(redis_client, store, "r1").records()
    assert rec.state == "collected" and fake.batch_stats().batches_created == 1
    assert set(billed_parts(fake.batch_stats()).values()) == {1}
    assert all(ResponseCache(store).contains(u.request.key()) for u in units)


def test_an_intent_whose_create_never_started_is_created_at_once_whatever_the_account_holds(
    fake: FakeProviderServer, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """Killed before the create call: the record says no create was started, so there is nothing to look for,
    and another user's open batch with the same count and time neither holds the run back nor is touched."""
    store = LocalStore(tmp_path)
    units = _units(4, samples=1)
    ledger = BatchRecords(redis_client, store, "r1")
    rec = _intent_left_behind(ledger, units, requests=4, create_started=False)
    [slow] = fake.seed_foreign_batches("anthropic", 1, requests=4, created_at=rec.intent_at, delay_s=300)
    _runner(fake, redis_client, store, "anthropic").run(units)
    [after] = ledger.records()
    assert after.state == "collected" and after.batch_id != slow and after.create_at >= rec.intent_at
    stats = fake.batch_stats()
    assert stats.batches_created == 1 and stats.foreign_cancelled == 0 and stats.foreign_results_downloads == 0
    claude = make_batch_provider("p", _settings(fake, "anthropic"))
    assert claude.retrieve(slow).status == "in_progress"
    claude.close()


def _price(settings: ProviderSettings, units: list[UnitSpec]) -> float:
    """What the runner holds for a batch of these units: each request's upper bound at the batch price."""
    return sum(
        estimate_request_cost(settings, u.request, wire_calls(settings, u.request))[2] * settings.batch_price_factor
        for u in units
    )


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_max_cost_usd_counts_batches_one_that_would_pass_the_cap_is_never_created(
    fake: FakeProviderServer, redis_client: redis.Redis, tmp_path: Path, kind: str
) -> None:
    """Issue 34: a batch is priced (its requests' upper bound at the batch price) and held in the run's budget
    before it is created; the batch that would take the run past its cap is not created, the stage stops with
    BudgetExceeded naming it, and what the created batches cost is settled into the run's spend."""
    store = LocalStore(tmp_path)
    units = _units(12)
    settings = _settings(fake, kind, batch_max_requests=6 if kind == "openai" else 12)  # 2 batches of 6 units
    one_batch = _price(settings, units[:6])
    runner = _runner(fake, redis_client, store, kind, batch_max_requests=settings.batch_max_requests)
    runner.max_cost_usd = one_batch * 1.5  # room for the first batch, not for the second
    with pytest.raises(BudgetExceeded, match=r"not created.*max_cost_usd") as stopped:
        runner.run(units)
    assert "resume with a higher --max-cost-usd" in str(stopped.value)
    records = sorted(BatchRecords(redis_client, store, "r1").records(), key=lambda r: r.intent_at)
    assert [r.state for r in records] == ["collected", "failed"], records
    first = [u for u in units if u.request.key() in records[0].keys]
    assert records[0].estimate_usd == pytest.approx(_price(settings, first)) and "max_cost_usd" in records[1].error
    assert fake.batch_stats().batches_created == 1  # the second was never created, so never paid
    budget = Budget(redis_client, "r1", runner.max_cost_usd)
    assert budget.spent_usd() == pytest.approx(records[0].cost_usd) and budget.reserved_usd() == 0
    assert 0 < budget.spent_usd() <= runner.max_cost_usd
    assert live_leases(redis_client) == []  # the refused batch's units are free for whoever may pay for them

    fake.reset()
    nothing = _runner(fake, redis_client, LocalStore(tmp_path / "other"), kind, run_id="r9")
    nothing.max_cost_usd = one_batch / 10  # below any batch: nothing is created at all
    with pytest.raises(BudgetExceeded):
        nothing.run(units)
    assert fake.batch_stats().batches_created == 0


@pytest.mark.parametrize("offset_s", [-600.0, 600.0])
def test_an_open_look_alike_created_outside_the_intents_create_call_never_holds_it_back(
    fake: FakeProviderServer, redis_client: redis.Redis, tmp_path: Path, offset_s: float
) -> None:
    """Issue 34: another user's open Anthropic batch with the intent's request count, created 10 minutes before
    the intent's create call or 10 minutes after it (the old window held such a batch's intent until it ended,
    up to an hour): it cannot be the intent's, by what only the intent knows (when its create call ran), so the
    run creates its own batch at once (after the create grace) and never touches the other one."""
    store = LocalStore(tmp_path)
    units = _units(4, samples=1)
    ledger = BatchRecords(redis_client, store, "r1")
    rec = _intent_left_behind(ledger, units, requests=4)
    [other] = fake.seed_foreign_batches("anthropic", 1, requests=4, created_at=rec.create_at + offset_s, delay_s=3600)
    polls = 0

    def sleep(s: float) -> None:
        nonlocal polls
        polls += 1
        assert polls < 500, "the intent waited for a batch that cannot be its own"
        time.sleep(0.01)

    runner = _runner(fake, redis_client, store, "anthropic")
    runner.sleep = sleep
    runner.run(units)
    [after] = ledger.records()
    assert after.state == "collected" and after.batch_id != other and "checking" not in after.provider_status
    stats = fake.batch_stats()
    assert stats.batches_created == 1 and stats.foreign_cancelled == 0 and stats.foreign_results_downloads == 0
    assert set(billed_parts(stats).values()) == {1}
    claude = make_batch_provider("p", _settings(fake, "anthropic"))
    assert claude.retrieve(other).status == "in_progress"  # still open: never waited for, never cancelled
    claude.close()


def test_an_open_batch_holds_its_leases_for_the_runs_lease_ms_renewed_between_polls(
    fake: FakeProviderServer, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """Issue 30: a batch's request leases last the run's lease_ms (here 1 s), not a fixed 10 minutes; a thread
    renews them every lease_ms / 4, so while the runner waits 2.5 s between polls of a batch that takes 3 s,
    every unit is still the batch's each time it looks (an online worker would wait for the cache), and they are
    released once the batch is collected."""
    fake.configure(batch_delay_s=3.0)
    store = LocalStore(tmp_path)
    units = _units(3, samples=1)
    runner = _runner(fake, redis_client, store, "openai")
    runner.opt = BatchOptions(poll_min_s=2.5, poll_max_s=2.5, lease_ms=1_000)
    owners: list[set[bytes]] = []

    def sleep(s: float) -> None:
        time.sleep(s)
        values = {redis_client.get(request_key("pl", u.request.key())) or b"" for u in units}
        owners.append({v.split(b"|")[0] for v in values})

    runner.sleep = sleep
    runner.run(units)
    [rec] = BatchRecords(redis_client, store, "r1").records()
    assert rec.state == "collected" and fake.batch_stats().batches_created == 1
    owner = batch_owner("r1", rec.batch_key).encode()
    assert owners[0] == {owner}  # 2.5 s after the create, 1 s leases: still the batch's (renewed)
    assert live_leases(redis_client) == []  # released (done markers) once collected


def test_a_look_alike_on_the_account_before_the_create_call_is_ruled_out_by_the_listing(
    fake: FakeProviderServer, redis_client: redis.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 34 item 7: another user's open Anthropic batch with the intent's request count, created 30 s before the
    intent's create call (inside the clock-skew margin of its window, so a candidate by the clocks). The runner
    lists the account right before its create call (``predates``), so that batch is provably not the intent's; the
    driver dies in the create call before it reaches the provider, and the resume creates its batch at once."""
    store = LocalStore(tmp_path)
    units = _units(4, samples=1)
    [other] = fake.seed_foreign_batches("anthropic", 1, requests=4, created_at=time.time() - 30, delay_s=3600)
    runner = _runner(fake, redis_client, store, "anthropic")

    def dying_create(*args: Any, **kwargs: Any) -> Any:
        raise Killed  # killed in the create call, before the request left

    monkeypatch.setattr(runner.clients["p"], "create", dying_create)
    with pytest.raises(Killed):
        runner.run(units)
    ledger = BatchRecords(redis_client, store, "r1")
    [rec] = ledger.records()
    assert rec.state == "intent" and rec.create_at > 0 and rec.predates == [other]
    polls = 0

    def sleep(s: float) -> None:
        nonlocal polls
        polls += 1
        assert polls < 500, "the intent waited for a batch that was on the account before its create call"
        time.sleep(0.01)

    resumed = _runner(fake, redis_client, store, "anthropic")
    resumed.sleep = sleep
    resumed.run(units)
    [after] = ledger.records()
    assert after.state == "collected" and after.batch_id != other and "checking" not in after.provider_status
    stats = fake.batch_stats()
    assert stats.batches_created == 1 and stats.foreign_cancelled == 0 and stats.foreign_results_downloads == 0
    assert set(billed_parts(stats).values()) == {1} and len(billed_parts(stats)) == 4


def test_an_open_look_alike_created_during_the_cut_off_create_call_waits_until_its_user_says_whose_it_is(
    fake: FakeProviderServer, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """Issue 34 item 7, the last case: another user's open Anthropic batch with the intent's request count created
    during the intent's own create call, which was cut off. Anthropic shows count and time only until a batch ends,
    so it cannot be told from the intent's own batch: nothing is created meanwhile (that could pay twice) and the
    record says which batch it checks. ``punchline batches RUN --not-ours ID`` (what only the account's user knows)
    records it foreign; the live runner creates its batch at its next look and never touches the other one."""
    store = LocalStore(tmp_path)
    units = _units(4, samples=1)
    ledger = BatchRecords(redis_client, store, "r1")
    rec = _intent_left_behind(ledger, units, requests=4)
    [other] = fake.seed_foreign_batches("anthropic", 1, requests=4, created_at=rec.create_at + 1, delay_s=3600)
    waited = 0

    def sleep(s: float) -> None:
        nonlocal waited
        stored = ledger.read(rec.batch_key)
        if stored is not None and stored.state == "intent" and other in stored.provider_status:
            waited += 1
            if waited == 3:  # it waits, says so, and creates nothing meanwhile
                assert fake.batch_stats().batches_created == 0
                declare_not_ours(store, "r1", [other])
        assert waited < 500
        time.sleep(0.01)

    runner = _runner(fake, redis_client, store, "anthropic")
    runner.sleep = sleep
    runner.run(units)
    [after] = ledger.records()
    assert waited >= 3 and after.state == "collected" and after.batch_id not in ("", other)
    stats = fake.batch_stats()
    assert stats.batches_created == 1 and stats.foreign_cancelled == 0 and stats.foreign_results_downloads == 0
    with pytest.raises(InputError, match="is run r1's own"):
        declare_not_ours(store, "r1", [after.batch_id])  # the run's own batch is never declared foreign
    claude = make_batch_provider("p", _settings(fake, "anthropic"))
    assert claude.retrieve(other).status == "in_progress"
    claude.close()


def test_a_wait_on_a_look_alike_says_which_how_old_and_how_to_end_it_and_not_ours_is_seen_within_seconds(
    fake: FakeProviderServer, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """Issue 39 item 5: an intent waiting on an open look-alike says so in its record (``status``) and the log (the
    progress line, and ``--no-progress``'s stderr, read it): the batch, its age, the command that releases it. Its
    looks back off (here to 30 s, as a minute-long wait would), but between two looks it reads the store's not-ours
    record every ``not_ours_poll_s``, so ``punchline batches RUN --not-ours ID`` ends the wait within seconds."""
    from punchline.cluster.cli.commands._tables import batch_table, waiting_lines
    from punchline.workers.logs import add_listener, configure_logging, reset_logging

    configure_logging(tmp_path / "log", console=False)  # the listeners see what the run logs
    store = LocalStore(tmp_path / "store")
    units = _units(4, samples=1)
    ledger = BatchRecords(redis_client, store, "r1")
    rec = _intent_left_behind(ledger, units, requests=4)
    [other] = fake.seed_foreign_batches("anthropic", 1, requests=4, created_at=rec.create_at + 1, delay_s=3600)
    release = f"punchline batches r1 --not-ours {other}"
    events: list[dict[str, Any]] = []
    unlisten = add_listener(lambda e: events.append(dict(e)) if str(e.get("event")).startswith("batch_") else None)
    waiting: list[BatchRecord] = []
    declared_at: list[float] = []

    def user() -> None:  # sees the wait in the record, and a second into the runner's 30 s pause says not ours
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            stored = ledger.read(rec.batch_key)
            if stored is not None and stored.look_alikes:
                waiting.append(stored)
                time.sleep(1.0)
                declared_at.append(time.time())
                declare_not_ours(store, "r1", [other])
                return
            time.sleep(0.05)

    def sleep(s: float) -> None:  # real time while it waits; none once its own batch is submitted
        stored = ledger.read(rec.batch_key)
        if stored is None or stored.state == "intent":
            time.sleep(s)

    runner = _runner(fake, redis_client, store, "anthropic")
    runner.opt = BatchOptions(poll_min_s=20.0, poll_max_s=60.0, lease_ms=5_000)
    runner.sleep = sleep
    thread = threading.Thread(target=user)
    thread.start()
    try:
        runner.run(units)
    finally:
        thread.join()
        unlisten()
        reset_logging()
    [after] = ledger.records()
    noticed_s = after.last_create_at - declared_at[0]
    print(f"--not-ours seen and the batch created {noticed_s:.2f} s after it was said")
    assert after.state == "collected" and after.batch_id != other and after.look_alikes == {}
    assert 0 < noticed_s < 5.0  # the pause it was in would have lasted 29 s more
    assert fake.batch_stats().batches_created == 1 and fake.batch_stats().foreign_cancelled == 0
    # the record said which batch, from when, and the command (what `status` and `batches` show)
    [seen] = waiting
    assert list(seen.look_alikes) == [other] and seen.look_alikes[other] == pytest.approx(rec.create_at + 1)
    said, command = waiting_lines([seen])
    assert said.startswith(f"batch {rec.batch_key[:12]} (collect) waits on {other}, an open batch of its 4 requests, ")
    assert command == f"  {release}" and waiting_lines([after]) == []
    console = Console(record=True, width=400)
    console.print(batch_table([seen]))
    assert f"waits on {other} (0m0" in console.export_text()
    # the log: the wait, with its age and the command; then its end, saying why and after how long
    [wait] = [e for e in events if e["event"] == "batch_unresolved"]
    assert wait["batch_id"] == other and wait["release"] == release and 0 <= wait["age_s"] < 60
    [over] = [e for e in events if e["event"] == "batch_wait_over"]
    assert over["declared_not_ours"] == [other] and over["batch_key"] == rec.batch_key
