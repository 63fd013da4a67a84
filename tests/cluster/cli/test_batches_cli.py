"""``punchline batches RUN_ID [--cancel]``: the cancel is recorded in the store and touches only the run's own
batches; a store that lost the run is one line; ``status`` costs are the sum of the batch records."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from punchline.cluster.cli.main import main
from punchline.cluster.run.driver import RunRecord, Services
from punchline.data.stores.local import LocalStore
from punchline.pipelines.puns.data.completions import sample_request
from punchline.schedulers.batches import BatchRecord, cancel_requested, declared_foreign, record_path
from punchline.schedulers.budget import UsageRow
from punchline.schedulers.ledger import StageCounters
from punchline.workers.fake.server import FakeProviderServer
from punchline.workers.providers import make_batch_provider

MODEL = "meta-llama/Meta-Llama-3.1-8B-Instruct-Turbo"


def test_cancel_asks_the_provider_and_lists_the_result(tmp_path: Path, fake: FakeProviderServer, capsys: Any) -> None:
    fake.configure(batch_delay_s=300)  # still processing when we cancel
    settings = fake.provider_settings("openai")
    client = make_batch_provider("fake", settings)
    request = sample_request("fake", MODEL, "The baker was happy because he kneaded the", n=2)
    info = client.create("k1", [request])
    store = LocalStore(tmp_path / "store")
    record = BatchRecord(
        batch_key="k1",
        run_id="r1",
        stage="collect",
        provider="fake",
        keys=[request.key()],
        requests=1,
        state="submitted",
        batch_id=info.batch_id,
    )
    store.put(record_path("r1", "k1"), msgspec.json.encode(record))
    run = _run(store, settings.base_url or "", kind="openai")
    _write_run(tmp_path, store, run)

    assert main(["batches", "r1", "--runs-dir", str(tmp_path / "runs"), "--cancel", "--json"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"cancelled {info.batch_id} (fake): ")
    listed = json.loads(out[-1])
    assert [b["batch_id"] for b in listed] == [info.batch_id]
    # the store says so at once (not "in progress" until someone polls): a live driver reads it too
    assert "cancel" in listed[0]["provider_status"] and listed[0]["cancelled_at"] > 0
    assert cancel_requested(store, "r1") > 0
    after = client.retrieve(info.batch_id)
    assert "cancel" in after.provider_status and after.succeeded == 0
    client.close()


def _write_run(tmp_path: Path, store: LocalStore, run: RunRecord) -> None:
    """The run's record where the driver puts it: the runs folder and the store."""
    (tmp_path / "runs" / run.run_id).mkdir(parents=True)
    (tmp_path / "runs" / run.run_id / "run.json").write_bytes(msgspec.json.encode(run))
    store.put(f"{run.run_id}/run.json", msgspec.json.encode(run))


def _run(store: LocalStore, base_url: str, kind: str = "anthropic", **kw: Any) -> RunRecord:
    """A run record whose one provider, ``fake``, is at ``base_url``."""
    return RunRecord(
        run_id="r1",
        pipeline="puns",
        config_path="run.toml",
        config_toml=f'[providers.fake]\nkind = "{kind}"\nbase_url = "{base_url}"\n',
        created_at=0.0,
        services=Services(redis_url="redis://127.0.0.1:1/0", store_url=store.url),
        stages=["collect"],
        **kw,
    )


