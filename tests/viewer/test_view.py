"""``punchline view`` over a run in the store's real format: pages, filters, comparison, metrics, and its safety.

The run is written by ``bench/view.py``'s generator (plan pages cut by ``data.units.cut``, shard files as a worker
writes them, run.json); the server is the real one on 127.0.0.1, asked over HTTP.
"""

from __future__ import annotations

import http.client
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
import redis

from bench.view import MODELS, generate
from punchline.cluster.records.metrics import from_ledger, render
from punchline.data.stores import open_store
from punchline.data.stores.local import LocalStore
from punchline.data.units import plan_page_key, shard_key
from punchline.schedulers import keys
from punchline.schedulers.batches import BatchRecord, record_path
from punchline.schedulers.ledger import Ledger
from punchline.viewer.server import ViewServer, ViewSettings
from punchline.workers.calls.call_stats import CallStats

RUN = "bench-view-test"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[ViewServer, Path]]:
    runs = tmp_path / "runs"
    generate(runs, RUN, 600, 20)
    record = runs / RUN / "run.json"
    raw = msgspec.json.decode(record.read_bytes())
    raw["config_toml"] += '\n[providers.other]\nkind = "openai"\napi_key = "sk-proj-abcdefghijklmnopqrstuvwx"\n'
    raw["config_toml"] += 'password = "hunter2-plain"\n'
    record.write_bytes(msgspec.json.encode(raw))
    (runs / RUN / "artifacts").mkdir()
    (runs / RUN / "artifacts" / "table.json").write_text('[{"model": "8b", "em": 0.5}, {"model": "70b", "em": 0.75}]')
    (tmp_path / "outside.txt").write_text("OUTSIDE-SECRET")
    line = '{"event": "provider_error", "level": "warning", "error": "401 for key sk-ant-abcdefghijklmnopqrstuv"}\n'
    (runs / RUN / "log.jsonl").write_text(line * 3)
    os.symlink(tmp_path / "outside.txt", runs / RUN / "artifacts" / "link.txt")
    server = ViewServer(ViewSettings(runs_dir=str(runs))).start()
    try:
        yield server, runs
    finally:
        server.close()


def get(server: ViewServer, path: str, host: str = "127.0.0.1") -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.putrequest("GET", path, skip_host=True)  # the path exactly as given: no client-side normalising
    conn.putheader("Host", f"{host}:{server.port}")
    conn.endheaders()
    resp = conn.getresponse()
    body = resp.read().decode("utf-8", "replace")
    conn.close()
    return resp.status, body


def units_on(page: str) -> list[str]:
    return re.findall(r"data-unit='([^']+)'", page)


def test_runs_run_and_samples_pages(served: tuple[ViewServer, Path]) -> None:
    server, _ = served
    status, page = get(server, "/")
    assert status == 200 and f"/run/{RUN}" in page
    status, page = get(server, f"/run/{RUN}")
    assert status == 200 and "generate" in page and "table.json" in page
    status, page = get(server, f"/run/{RUN}/samples?stage=generate&size=10&page=2")
    assert status == 200 and "21-30 of 600" in page
    assert units_on(page)[0] == "generate/r000000010/m0000"  # units 20..29 in plan order: rows 10..14, both models
    status, page = get(server, f"/run/{RUN}/samples?model={MODELS[1]}&size=10&page=1")
    assert "11-20 of 300" in page
    assert all(u.endswith("/m0001") for u in units_on(page)) and len(units_on(page)) == 10
    status, page = get(server, f"/run/{RUN}/artifact/table.json")
    assert status == 200 and "<td>0.75</td>" in page


def test_compare_failed_and_search(served: tuple[ViewServer, Path]) -> None:
    server, _ = served
    _, page = get(server, f"/run/{RUN}/samples?model={MODELS[0]}&compare={MODELS[1]}&size=5&page=3")
    pairs = re.findall(r"<div class='pair'><div><div class='unit' data-unit='([^']+)'.*?data-unit='([^']+)'", page)
    assert len(pairs) == 5
    for left, right in pairs:  # the same row (the same prompt) asked of the other model
        assert left.endswith("/m0000") and right == left[: -len("m0000")] + "m0001"
    _, page = get(server, f"/run/{RUN}/samples?failed=1&size=50")
    failed = units_on(page)
    assert failed and page.count("400 Bad Request") >= len(failed)
    _, page = get(server, f"/run/{RUN}/samples?q=r000000123&size=50")
    assert units_on(page) == ["generate/r000000123/m0000", "generate/r000000123/m0001"]


