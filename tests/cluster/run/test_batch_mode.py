"""``mode = "batch"`` end to end: real Redis, real Ray, the driver, the fake provider's batch endpoints.

Batch answers land under the online path's cache keys, so the artifacts are byte-identical whichever mode
paid for them; a driver killed with ``kill -9`` at each point of a batch's life resumes without creating a
batch twice or billing a request twice (the fake provider counts both), also behind 150 other users' batches;
the fake enforces OpenAI's one model per input file, and ``status`` shows what the batch records cost."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

from punchline.cluster.run.driver import run
from punchline.data.stores.local import LocalStore
from punchline.schedulers.batches import read_records
from punchline.workers.fake.server import FakeProviderServer
from tests.cluster.run.executors.test_batches import billed_parts
from tests.cluster.run.test_faults import ROOT, opts, wait_for
from tests.fixtures.engine import driver_argv, engine_config
from tests.fixtures.provider import started_fake


def driver_stuck(tmp_path: Path, run_id: str, stderr_path: Path) -> str:
    """What a driver that did not reach its point in time had said: its stderr and its log's last lines (a test
    that fails on a busy machine says why, instead of only that it waited)."""
    logs = sorted(tmp_path.rglob(f"{run_id}/log.jsonl"))
    tail = logs[0].read_text().splitlines()[-30:] if logs else ["(no log yet)"]
    return stderr_path.read_text()[-3000:] + "\n--- log.jsonl ---\n" + "\n".join(tail)


def wait_for_driver(cond: Any, tmp_path: Path, run_id: str, stderr_path: Path, timeout_s: float = 180) -> None:
    try:
        wait_for(cond, timeout_s=timeout_s)
    except AssertionError as exc:
        raise AssertionError(f"{exc}:\n{driver_stuck(tmp_path, run_id, stderr_path)}") from None


pytestmark = pytest.mark.slow


@pytest.fixture
def fake(shared_puns: Path) -> Iterator[FakeProviderServer]:
    """A fake provider of each test's own (the session's is shared with every file a pytest worker ran before):
    these tests hang batch calls and kill drivers inside them, and count what the fake saw; in a full suite under
    load the shared one was seen to answer no batch create at all (the create timed out, its ``hanging`` stayed 0),
    which a fresh server rules out. Its answer key is the session fake's (the 205 jokes and the sample)."""
    yield from started_fake(shared_puns)


ONLINE: dict[str, Any] = dict(
    jokes=6, models=("3b", "70b"), shard_size=4, classify=True, unseen=True, workers_per_node=1
)


def batch_config(make_config: Any) -> tuple[Path, Path]:
    """The same collect + classify config twice: online (the default) and with both providers in batch mode."""
    online = make_config(**ONLINE)
    text = online.read_text()
    for table in ("[providers.sim]\n", "[providers.claude]\n"):
        text = text.replace(table, f'{table}mode = "batch"\nbatch_max_requests = 16\n')
    batch = online.with_name("batch.toml")
    batch.write_text(text)
    return online, batch


def artifacts(tmp: Path, store: str, run_id: str) -> dict[str, bytes]:
    root = tmp / store / run_id / "artifacts"
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def online_baseline(tmp: Path, cfg: Path, redis_url: str, fake: FakeProviderServer) -> dict[str, bytes]:
    assert run(str(cfg), opts(tmp, redis_url, "online", store="online-store")).state == "finished"
    fake.reset()
    return artifacts(tmp, "online-store", "online")


@pytest.fixture(scope="module")
def expected(
    tmp_path_factory: pytest.TempPathFactory, fake_provider: FakeProviderServer, redis_url: str, ray_local: Any
) -> dict[str, bytes]:
    """The artifacts of :func:`batch_config`'s online config, run once for the module: every batch-mode run of
    the same config must write these bytes."""
    tmp = tmp_path_factory.mktemp("online-baseline")
    fake_provider.restore_defaults()
    fake_provider.reset()
    return online_baseline(tmp, engine_config(tmp, fake_provider, **ONLINE), redis_url, fake_provider)