def test_cancel_never_touches_a_batch_the_run_did_not_record(
    tmp_path: Path, fake: FakeProviderServer, capsys: Any
) -> None:
    """An intent without a batch id (its driver died around the create call) and another user's open batch
    with the same count on the account: the cancel marks the intent, and leaves the other batch alone."""
    store = LocalStore(tmp_path / "store")
    [foreign] = fake.seed_foreign_batches("anthropic", 1, requests=1, delay_s=300)
    request = sample_request("fake", MODEL, "The baker was happy because he kneaded the", n=1)
    record = BatchRecord(
        batch_key="k2", run_id="r1", stage="collect", provider="fake", keys=[request.key()], requests=1, tag="ab" * 6
    )
    store.put(record_path("r1", "k2"), msgspec.json.encode(record))
    _write_run(tmp_path, store, _run(store, fake.provider_settings("anthropic").base_url or ""))
    assert main(["batches", "r1", "--runs-dir", str(tmp_path / "runs"), "--cancel", "--json"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "cancelled intent k2 (fake): not created"
    [listed] = json.loads(out[-1])
    assert listed["cancelled_at"] > 0 and listed["batch_id"] == ""
    stats = fake.batch_stats()
    assert stats.foreign_cancelled == 0
    claude = make_batch_provider("fake", fake.provider_settings("anthropic"))
    assert claude.retrieve(foreign).status == "in_progress"
    claude.close()


def test_batches_on_a_store_that_lost_the_run_is_one_line(
    tmp_path: Path, fake: FakeProviderServer, capsys: Any
) -> None:
    store = LocalStore(tmp_path / "store")
    _write_run(tmp_path, store, _run(store, "http://127.0.0.1:1"))
    (tmp_path / "store" / "r1" / "run.json").unlink()  # moved, deleted, or not mounted here
    assert main(["batches", "r1", "--runs-dir", str(tmp_path / "runs")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1
    assert "does not hold run r1" in captured.err and "Traceback" not in captured.err


def test_status_costs_are_the_online_costs_plus_every_batch_record(
    tmp_path: Path, fake: FakeProviderServer, capsys: Any
) -> None:
    """Batches created and collected by three drivers (records in the store) and what the workers paid online
    (the run's counters and rows): status shows per stage and per model the sum of both."""
    store = LocalStore(tmp_path / "store")
    other = "claude-3-5-haiku"
    for i, (stage, model, cost) in enumerate(
        [("collect", MODEL, 0.01), ("collect", MODEL, 0.02), ("collect", other, 0.04), ("classify", other, 0.08)]
    ):
        rec = BatchRecord(
            batch_key=f"k{i}",
            run_id="r1",
            stage=stage,
            provider="fake",
            model=model,
            keys=[f"key{i}"],
            requests=3,
            state="collected",
            billed=3,
            input_tokens=100,
            output_tokens=10 * (i + 1),
            cost_usd=cost,
        )
        store.put(record_path("r1", rec.batch_key), msgspec.json.encode(rec))
    online = StageCounters(units_total=9, units_done=9, provider_requests=2, input_tokens=5, cost_usd=0.5)
    rows = [UsageRow(stage="collect", model=MODEL, input_tokens=5, usd=0.5)]
    run = _run(store, "http://127.0.0.1:1", state="finished", counters={"collect": online}, usage=rows)
    run.stages = ["collect", "classify"]
    _write_run(tmp_path, store, run)
    assert main(["status", "r1", "--runs-dir", str(tmp_path / "runs"), "--json"]) == 0
    view = json.loads(capsys.readouterr().out)
    collect, classify = view["counters"]["collect"], view["counters"]["classify"]
    assert collect["cost_usd"] == pytest.approx(0.5 + 0.01 + 0.02 + 0.04)
    assert collect["provider_requests"] == 2 + 9 and collect["output_tokens"] == 10 + 20 + 30
    assert classify["cost_usd"] == pytest.approx(0.08) and classify["input_tokens"] == 100
    per_model = {(r["stage"], r["model"]): r["usd"] for r in view["usage"]}
    assert per_model == pytest.approx(
        {("collect", MODEL): 0.5 + 0.03, ("collect", other): 0.04, ("classify", other): 0.08}
    )
    assert main(["status", "r1", "--runs-dir", str(tmp_path / "runs")]) == 0
    shown = capsys.readouterr().out
    assert "claude-3-5-haiku" in shown and "0.5700" in shown


def test_not_ours_records_a_look_alike_as_foreign_and_refuses_the_runs_own_batch(
    tmp_path: Path, fake: FakeProviderServer, capsys: Any
) -> None:
    """Issue 34 item 7: ``--not-ours ID`` is how the account's user ends a wait on an open look-alike (the store
    says so at once, so a live runner reads it); a batch the run's records name as its own is refused in one line."""
    store = LocalStore(tmp_path / "store")
    record = BatchRecord(
        batch_key="k3", run_id="r1", stage="collect", provider="fake", keys=["a"], requests=1, batch_id="msgbatch_own"
    )
    store.put(record_path("r1", "k3"), msgspec.json.encode(record))
    _write_run(tmp_path, store, _run(store, fake.provider_settings("anthropic").base_url or ""))
    runs = str(tmp_path / "runs")
    assert main(["batches", "r1", "--runs-dir", runs, "--not-ours", "msgbatch_other", "--json"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "msgbatch_other: not run r1's (a waiting intent no longer waits on it)"
    assert declared_foreign(store, "r1") == {"msgbatch_other"}
    assert main(["batches", "r1", "--runs-dir", runs, "--not-ours", "msgbatch_own"]) == 2
    captured = capsys.readouterr()
    assert "is run r1's own" in captured.err and len(captured.err.strip().splitlines()) == 1
    assert declared_foreign(store, "r1") == {"msgbatch_other"}  # nothing recorded


def test_status_and_batches_name_the_look_alike_an_intent_waits_on_its_age_and_the_command_that_ends_it(
    tmp_path: Path, capsys: Any
) -> None:
    """Issue 39 item 5: an intent waiting on an open look-alike (its record's ``look_alikes``, what the runner
    writes) is shown by ``status`` and ``batches`` with the batch, its age and the command that releases it."""
    store = LocalStore(tmp_path / "store")
    created = time.time() - 152
    record = BatchRecord(
        batch_key="k4" * 16,
        run_id="r1",
        stage="classify",
        provider="fake",
        keys=["a"],
        requests=4,
        intent_at=created - 5,
        create_at=created - 1,
        provider_status="checking msgbatch_other",
        look_alikes={"msgbatch_other": created},
    )
    store.put(record_path("r1", record.batch_key), msgspec.json.encode(record))
    _write_run(tmp_path, store, _run(store, "http://127.0.0.1:1", state="interrupted"))
    release = "punchline batches r1 --not-ours msgbatch_other"
    for command in (["status", "r1"], ["batches", "r1"]):
        assert main([*command, "--runs-dir", str(tmp_path / "runs")]) == 0
        lines = capsys.readouterr().out.splitlines()
        said = " ".join(" ".join(lines).split())  # the line naming it may wrap at the terminal's width
        assert "batch k4k4k4k4k4k4 (classify) waits on msgbatch_other, an open batch of its 4 requests, 2m3" in said
        assert f"  {release}" in lines, lines  # the command on a line of its own, whole
    assert main(["batches", "r1", "--runs-dir", str(tmp_path / "runs"), "--not-ours", "msgbatch_other"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "waited on msgbatch_other, declared not this run's" in said and release not in said
    assert main(["status", "r1", "--runs-dir", str(tmp_path / "runs"), "--json"]) == 0
    [batch] = json.loads(capsys.readouterr().out)["batches"]
    assert batch["look_alikes"] == {"msgbatch_other": pytest.approx(created)}
