"""The batch runner against real Redis, a real store and the fake provider's batch endpoints (no Ray):
answers land under the online path's cache keys, failed requests (and failed parts of a request split into
single calls) are resubmitted alone, and an intent whose create outcome is unknown is reconciled with the
provider before anything is paid again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis

from punchline.data.provider_settings import ModelSettings, ProviderSettings
from punchline.data.puns.completions import sample_request
from punchline.data.requests import ProviderResponse
from punchline.data.response_cache import ResponseCache
from punchline.data.stores.local import LocalStore
from punchline.data.units import UnitSpec
from punchline.schedulers.batches import BatchLedger, BatchRecord, batch_key, batch_owner, parts_prefix
from punchline.schedulers.ledger import request_key
from punchline.workers.batch_runner import AmbiguousBatch, BatchOptions, BatchRunner
from punchline.workers.fake import FakeProviderServer
from punchline.workers.providers import make_batch_provider

MODEL = "meta-llama/Meta-Llama-3.1-8B-Instruct-Turbo"
FAST = BatchOptions(poll_min_s=0.01, poll_max_s=0.05, lease_ms=5_000)


def _settings(fake: FakeProviderServer, kind: str, **kw: object) -> ProviderSettings:
    base = fake.provider_settings(kind, timeout_s=1.0)
    model = ModelSettings(id=MODEL, input_usd_per_mtok=1.0, output_usd_per_mtok=2.0)
    return ProviderSettings(kind=kind, base_url=base.base_url, mode="batch", models={"8b": model}, **kw)  # type: ignore[arg-type]


def _units(n: int, provider: str = "p", samples: int = 2) -> list[UnitSpec]:
    return [
        UnitSpec(unit_id=f"u{i:04d}", request=sample_request(provider, MODEL, f"Joke {i} ends with a", n=samples))
        for i in range(n)
    ]


def _runner(
    fake: FakeProviderServer, redis_client: redis.Redis, store: LocalStore, kind: str, run_id: str = "r1", **kw: object
) -> BatchRunner:
    settings = {"p": _settings(fake, kind, **kw)}
    return BatchRunner(
        ledger=BatchLedger(redis_client, store, run_id),
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
    records = BatchLedger(redis_client, store, "r1").records()
    assert all(r.state == "collected" and r.batch_id for r in records)
    per_request = 2 if kind == "anthropic" else 1  # anthropic has no n: two single calls per request
    assert sum(r.requests for r in records) == 10 * per_request
    assert all(r.requests <= 8 for r in records)
    assert totals.batches == len(records) == fake.batch_stats().batches_created
    assert totals.cost_usd == pytest.approx(sum(r.online_cost_usd for r in records) / 2)
    assert set(fake.batch_stats().billed.values()) == {1}
    assert redis_client.keys("pl:req:*") == []  # the batches' leases are gone
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
    assert set(stats.billed.values()) == {1}
    parts_total = 60 * samples
    assert len(stats.billed) == parts_total
    records = BatchLedger(redis_client, store, "r1").records()
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
    assert redis_client.keys("pl:req:*") == []
    assert sum(r.cost_usd for r in records) == pytest.approx(sum(r.online_cost_usd for r in records) / 2)


class Killed(BaseException):
    """What kill -9 does to the runner: nothing after this point happens."""


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
    write = runner.ledger.write

    def killing_write(rec: BatchRecord) -> None:
        if rec.state == "collected":  # the part files are written; the record never says collected
            raise Killed
        write(rec)

    monkeypatch.setattr(runner.ledger, "write", killing_write)
    with pytest.raises(Killed):
        runner.run(units)
    [rec] = BatchLedger(redis_client, store, "r1").records()
    assert rec.state == "submitted"
    held = BatchLedger(redis_client, store, "r1").held_parts()
    assert held, "no request was partly answered: pick another seed"
    billed_before = dict(fake.batch_stats().billed)
    assert all(cid in billed_before for h in held.values() for cid in h.parts)

    _runner(fake, redis_client, store, kind, **kw).run(units)  # the resumed driver (same run, same store)
    assert _answers(store, units) == expected
    stats = fake.batch_stats()
    assert set(stats.billed.values()) == {1} and len(stats.billed) == 36
    records = BatchLedger(redis_client, store, "r1").records()
    assert records[0].batch_id == rec.batch_id and records[0].state == "collected"
    assert stats.batches_created == len(records)
    assert any(r.held_parts for r in records[1:])
    # nothing that succeeded was asked for again: each failure is submitted once more, and that is all
    assert sum(stats.submitted.values()) == 36 + stats.errored + stats.expired
    assert list(store.list(parts_prefix("r1"))) == []
    assert redis_client.keys("pl:req:*") == []


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

    def dying_create(key: str, requests: list[Any], skip: Any = ()) -> Any:
        info = create(key, requests, skip)
        if skip:  # a batch that leaves held parts out was created; the driver dies before recording it
            raise Killed
        return info

    monkeypatch.setattr(client, "create", dying_create)
    with pytest.raises(Killed):
        runner.run(units)
    intent = [r for r in BatchLedger(redis_client, store, "r1").records() if r.state == "intent"]
    assert len(intent) == 1 and intent[0].held_parts
    fake.configure()
    _runner(fake, redis_client, store, "anthropic").run(units)
    records = BatchLedger(redis_client, store, "r1").records()
    assert fake.batch_stats().batches_created == len(records)  # adopted, never created again
    assert all(r.state == "collected" and r.batch_id for r in records)
    assert set(fake.batch_stats().billed.values()) == {1} and len(fake.batch_stats().billed) == 36
    assert all(ResponseCache(store).contains(u.request.key()) for u in units)


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_an_intent_whose_batch_was_created_is_adopted_not_submitted_again(
    fake: FakeProviderServer, redis_client: redis.Redis, tmp_path: Path, kind: str
) -> None:
    store = LocalStore(tmp_path)
    units = _units(6)
    fake.configure(batch_crash_point="after_create", hang_s=3)
    runner = _runner(fake, redis_client, store, kind)
    runner.opt = BatchOptions(poll_min_s=0.01, poll_max_s=0.05, lease_ms=5_000, max_rounds=1)
    # the create call times out after the batch was made: the runner asks the listing and finds it
    runner.run(units)
    assert fake.batch_stats().batches_created == 1
    [rec] = BatchLedger(redis_client, store, "r1").records()
    assert rec.state == "collected" and rec.batch_id
    assert set(fake.batch_stats().billed.values()) == {1}


def test_an_intent_left_by_a_dead_driver_is_reconciled_on_resume(
    fake: FakeProviderServer, redis_client: redis.Redis, tmp_path: Path
) -> None:
    store = LocalStore(tmp_path)
    units = _units(5)
    keys = sorted(u.request.key() for u in units)
    settings = _settings(fake, "anthropic")
    client = make_batch_provider("p", settings)
    ledger = BatchLedger(redis_client, store, "r1")
    key = batch_key(keys)
    # what a driver killed right after the create call returned leaves behind
    import time

    ledger.write(
        BatchRecord(
            batch_key=key, run_id="r1", stage="collect", provider="p", keys=keys, requests=10, intent_at=time.time()
        )
    )
    created = client.create(key, [u.request for u in units])
    _runner(fake, redis_client, store, "anthropic").run(units)
    [rec] = ledger.records()
    assert rec.batch_id == created.batch_id and rec.state == "collected"
    assert fake.batch_stats().batches_created == 1


def test_two_candidate_batches_stop_the_run_naming_them(
    fake: FakeProviderServer, redis_client: redis.Redis, tmp_path: Path
) -> None:
    import time

    store = LocalStore(tmp_path)
    units = _units(5)
    keys = sorted(u.request.key() for u in units)
    client = make_batch_provider("p", _settings(fake, "anthropic"))
    ledger = BatchLedger(redis_client, store, "r1")
    ledger.write(
        BatchRecord(
            batch_key=batch_key(keys),
            run_id="r1",
            stage="collect",
            provider="p",
            keys=keys,
            requests=10,
            intent_at=time.time(),
        )
    )
    a = client.create("x", [u.request for u in units]).batch_id
    b = client.create("y", [u.request for u in units]).batch_id
    with pytest.raises(AmbiguousBatch) as err:
        _runner(fake, redis_client, store, "anthropic").run(units)
    assert a in str(err.value) and b in str(err.value) and "\n" not in str(err.value)
    assert fake.batch_stats().batches_created == 2  # nothing more was paid for


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