def test_metrics_of_a_finished_run(served: tuple[ViewServer, Path]) -> None:
    server, _ = served
    status, text = get(server, f"/run/{RUN}/metrics")
    assert status == 200
    units_done = re.search(rf'punchline_stage_units_done{{run="{RUN}",stage="generate"}} (\d+)', text)
    assert units_done and 550 < int(units_done.group(1)) < 600
    calls = re.findall(rf'punchline_model_calls_total{{run="{RUN}",stage="generate",model="([^"]+)"}} (\d+)', text)
    assert {m for m, _ in calls} == set(MODELS)


@pytest.mark.parametrize(
    "path",
    [
        "/run/../run.json",
        f"/run/{RUN}/../../etc/passwd",
        f"/run/{RUN}/artifact/../run.json",
        f"/run/{RUN}/raw/..%2F..%2F_ledger%2Fpassword",
        f"/run/{RUN}/raw/%2e%2e/run.json",
        "/run/..",
        f"/run/{RUN}/raw/link.txt",  # a link out of the store
        "/etc/passwd",
    ],
)
def test_nothing_outside_the_store(served: tuple[ViewServer, Path], path: str) -> None:
    server, _ = served
    status, body = get(server, path)
    assert status == 404 and "OUTSIDE-SECRET" not in body and "root:" not in body


def test_secrets_are_not_shown_and_hosts_checked(served: tuple[ViewServer, Path]) -> None:
    server, _ = served
    _, page = get(server, f"/run/{RUN}")
    assert "sk-proj-abcdefghijklmnopqrstuvwx" not in page and "hunter2-plain" not in page
    assert "api_key" in page  # the key's name is shown, its value masked
    assert "provider_error" in page and "sk-ant-abcdefghijklmnopqrstuv" not in page  # the log's tail, redacted
    status, _ = get(server, "/", host="evil.example")  # DNS rebinding: another name pointing at 127.0.0.1
    assert status == 403


def test_remote_binding_needs_a_token(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="token"):
        ViewServer(ViewSettings(runs_dir=str(tmp_path), host="0.0.0.0"))
    server = ViewServer(ViewSettings(runs_dir=str(tmp_path), host="0.0.0.0", token="t0ken")).start()
    try:
        assert get(server, "/")[0] == 403
        assert get(server, "/?token=wrong")[0] == 403
        assert get(server, "/?token=t0ken")[0] == 200
        assert "token=t0ken" in server.url
    finally:
        server.close()


def test_a_corrupt_shard_is_named_and_the_server_goes_on(served: tuple[ViewServer, Path]) -> None:
    server, runs = served
    (runs / shard_key(RUN, "generate", 1)).write_bytes(b"\x93not a shard at all")
    status, page = get(server, f"/run/{RUN}/samples?size=10&page=2")  # units 20..29: shard 1
    assert status == 200 and "not a readable shard file" in page and "000001.msgpack" in page
    (runs / RUN / "run.json").write_bytes(b'{"run_id": "trunc')
    status, page = get(server, f"/run/{RUN}")
    assert status in (404, 500) and "run.json" in page
    assert get(server, "/")[0] == 200  # still serving, and the list names the unreadable record


def test_a_run_only_the_s3_store_has(tmp_path: Path, s3_url: str) -> None:
    """``view RUN --store s3://...`` with an empty runs folder: the record, pages and artifacts come from S3."""
    local = tmp_path / "made"
    generate(local, RUN, 120, 10)
    (local / RUN / "artifacts").mkdir()
    (local / RUN / "artifacts" / "rows.jsonl").write_text('{"a": 1}\n{"a": 2}\n')
    store = open_store(s3_url)
    for path in (local / RUN).rglob("*"):
        if path.is_file():
            store.put(path.relative_to(local).as_posix(), path.read_bytes())
    server = ViewServer(ViewSettings(runs_dir=str(tmp_path / "empty"), store=s3_url, run_id=RUN)).start()
    try:
        status, page = get(server, f"/run/{RUN}")
        assert status == 200 and "rows.jsonl" in page
        _, page = get(server, f"/run/{RUN}/samples?size=10&page=11")
        assert "111-120 of 120" in page and units_on(page)[-1] == "generate/r000000059/m0001"
        _, page = get(server, f"/run/{RUN}/artifact/rows.jsonl")
        assert "<td>2</td>" in page
        status, _ = get(server, f"/run/{RUN}/raw/%2e%2e/%2e%2e/x")
        assert status == 404
    finally:
        server.close()