def assert_billed_once(fake: FakeProviderServer) -> None:
    stats = fake.batch_stats()
    assert stats.billed and set(billed_parts(stats).values()) == {1}, "a request was billed twice"
    assert fake.stats().total_calls == 0, "a batch-mode run called the online endpoint"
    assert stats.failed_validation == 0 and stats.foreign_cancelled == 0


def assert_status_costs_are_the_records(tmp: Path, run_id: str, capsys: Any) -> None:
    """``status``: cost per stage and per model is the sum of the run's batch records (no online calls)."""
    from punchline.cluster.cli.main import main

    records = read_records(LocalStore(tmp / "store"), run_id)
    capsys.readouterr()
    assert main(["status", run_id, "--runs-dir", str(tmp / "runs"), "--json"]) == 0
    view = json.loads(capsys.readouterr().out)
    assert sum(r.cost_usd for r in records) > 0
    for stage in {r.stage for r in records}:
        paid = sum(r.cost_usd for r in records if r.stage == stage)
        assert view["counters"][stage]["cost_usd"] == pytest.approx(paid)
    per_model = {(u["stage"], u["model"]): u["usd"] for u in view["usage"] if u["usd"]}
    expected: dict[tuple[str, str], float] = {}
    for r in records:
        expected[(r.stage, r.model)] = expected.get((r.stage, r.model), 0.0) + r.cost_usd
    seen = [(r.stage, r.model, r.state, r.billed, r.input_tokens, r.cost_usd) for r in records]
    shown = [(b["stage"], b["model"], b["state"], b["billed"], b["cost_usd"]) for b in view["batches"]]
    assert per_model == pytest.approx({k: v for k, v in expected.items() if v}), (
        f"status usage {view['usage']}\nstatus batches {shown}\nrecords {seen}\ncounters {view['counters']}"
    )


