"""A user's own pipeline outside the package: ``examples/sentiment_pipeline`` copied to a temp folder.

Run through the CLI with the simulated provider (the package found beside the config), named by its
entry point once pip-installed, refused with one line when it or its input is broken, and killed with
``kill -9`` mid-run on a two-node ``ray start`` cluster then resumed against the fake provider: the calls
in flight at the kill are finished and committed by the draining workers, none is paid twice.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from punchline.cluster.cli.main import main
from punchline.cluster.config import load_config
from punchline.cluster.ray_cluster.ray_jobs import stage, user_code
from punchline.workers.fake.server import FakeProviderServer
from tests.fixtures.ray_start import RayStartCluster

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "sentiment_pipeline"
REF = "sentiment_pipeline.pipeline:Sentiment"


@pytest.fixture(autouse=True)
def _own_imports(monkeypatch: pytest.MonkeyPatch) -> Any:
    """An in-process run finds the package beside its config by appending to ``sys.path``: undo it,
    and forget the package, so each test (and the rest of the session) starts without it."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    for name in [m for m in sys.modules if m.partition(".")[0] in ("sentiment_pipeline", "sentiment_pipline")]:
        del sys.modules[name]


def project(tmp: Path, name: str = "sentiment") -> Path:
    """The example as a user keeps it: its own folder, outside the repository."""
    dest = tmp / name
    shutil.copytree(EXAMPLE, dest, ignore=shutil.ignore_patterns("__pycache__", "runs", "*.egg-info", "build"))
    return dest


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PUNCHLINE_", "PYTHONPATH"))}
    env.update(extra)
    return env


def punchline(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "punchline", *args],
        cwd=cwd,
        env=env or clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow  # a whole run through the CLI from another folder: the full suite, not `make test-fast`
def test_the_example_runs_through_the_cli_from_outside_the_repository(tmp_path: Path) -> None:
    proj = project(tmp_path)
    elsewhere = tmp_path / "cwd"  # neither the repository nor the project: the package is found beside the config
    elsewhere.mkdir()
    config = str(proj / "sentiment.toml")
    runs = str(tmp_path / "runs")
    done = punchline("run", config, "--run-id", "s1", "--runs-dir", runs, "--no-progress", cwd=elsewhere)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "run s1: finished" in done.stdout
    assert "sentiment of 12 reviews" in done.stdout  # the pipeline's own headline
    artifacts = tmp_path / "runs" / "s1" / "artifacts"
    reviews = rows(proj / "data" / "reviews.jsonl")
    labels, judged = rows(artifacts / "labels.jsonl"), rows(artifacts / "judged.jsonl")
    assert [r["id"] for r in labels] == [r["id"] for r in judged] == [r["id"] for r in reviews]
    assert all(r["answer"] for r in labels) and all(r["judge_answer"] for r in judged)
    summary = json.loads((artifacts / "summary.json").read_text())
    assert summary["reviews"] == 12 and sum(summary["verdicts"].values()) == 12
    record = json.loads((tmp_path / "runs" / "s1" / "run.json").read_text())
    assert record["stages"] == ["label", "judge"]
    assert record["counters"]["label"]["units_done"] == record["counters"]["judge"]["units_done"] == 12

    again = punchline("run", config, "--run-id", "s2", "--runs-dir", runs, "--no-progress", cwd=elsewhere)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (tmp_path / "runs" / "s2" / "artifacts" / "judged.jsonl").read_bytes() == (
        artifacts / "judged.jsonl"
    ).read_bytes()
    second = json.loads((tmp_path / "runs" / "s2" / "run.json").read_text())
    assert second["counters"]["label"]["cache_hits"] == 12  # a second run pays for nothing