def test_the_stage_index_is_kept_for_the_next_start(served: tuple[ViewServer, Path]) -> None:
    server, runs = served
    _, first = get(server, f"/run/{RUN}/samples?model={MODELS[1]}&size=10&page=3")
    kept = runs / "_view" / RUN / "generate.idx"
    assert kept.is_file()
    again = ViewServer(ViewSettings(runs_dir=str(runs))).start()
    try:
        _, second = get(again, f"/run/{RUN}/samples?model={MODELS[1]}&size=10&page=3")
        assert units_on(second) == units_on(first) and len(units_on(first)) == 10
        kept.write_bytes(b"garbage")  # a kept index that is not one is built again
        third = ViewServer(ViewSettings(runs_dir=str(runs))).start()
        try:
            assert units_on(get(third, f"/run/{RUN}/samples?model={MODELS[1]}&size=10&page=3")[1]) == units_on(first)
        finally:
            third.close()
    finally:
        again.close()
    assert get(server, "/")[1].count(f"/run/{RUN}'") == 1  # the kept indexes are not a run


def test_the_command_prints_its_url_and_refuses_bad_flags(served: tuple[ViewServer, Path], tmp_path: Path) -> None:
    _, runs = served
    cli = [sys.executable, "-m", "punchline.cluster.cli.main"]
    env = {**os.environ, "HOME": str(tmp_path)}
    proc = subprocess.Popen([*cli, "view", RUN, "--runs-dir", str(runs)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(rf"http://127\.0\.0\.1:(\d+)/run/{RUN}", line)
        assert found, line
        conn = http.client.HTTPConnection("127.0.0.1", int(found.group(1)), timeout=60)
        conn.request("GET", f"/run/{RUN}")
        assert conn.getresponse().status == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    for argv in (
        ["view", "--host", "0.0.0.0", "--runs-dir", str(runs)],  # beyond loopback without --allow-remote
        ["view", "--port", "70000"],
        ["view", "../x"],
        ["run", "configs/demo.toml", "--metrics-port", "70000"],
    ):
        done = subprocess.run([*cli, *argv], capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 2 and done.stdout == "", (argv, done.stdout, done.stderr)
        last = done.stderr.strip().splitlines()[-1]  # argparse prints its usage above its one line
        assert last.startswith("punchline") and "error" in last and "Traceback" not in done.stderr


def test_the_runs_pipeline_is_asked_and_one_that_cannot_answer_is_a_line(served: tuple[ViewServer, Path]) -> None:
    """The run's page and an artifact's page ask the pipeline its record names; one not installed here is one line
    on the page, and the artifacts are shown as ever."""
    server, runs = served
    status, page = get(server, f"/run/{RUN}")
    assert status == 200 and "pipeline cannot" not in page and "failed:" not in page  # prompts: no outputs yet
    record = runs / RUN / "run.json"
    raw = msgspec.json.decode(record.read_bytes())
    record.write_bytes(msgspec.json.encode({**raw, "pipeline": "gone-plugin"}))
    status, page = get(server, f"/run/{RUN}")
    assert status == 200 and "the gone-plugin pipeline cannot be loaded here: ConfigError" in page
    assert "table.json" in page
    status, page = get(server, f"/run/{RUN}/artifact/table.json")
    assert status == 200 and "the gone-plugin pipeline cannot be loaded here" in page and "<td>70b</td>" in page


def test_a_corrupt_plan_page_is_named(served: tuple[ViewServer, Path]) -> None:
    server, runs = served
    (runs / plan_page_key(RUN, "generate", 0)).write_bytes(b"\x78garbage")
    status, page = get(server, f"/run/{RUN}/samples?stage=generate")
    assert status == 500 and "not a readable plan page" in page and "000000.msgpack" in page
    assert get(server, f"/run/{RUN}")[0] == 200  # the run's page does not need it


def test_an_artifact_is_served_as_data(served: tuple[ViewServer, Path]) -> None:
    server, runs = served
    (runs / RUN / "artifacts" / "x.svg").write_text("<svg xmlns='http://www.w3.org/2000/svg'><script>1</script></svg>")
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("GET", f"/run/{RUN}/raw/x.svg")
    resp = conn.getresponse()
    assert resp.status == 200 and "sandbox" in (resp.getheader("Content-Security-Policy") or "")


def test_latency_and_retries_per_unit_and_per_model(served: tuple[ViewServer, Path]) -> None:
    """Each unit shows its latency and retries; the models page shows each model's latency distribution from the
    shard files (the larger model of the generated run is the slower one) and /metrics exports it as a histogram."""
    server, _ = served
    _, page = get(server, f"/run/{RUN}/samples?model={MODELS[1]}&size=5")
    assert len(re.findall(r"<span class='latency'>(\d+\.\d\d) s</span>", page)) == 5
    assert re.search(r"retries [01]</span>", page)
    status, page = get(server, f"/run/{RUN}/models")
    assert status == 200
    p50 = dict(re.findall(r"data-model='([^']+)' data-stage='generate'>.*?<td class='p50'>≤ ([\d.]+) s</td>", page))
    assert float(p50[MODELS[0]]) < float(p50[MODELS[1]]), p50
    _, text = get(server, f"/run/{RUN}/metrics")
    for model in MODELS:
        labels = f'run="{RUN}",stage="generate",model="{model}"'
        count = re.search(rf"punchline_model_unit_latency_seconds_count{{{labels}}} (\d+)", text)
        inf = re.search(rf'punchline_model_unit_latency_seconds_bucket{{{labels},le="\+Inf"}} (\d+)', text)
        assert count and inf and count.group(1) == inf.group(1) and 250 < int(count.group(1)) <= 300
        assert re.search(rf"punchline_model_retries_total{{{labels}}} [1-9]", text)
    assert "punchline_stage_units_planned{" in text and "punchline_stage_units_total" not in text
    for line in text.splitlines():  # counters and only counters end in _total
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            assert name.endswith("_total") == (kind == "counter"), line


def test_the_drivers_metrics_carry_the_workers_figures(redis_client: redis.Redis) -> None:
    """What the workers publish (calls in flight, 429s, latency) is in the driver's /metrics text, per provider and
    model, as a gauge, counters and a histogram."""
    stats = CallStats()
    scope = ("generate", "together", "m-8b")
    with stats.calling(scope):
        stats.throttled(scope)
        stats.retried(scope)
        w1 = keys.worker_calls("pl", "r-live", "w1")
        redis_client.set(w1, stats.blob())  # published mid-call: one in flight
        redis_client.zadd(keys.calls("pl", "r-live"), {w1: 1.0})
    stats.answered(scope, 0.3)
    w2 = keys.worker_calls("pl", "r-live", "w2")
    redis_client.set(w2, stats.blob())  # a second worker, done
    redis_client.zadd(keys.calls("pl", "r-live"), {w2: 1.0})
    text = render([from_ledger("r-live", "prompts", ["generate"], Ledger(redis_client), None)])
    labels = 'run="r-live",stage="generate",provider="together",model="m-8b"'
    assert f"punchline_provider_calls_in_flight{{{labels}}} 1" in text
    assert f"punchline_provider_rate_limited_total{{{labels}}} 2" in text
    assert f"punchline_provider_retries_total{{{labels}}} 2" in text
    assert f'punchline_provider_call_latency_seconds_bucket{{{labels},le="0.5"}} 1' in text
    assert f"punchline_provider_call_latency_seconds_count{{{labels}}} 1" in text


def test_a_runs_batches_show_their_provider_status(served: tuple[ViewServer, Path]) -> None:
    """A provider batch's record in the store is on the run's page with its state and what its last poll saw."""
    _, runs = served
    record = BatchRecord(
        batch_key="bk1", run_id=RUN, stage="generate", provider="together", model=MODELS[0], keys=["k1"], requests=1,
        state="submitted", batch_id="batch_abc", provider_status="validating",
    )  # fmt: skip
    LocalStore(runs).put(record_path(RUN, "bk1"), msgspec.json.encode(record))
    _, page = get(served[0], f"/run/{RUN}")
    assert re.search(r"<td>submitted</td><td class='provider-status'>validating</td><td>1</td>", page), page[-3000:]