def test_batch_mode_gives_the_online_artifacts_at_half_price(
    tmp_path: Path,
    make_config: Any,
    expected: dict[str, bytes],
    fake: FakeProviderServer,
    redis_url: str,
    ray_local: Any,
    capsys: Any,
) -> None:
    _, batch = batch_config(make_config)
    rec = run(str(batch), opts(tmp_path, redis_url, "batched"))
    assert rec.state == "finished"
    assert artifacts(tmp_path, "store", "batched") == expected
    assert_billed_once(fake)
    records = read_records(LocalStore(tmp_path / "store"), "batched")
    assert {r.stage for r in records} == {"collect", "classify"}
    assert all(r.state == "collected" for r in records)
    # one model per batch, as OpenAI requires (the fake enforces it): both collect models paid the batch price
    collect_models = {r.model for r in records if r.stage == "collect"}
    assert len(collect_models) == 2 and all(r.model for r in records)
    assert fake.batch_stats().batches_created == len(records)
    assert sum(r.cost_usd for r in records) == pytest.approx(sum(r.online_cost_usd for r in records) / 2)
    assert sum(r.cost_usd for r in records) > 0
    # `punchline batches RUN_ID` lists them from the store
    from punchline.cluster.cli.main import main

    assert main(["batches", "batched", "--runs-dir", str(tmp_path / "runs"), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert sorted(r["batch_id"] for r in listed) == sorted(r.batch_id for r in records)
    assert main(["batches", "nope", "--runs-dir", str(tmp_path / "runs")]) == 2
    # and `status` shows each batch: state, counts, age
    capsys.readouterr()
    assert main(["status", "batched", "--runs-dir", str(tmp_path / "runs"), "--json"]) == 0
    view = json.loads(capsys.readouterr().out)
    assert sorted(b["batch_id"] for b in view["batches"]) == sorted(r.batch_id for r in records)
    assert all(b["state"] == "collected" and b["succeeded"] == b["requests"] for b in view["batches"])
    assert main(["status", "batched", "--runs-dir", str(tmp_path / "runs")]) == 0
    shown = capsys.readouterr().out
    assert "provider batches" in shown and records[0].batch_key[:12] in shown
    assert_status_costs_are_the_records(tmp_path, "batched", capsys)


def test_a_stage_in_batch_mode_of_its_own_with_split_requests_failing_in_part(
    tmp_path: Path, make_config: Any, fake: FakeProviderServer, redis_url: str, ray_local: Any
) -> None:
    """``[puns.collect] mode = "batch"`` over online providers: only collect goes through batches; its samples
    are split into single calls (``supports_n = false``), some of which fail, and only those are asked again."""
    online = make_config(jokes=6, models=("3b", "70b"), shard_size=4, classify=True, unseen=True, workers_per_node=1)
    online.write_text(online.read_text().replace("[providers.sim]\n", "[providers.sim]\nsupports_n = false\n"))
    batch = online.with_name("stage-batch.toml")
    batch.write_text(online.read_text().replace(" samples = 4 }", ' samples = 4, mode = "batch" }'))
    assert 'mode = "batch"' in batch.read_text()
    expected = online_baseline(tmp_path, online, redis_url, fake)
    fake.configure(batch_error_rate=0.15, batch_expire_rate=0.05)
    assert run(str(batch), opts(tmp_path, redis_url, "staged")).state == "finished"
    assert artifacts(tmp_path, "store", "staged") == expected
    stats = fake.batch_stats()
    assert stats.errored + stats.expired > 0
    assert set(stats.billed.values()) == {1}, "a part was billed twice"
    assert sum(stats.submitted.values()) == len(stats.billed) + stats.errored + stats.expired
    records = read_records(LocalStore(tmp_path / "store"), "staged")
    assert {r.stage for r in records} == {"collect"} and any(r.held_parts for r in records)
    assert fake.stats().total_calls > 0  # classify went online, as its provider says
    assert list((tmp_path / "store" / "staged" / "batches").glob("parts/*")) == []


# crash point -> (fake knobs while the driver runs, what to wait for before kill -9)
CRASHES = {
    "before_create": {"batch_crash_point": "before_create", "hang_s": 120},
    "after_create": {"batch_crash_point": "after_create", "hang_s": 120},
    "polling": {"batch_delay_s": 120},
    "results": {"batch_crash_point": "results", "hang_s": 120},
}


@pytest.mark.parametrize("point", sorted(CRASHES))
def test_kill_9_of_the_driver_at_each_point_of_a_batch_then_resume(
    tmp_path: Path,
    make_config: Any,
    expected: dict[str, bytes],
    fake: FakeProviderServer,
    redis_url: str,
    ray_local: Any,
    point: str,
    capsys: Any,
) -> None:
    _, batch = batch_config(make_config)
    # a run id no other test gives a run on this session's Redis: the ledger's counters and usage are the run's
    run_id = f"killed-batch-{point}"
    fake.configure(**CRASHES[point])
    argv = driver_argv(
        batch, run_id, tmp_path, "--redis-url", redis_url, "--ray-address", ray.get_runtime_context().gcs_address
    )
    store = LocalStore(tmp_path / "store")

    def at_point() -> bool:
        if point == "polling":
            return any(r.batch_id for r in read_records(store, run_id))
        return fake.batch_stats().hanging > 0

    stderr_path = tmp_path / "driver.stderr"  # a file, not a pipe nobody reads while the driver runs
    with open(stderr_path, "wb") as err:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
    wait_for_driver(lambda: at_point() or proc.poll() is not None, tmp_path, run_id, stderr_path)
    assert proc.poll() is None, f"driver ended before the kill: {driver_stuck(tmp_path, run_id, stderr_path)}"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    created_before = fake.batch_stats().batches_created
    if point in ("before_create", "after_create"):  # the first create call hung: nothing after it happened
        assert created_before == (0 if point == "before_create" else 1)
    else:
        assert created_before >= 1
    fake.configure()  # the provider is healthy again
    if point in ("before_create", "after_create"):  # 150 other batches land on the account before the resume
        for api in ("openai", "anthropic"):
            fake.seed_foreign_batches(api, 150, requests=3)

    resumed = subprocess.run(argv, cwd=ROOT, capture_output=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr.decode()[-3000:]
    assert artifacts(tmp_path, "store", run_id) == expected
    assert_billed_once(fake)
    records = read_records(store, run_id)
    # one provider batch per record: the one in flight at the kill was adopted, never created again
    assert fake.batch_stats().batches_created == len(records)
    assert len({r.batch_id for r in records}) == len(records)
    assert_status_costs_are_the_records(tmp_path, run_id, capsys)


def test_batch_and_online_runs_of_one_config_at_once_never_pay_twice(
    tmp_path: Path,
    make_config: Any,
    expected: dict[str, bytes],
    fake: FakeProviderServer,
    redis_url: str,
    ray_local: Any,
) -> None:
    from tests.cluster.run.test_faults import Background

    online, batch = batch_config(make_config)
    fake.configure(latency_ms_min=40, latency_ms_max=80, batch_delay_s=1.0)
    first = Background(lambda: run(str(batch), opts(tmp_path, redis_url, "as-batch")))
    second = Background(lambda: run(str(online), opts(tmp_path, redis_url, "as-online")))
    assert first.join().state == "finished" and second.join().state == "finished"
    assert artifacts(tmp_path, "store", "as-batch") == expected
    assert artifacts(tmp_path, "store", "as-online") == expected
    paid: dict[str, int] = dict(fake.stats().calls)
    for key, n in fake.batch_stats().billed_keys.items():
        paid[key] = paid.get(key, 0) + n
    assert paid and max(paid.values()) == 1, "a request was paid for twice (once online, once in a batch)"
    # which run pays for what depends on which driver's workers come up first (either may lease everything):
    # the guarantee is that together they paid for each request once, which the lines above check


def test_max_cost_usd_counts_batches_and_no_batch_passes_it(
    tmp_path: Path, make_config: Any, fake: FakeProviderServer, redis_url: str, ray_local: Any
) -> None:
    """Issue 34: with a cap below the run's estimate, a batch-mode run creates only batches whose price fits
    what is left of the cap (spent + held), spends no more than the cap, and ends with the run record saying
    `budget`."""
    import msgspec

    from punchline.cluster.config import load_config
    from punchline.cluster.run.planner import plan_run
    from punchline.data.errors import BudgetExceeded

    _, batch = batch_config(make_config)
    estimate = sum(e.mode_cost_usd for e in plan_run(load_config(batch)))
    cap = estimate * 0.75  # two collect batches of about half the estimate each: room for one
    # billed at their bound, so a collected batch frees none of its hold: whenever the second one's intent comes
    # (its units may wait on another holder's lease first), it does not fit
    fake.configure(billing="worst_case")
    capped = msgspec.structs.replace(opts(tmp_path, redis_url, "capped"), max_cost_usd=cap)
    with pytest.raises(BudgetExceeded, match="max_cost_usd"):
        run(str(batch), capped)
    records = read_records(LocalStore(tmp_path / "store"), "capped")
    created = [r for r in records if r.batch_id]
    refused = [r for r in records if not r.batch_id]
    assert created and refused and all("max_cost_usd" in r.error for r in refused)
    assert fake.batch_stats().batches_created == len(created)
    # each batch costs at most its hold; a collected batch's hold becomes what it cost, so a later batch may fit in
    # what that freed: the estimates of the created batches together may pass the cap, what they cost may not
    assert all(r.cost_usd <= r.estimate_usd * (1 + 1e-9) and r.estimate_usd <= cap for r in created)  # (sums' order)
    assert 0 < sum(r.cost_usd for r in created) <= cap
    assert_billed_once(fake)
    state = json.loads((tmp_path / "runs" / "capped" / "run.json").read_text())["state"]
    assert state == "budget"


def test_a_resume_waiting_on_a_look_alike_says_so_without_bars_and_not_ours_releases_it_within_seconds(
    tmp_path: Path, make_config: Any, fake: FakeProviderServer, redis_url: str, ray_local: Any, capsys: Any
) -> None:
    """Issue 39 item 5, as a user meets it: the driver is killed in an Anthropic batch's create call; meanwhile
    another client creates an open batch with the same request count. The resume (``--no-progress``) cannot tell
    it from its own, so it waits, and says on stderr which batch, how old, and the command that ends the wait;
    ``status`` says the same. ``punchline batches RUN --not-ours ID`` ends it within seconds: the run creates its
    own batch and finishes, and the other batch is never touched."""
    import threading
    import time

    from punchline.cluster.cli.main import main

    cfg = make_config(jokes=6, models=("3b",), shard_size=4, classify=True, unseen=True, workers_per_node=1)
    # the create call hangs until the driver is killed: its timeout is long, so a busy machine that polls the fake
    # late still finds it hanging (with 5 s the call timed out first and the driver went on, unkilled)
    text = cfg.read_text().replace("[providers.claude]\n", '[providers.claude]\nmode = "batch"\n')
    head, claude = text.split("[providers.claude]\n", 1)
    cfg.write_text(head + "[providers.claude]\n" + claude.replace("timeout_s = 5\n", "timeout_s = 90\n", 1))
    run_id = "look-alike"
    store = LocalStore(tmp_path / "store")
    argv = driver_argv(
        cfg, run_id, tmp_path, "--redis-url", redis_url, "--ray-address", ray.get_runtime_context().gcs_address
    )
    fake.configure(batch_crash_point="before_create", hang_s=120)  # the create call hangs: the driver dies in it
    stderr_path = tmp_path / "driver.stderr"  # a file, not a pipe nobody reads while the driver runs
    with open(stderr_path, "wb") as err:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
    wait_for_driver(lambda: fake.batch_stats().hanging > 0 or proc.poll() is not None, tmp_path, run_id, stderr_path)
    assert proc.poll() is None, f"driver ended before the kill: {driver_stuck(tmp_path, run_id, stderr_path)}"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    fake.configure()
    [intent] = [r for r in read_records(store, run_id) if r.state == "intent"]
    assert intent.provider == "claude" and intent.create_at > 0
    [other] = fake.seed_foreign_batches(
        "anthropic", 1, requests=intent.requests, created_at=intent.create_at + 1, delay_s=3600
    )
    release = f"punchline batches {run_id} --not-ours {other}"

    resumed = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.extend(resumed.stderr), daemon=True)  # type: ignore[arg-type]
    reader.start()
    wait_for(lambda: any(release in line for line in said) or resumed.poll() is not None, timeout_s=180)
    assert resumed.poll() is None, "".join(said)[-3000:]
    [notice] = [line for line in said if release in line]
    assert notice.startswith(f"punchline: classify: waiting on batch {other} (open, ") and " old)" in notice, notice
    capsys.readouterr()
    assert main(["status", run_id, "--runs-dir", str(tmp_path / "runs")]) == 0
    assert f"  {release}" in capsys.readouterr().out.splitlines()
    time.sleep(3)  # it keeps waiting (and creates nothing) until told
    assert fake.batch_stats().batches_created == 0
    declared_at = time.time()
    assert main(["batches", run_id, "--runs-dir", str(tmp_path / "runs"), "--not-ours", other]) == 0
    assert resumed.wait(timeout=300) == 0, "".join(said)[-3000:]
    reader.join(timeout=10)
    [after] = [r for r in read_records(store, run_id) if r.batch_key == intent.batch_key]
    noticed_s = after.last_create_at - declared_at
    print(f"\n--not-ours seen by the resumed driver {noticed_s:.2f} s after it was said")
    assert after.state == "collected" and after.batch_id != other and 0 < noticed_s < 5.0
    assert any("no longer waits on a look-alike" in line and other in line for line in said), said
    stats = fake.batch_stats()
    assert stats.batches_created == 1 and stats.foreign_cancelled == 0 and stats.foreign_results_downloads == 0