def test_pip_installed_the_entry_point_names_it(tmp_path: Path) -> None:
    proj = project(tmp_path)
    site = tmp_path / "site"
    install = ["install", "--quiet", "--no-deps", "--no-build-isolation", "--target", str(site), str(proj)]
    pip = subprocess.run(
        [sys.executable, "-m", "pip", *install],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert pip.returncode == 0, pip.stderr[-3000:]
    assert (site / "sentiment_pipeline" / "pipeline.py").is_file()
    config = tmp_path / "named.toml"  # elsewhere: only the installed package can provide the pipeline
    config.write_text((proj / "sentiment.toml").read_text().replace(f'"{REF}"', '"sentiment"'))
    shutil.copytree(proj / "data", tmp_path / "data")
    shutil.rmtree(proj)
    planned = punchline("plan", str(config), cwd=tmp_path, env=clean_env(PYTHONPATH=str(site)))
    assert planned.returncode == 0, planned.stderr[-3000:]
    assert "label" in planned.stdout and "judge" in planned.stdout
    missing = punchline("plan", str(config), cwd=tmp_path)  # not installed: one line naming it
    assert missing.returncode == 2 and "unknown pipeline 'sentiment'" in missing.stderr
    assert missing.stderr.count("\n") == 1


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        ((f'"{REF}"', '"sentiment_pipeline.pipeline:Nope"'), ["has no 'Nope'", "run.pipeline"]),
        ((f'"{REF}"', '"sentiment_pipeline.pipeline:LabelStage"'), ["is not a Pipeline"]),
        ((f'"{REF}"', '"sentiment_pipline.pipeline:Sentiment"'), ["cannot be imported", "sentiment_pipline"]),
        (('model = "small"', 'model = "small"\nmax_tokens = 0'), ["sentiment.label.max_tokens"]),
    ],
)
def test_a_broken_plugin_or_setting_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: tuple[str, str], words: list[str]
) -> None:
    proj = project(tmp_path, name=f"p{abs(hash(edit)) % 10_000}")
    config = proj / "sentiment.toml"
    config.write_text(config.read_text().replace(*edit, 1))
    assert main(["run", str(config), "--runs-dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and str(config) in err
    for w in words:
        assert w in err
    assert not (tmp_path / "runs").exists()  # nothing started


def test_a_bad_review_line_names_file_record_and_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proj = project(tmp_path, name="badrows")
    reviews = proj / "data" / "reviews.jsonl"
    lines = reviews.read_text().splitlines()
    lines[4] = '{"id": "r05", "text": 5}'
    reviews.write_text("\n".join(lines) + "\n")
    assert main(["run", str(proj / "sentiment.toml"), "--runs-dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and str(reviews) in err and "record 5" in err and "field 'text'" in err


def wait_for(cond: Callable[[], bool], what: str, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"{what}: not reached in time"
        time.sleep(0.05)


def fault_project(tmp: Path, fake: FakeProviderServer, name: str, reviews: int = 40) -> Path:
    """The example pointed at the test's fake provider, with more reviews and small shards."""
    proj = project(tmp, name)
    config = proj / "sentiment.toml"
    text = config.read_text().replace('base_url = "simulated"', f'base_url = "{fake.openai_base_url}"')
    text = text.replace('api_key_env = "OPENAI_API_KEY"\n', "timeout_s = 900\n").replace(
        "shard_size = 4", "shard_size = 2"
    )
    config.write_text(text)
    lines = [
        json.dumps({"id": f"t{i:03d}", "text": f"Review number {i}: it arrived on day {i % 7 + 1}."})
        for i in range(reviews)
    ]
    (proj / "data" / "reviews.jsonl").write_text("\n".join(lines) + "\n")
    return proj


def alive_workers(cluster: RayStartCluster) -> list[str]:
    """The names of the punchline worker actors alive on the cluster (Ray's state API, via its dashboard)."""
    from ray.util.state import list_actors

    alive = list_actors(address=cluster.dashboard_url, filters=[("state", "=", "ALIVE")], limit=1000)
    return [a.name for a in alive if (a.name or "").startswith("punchline:")]


@pytest.mark.slow
def test_kill_9_mid_run_on_a_two_node_cluster_then_resume_pays_nothing_twice(
    tmp_path: Path, fake: FakeProviderServer, redis_url: str
) -> None:
    """The driver is killed while judge calls are in flight on both nodes of a `ray start` cluster: its
    detached workers finish those calls, commit them and end themselves (no punchline actor is left), and
    the resumed run asks the provider for nothing it was asked before: every request exactly once."""
    n = 40
    env = clean_env()
    env = {k: v for k, v in env.items() if not k.startswith(("AWS_", "RAY_"))}
    cluster = RayStartCluster(env, logs=tmp_path / "ray-logs")
    try:
        cluster.start_head(dashboard=True)
        cluster.add_worker()
        cluster.wait_for_nodes(2)

        def argv(proj: Path, run_id: str, runs: str, *extra: str) -> list[str]:
            cmd = [sys.executable, "-m", "punchline", "run", str(proj / "sentiment.toml"), "--run-id", run_id]
            return [*cmd, "--runs-dir", str(tmp_path / runs), "--ray-address", cluster.address, "--no-progress", *extra]

        base = fault_project(tmp_path, fake, "baseline", n)  # the runs folder's own ledger: apart from the next run
        done = subprocess.run(
            argv(base, "base", "base-runs"), cwd=tmp_path, env=cluster.env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr[-3000:]
        expected = (tmp_path / "base-runs" / "base" / "artifacts" / "judged.jsonl").read_bytes()
        assert alive_workers(cluster) == []  # a run that ends stops its workers
        fake.reset()

        proj = fault_project(tmp_path, fake, "killed-example", n)
        # the judge's calls take seconds: the kill lands while several are in flight; every label was
        # answered and committed before it
        fake.configure(latency_ms_min=20, latency_ms_max=60, latency_ms_for_model={"sim-judge-70b": 4_000})
        killed = argv(proj, "killed-example", "runs", "--redis-url", redis_url)
        proc = subprocess.Popen(
            killed, cwd=tmp_path, env=cluster.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        judged = lambda: fake.stats().calls_by_model.get("sim-judge-70b", 0)  # noqa: E731
        wait_for(lambda: judged() >= 2 or proc.poll() is not None, "judge calls in flight")
        assert proc.poll() is None, f"driver ended before the kill: {proc.stderr.read().decode()[-2000:]}"  # type: ignore[union-attr]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        at_kill = fake.stats()
        in_flight = at_kill.total_calls - at_kill.ok
        assert at_kill.calls_by_model["sim-labeller-8b"] == n
        assert in_flight >= 1, "no call in flight at the kill: the test proves nothing"

        # the killed driver's workers drain: the calls in flight are answered, then no worker is left
        wait_for(lambda: not alive_workers(cluster), "the killed driver's workers ended", timeout_s=300)
        drained = fake.stats()
        assert drained.ok == drained.total_calls >= at_kill.total_calls  # every call in flight was answered

        fake.configure(latency_ms_min=20, latency_ms_max=60, latency_ms_for_model={})
        resumed = subprocess.run(killed, cwd=tmp_path, env=cluster.env, capture_output=True, text=True, timeout=600)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        after = fake.stats()
        twice = {k: c for k, c in after.calls.items() if c > 1}
        print(f"\nin flight at the kill: {in_flight}; asked twice: {len(twice)}; paid twice: {after.ok - 2 * n}")
        assert twice == {} and after.ok == after.total_calls == 2 * n  # each request asked and paid exactly once
        assert len(after.calls) == 2 * n
        assert (tmp_path / "runs" / "killed-example" / "artifacts" / "judged.jsonl").read_bytes() == expected
        record = msgspec.json.decode((tmp_path / "runs" / "killed-example" / "run.json").read_bytes())
        assert record["state"] == "finished"
        assert alive_workers(cluster) == []
    finally:
        cluster.shutdown()


def test_submit_ships_the_package_the_config_names_and_nothing_for_a_builtin(tmp_path: Path) -> None:
    proj = project(tmp_path)
    code = user_code(load_config(proj / "sentiment.toml"))  # found beside the config
    assert code == [str(proj / "sentiment_pipeline")]
    staged = tmp_path / "job"
    assert stage(str(proj / "sentiment.toml"), staged) == "sentiment.toml"
    files = sorted(p.relative_to(staged).as_posix() for p in staged.rglob("*") if p.is_file())
    assert files == ["data/reviews.jsonl", "sentiment.toml"]  # the code goes as py_modules, not in working_dir
    assert user_code(load_config(REPO / "configs" / "demo.toml")) == []  # the cluster's own punchline


@pytest.mark.slow
def test_submit_runs_the_users_pipeline_on_a_two_node_ray_start_cluster(tmp_path: Path, redis_url: str) -> None:
    proj = project(tmp_path)
    env = clean_env(PUNCHLINE_REDIS_URL=redis_url)  # the nodes' own ledger URL, as a Secret would give it
    env = {k: v for k, v in env.items() if not k.startswith(("AWS_", "RAY_"))}
    cluster = RayStartCluster(env, logs=tmp_path / "ray-logs")
    store = tmp_path / "cluster-store"  # a folder every node of this one-machine cluster sees
    try:
        cluster.start_head(dashboard=True)
        cluster.add_worker()
        cluster.wait_for_nodes(2)
        address = ["--address", cluster.dashboard_url]
        # the nodes' Python has punchline but not this project: only the job's py_modules can bring it
        sub = punchline(
            "submit", "sentiment.toml", *address, "--store", str(store), "--run-id", "sub", cwd=proj, env=cluster.env
        )
        assert sub.returncode == 0, sub.stderr[-3000:]
        job = sub.stdout.strip()
        followed = punchline("logs", job, *address, "--follow", cwd=proj, env=cluster.env)
        assert followed.returncode == 0, followed.stdout[-3000:] + followed.stderr[-2000:]
        assert "run sub: finished" in followed.stdout and "sentiment of 12 reviews" in followed.stdout
        from ray.job_submission import JobSubmissionClient

        runtime_env = JobSubmissionClient(cluster.dashboard_url).get_job_info(job).runtime_env or {}
        assert len(runtime_env.get("py_modules", [])) == 1  # the package, uploaded (a gcs:// URI by now)
        judged = rows(store / "sub" / "artifacts" / "judged.jsonl")
        assert [r["id"] for r in judged] == [r["id"] for r in rows(proj / "data" / "reviews.jsonl")]
        assert all(r["judge_answer"] for r in judged)
    finally:
        cluster.shutdown()


@pytest.mark.parametrize("step", ["plan", "reduce"])
def test_a_plugins_own_exception_names_the_pipeline_the_stage_and_its_line_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], step: str
) -> None:
    """Not "internal error": the line says whose code failed and where, and how to resume once it is fixed."""
    proj = project(tmp_path, name=f"bug{step}")
    code = proj / "sentiment_pipeline" / "pipeline.py"
    text = code.read_text()
    bug = f"\n\ndef _bug(self, *args, **kwargs):\n    raise KeyError('no-such-model')\n\n\nJudgeStage.{step} = _bug\n"
    code.write_text(text + bug)
    line = len((text + bug).splitlines()) - 3  # the raise
    runs = tmp_path / "runs"
    code_ = main(
        ["run", str(proj / "sentiment.toml"), "--run-id", f"bug-{step}", "--runs-dir", str(runs), "--no-progress"]
    )
    err = capsys.readouterr().err.strip()
    assert code_ == 1, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err and "internal error" not in err, err
    assert f"pipeline '{REF}', stage 'judge': its {step} raised KeyError: 'no-such-model'" in err
    assert f"{code}:{line}" in err
    if step == "reduce":  # the run got that far: it can be resumed once fixed
        assert f"resume with: punchline run {proj / 'sentiment.toml'} --run-id bug-{step}" in err
