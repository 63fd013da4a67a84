"""Runs as Ray jobs (cluster/ray_cluster/ray_jobs.py, ``punchline submit | jobs | logs | stop``).

The slow test starts a real cluster with ``ray start`` (a head with its dashboard on 127.0.0.1 and a
worker node), submits the demo from a user folder that has its own ``data/`` and ``cluster/``
packages, stops it mid-run, resumes it by submitting the same run id, and compares every artifact
with a local run's; then ``ray job submit --working-dir`` of that folder, the command a Ray user
types, is refused with one line while its store would land in the job's temporary copy, and
succeeds with a store every node sees.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec
import pytest

from punchline.cluster.cli.main import build_parser
from punchline.cluster.config import load_config, resolve_path
from punchline.cluster.ray_cluster.ray_jobs import (
    SubmitOptions,
    entrypoint,
    jobs_address,
    refuse_secrets,
    run_id_of,
    stage,
)
from punchline.cluster.run.driver import RunOptions, RunRecord, run
from punchline.data.errors import ConfigError, InputError
from tests.fixtures.ray_start import RayStartCluster

REPO = Path(__file__).resolve().parents[3]
DEMO = REPO / "configs" / "demo.toml"


def test_stage_carries_the_config_and_its_inputs_and_nothing_else(tmp_path: Path) -> None:
    into = tmp_path / "job"
    rel = stage(str(DEMO), into)
    assert rel == "configs/demo.toml"
    files = sorted(p.relative_to(into).as_posix() for p in into.rglob("*") if p.is_file())
    assert files == ["configs/demo.toml", "data/samples/puns_sample.json"]
    staged = load_config(into / rel)
    assert (
        resolve_path(staged, staged.settings.jokes).read_bytes()
        == (REPO / "data/samples/puns_sample.json").read_bytes()
    )  # type: ignore[union-attr]


def test_stage_leaves_absolute_paths_and_names_a_missing_input(tmp_path: Path) -> None:
    jokes = tmp_path / "elsewhere" / "jokes.json"
    jokes.parent.mkdir()
    shutil.copy(REPO / "data/samples/puns_sample.json", jokes)
    text = DEMO.read_text().replace('"../data/samples/puns_sample.json"', f'"{jokes}"')
    (tmp_path / "abs.toml").write_text(text)
    assert stage(str(tmp_path / "abs.toml"), tmp_path / "job") == "abs.toml"
    assert [p.name for p in (tmp_path / "job").rglob("*") if p.is_file()] == ["abs.toml"]
    (tmp_path / "missing.toml").write_text(DEMO.read_text().replace("puns_sample.json", "nope.json"))
    with pytest.raises(InputError, match=r"nope\.json"):
        stage(str(tmp_path / "missing.toml"), tmp_path / "job2")


def test_the_entrypoint_is_a_punchline_run_our_parser_accepts() -> None:
    opts = SubmitOptions(store="s3://b/p", redis_url="redis://redis:6379/0", max_workers=8, max_cost_usd=2.5)
    argv = shlex.split(entrypoint("configs/my run.toml", "r-1", opts))
    assert argv[:3] == ["python", "-m", "punchline"]
    args = build_parser().parse_args(argv[3:])
    assert (args.command, args.config, args.run_id, args.store) == ("run", "configs/my run.toml", "r-1", "s3://b/p")
    assert (args.redis_url, args.max_workers, args.max_cost_usd, args.verbose) == ("redis://redis:6379/0", 8, 2.5, True)
    assert args.metrics_port is None
    with_metrics = shlex.split(entrypoint("c.toml", "r-1", SubmitOptions(metrics_port=9100)))
    assert build_parser().parse_args(with_metrics[3:]).metrics_port == 9100
    submitted = build_parser().parse_args(["submit", "c.toml", "--metrics-port", "9100"])
    assert submitted.metrics_port == 9100


def test_jobs_know_their_run_from_metadata_or_the_entrypoint() -> None:
    assert run_id_of({"punchline_run_id": "r1"}, "python -m punchline run c.toml --run-id other") == "r1"
    assert run_id_of({}, "python -m punchline run configs/demo.toml --run-id wd-1 --store s3://b") == "wd-1"
    assert run_id_of(None, "/opt/venv/bin/punchline run configs/demo.toml") == ""  # a punchline run, id chosen later
    assert run_id_of(None, "python train.py --run-id x") is None
    assert run_id_of(None, "echo 'unbalanced") is None


def test_a_redis_password_never_goes_into_a_job() -> None:
    with pytest.raises(ConfigError, match="PUNCHLINE_REDIS_URL on the cluster's nodes") as caught:
        refuse_secrets(SubmitOptions(redis_url="redis://:hunter2@redis:6379/0"))
    assert "hunter2" not in str(caught.value)
    refuse_secrets(SubmitOptions(redis_url="redis://redis:6379/0"))


def test_the_dashboard_address_flag_then_environment_then_local() -> None:
    assert jobs_address("http://h:8265", {"PUNCHLINE_JOBS_ADDRESS": "http://x:1"}) == "http://h:8265"
    assert jobs_address(None, {"PUNCHLINE_JOBS_ADDRESS": "http://x:1", "RAY_ADDRESS": "http://y:2"}) == "http://x:1"
    assert jobs_address(None, {"RAY_ADDRESS": "10.0.0.1:6379"}) == "http://127.0.0.1:8265"  # a GCS address is not it
    assert jobs_address(None, {"RAY_ADDRESS": "http://y:2"}) == "http://y:2"


def test_status_of_a_submitted_run_reads_its_record_from_the_store(tmp_path: Path, capsys: Any) -> None:
    from punchline.cluster.cli.main import main
    from punchline.cluster.run.driver import Services
    from punchline.data.stores import open_store

    record = RunRecord(
        run_id="r9",
        pipeline="puns",
        config_path="configs/demo.toml",
        config_toml="",
        created_at=0.0,
        services=Services(redis_url="redis://127.0.0.1:1/0", store_url=str(tmp_path / "store")),
        stages=["collect"],
        state="finished",
    )
    open_store(str(tmp_path / "store")).put("r9/run.json", msgspec.json.encode(record))
    runs = str(tmp_path / "runs")  # the job kept its runs folder on the head, in its working dir
    assert main(["status", "r9", "--runs-dir", runs]) == 2
    assert main(["status", "r9", "--runs-dir", runs, "--store", str(tmp_path / "store"), "--json"]) == 0
    assert '"state":"finished"' in capsys.readouterr().out


def user_project(tmp: Path) -> Path:
    """A Ray user's working folder: the demo config and its jokes, beside packages named like ours."""
    project = tmp / "project"
    (project / "configs").mkdir(parents=True)
    # a slower simulator (the same answers), so that a stop lands mid-run however fast the engine starts
    slow = (
        DEMO.read_text()
        .replace("latency_ms_min = 5\n", "latency_ms_min = 60\n")
        .replace("latency_ms_max = 40\n", "latency_ms_max = 160\n")
    )
    assert "latency_ms_max = 160" in slow
    (project / "configs" / "demo.toml").write_text(slow)
    small = DEMO.read_text().replace('models = ["3b", "8b", "70b", "3.3-70b", "405b"], samples = 20', 'models = ["3b"]')
    small = "\n".join(ln for ln in small.splitlines() if not ln.startswith(("cloze =", "evaluate =", "classify =")))
    (project / "configs" / "small.toml").write_text(small + "\n")
    (project / "data" / "samples").mkdir(parents=True)
    shutil.copy(REPO / "data" / "samples" / "puns_sample.json", project / "data" / "samples")
    (project / "data" / "__init__.py").write_text("raise ImportError('the user data package was imported')\n")
    (project / "data" / "store.py").write_text("Store = None\n")
    (project / "cluster").mkdir()
    (project / "cluster" / "__init__.py").write_text("raise ImportError('the user cluster package was imported')\n")
    return project


class Cli:
    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.env, self.cwd = env, cwd

    def __call__(self, *args: str, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "punchline", *args],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )


def wait_for(cond: Any, what: str, timeout_s: float = 600.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"{what}: not reached in time"
        time.sleep(0.5)


def artifacts(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.slow
@pytest.mark.timeout(1800)  # ~560 s on a loaded 2-core machine (load 20) before the teardown: 600 s was too tight
def test_submit_stop_resume_on_a_ray_start_cluster_matches_a_local_run(
    tmp_path: Path, ray_local: Any, redis_url: str
) -> None:
    started = time.monotonic()

    def mark(what: str) -> None:
        print(f"\n{time.monotonic() - started:6.1f}s  {what}")

    local = run(str(DEMO), RunOptions(run_id="local", runs_dir=str(tmp_path / "local-runs"), store=str(tmp_path / "l")))
    mark("local demo run finished")
    assert local.state == "finished"
    expected = artifacts(tmp_path / "l" / "local" / "artifacts")

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PUNCHLINE_", "RAY_", "AWS_"))}
    env["RAY_JOB_STOP_WAIT_TIME_S"] = "30"  # the grace Ray gives a stopped driver before SIGKILL
    # the ledger's URL (with its password) is the nodes' own setting, as a Secret would give it: never in a job
    env["PUNCHLINE_REDIS_URL"] = redis_url
    cluster = RayStartCluster(env, logs=tmp_path / "ray-logs")
    project = user_project(tmp_path)
    store = tmp_path / "cluster-store"  # a folder every node of this one-machine cluster sees
    try:
        cluster.start_head(dashboard=True)
        cluster.add_worker()
        cluster.wait_for_nodes(2)
        mark("ray start head (dashboard) + worker: 2 nodes alive")
        cli = Cli(cluster.env, project)
        address = ["--address", cluster.dashboard_url]
        services = ["--store", str(store)]  # as on a cluster: a shared store, the nodes' own Redis URL

        def state(job: str) -> str:
            done = cli("jobs", *address)
            assert done.returncode == 0, done.stderr
            return next((ln for ln in done.stdout.splitlines() if job in ln), "")

        # submit, then stop mid-run
        sub = cli("submit", "configs/demo.toml", *address, *services, "--run-id", "sub")
        assert sub.returncode == 0, sub.stderr
        first = sub.stdout.strip()
        assert first.startswith("punchline-sub-") and "punchline logs" in sub.stderr
        shards = store / "sub" / "stages" / "collect" / "shards"
        wait_for(lambda: shards.is_dir() and any(shards.iterdir()), "a first shard")
        mark("submitted; first shard committed")
        assert "RUNNING" in state(first)
        stopped = cli("stop", first, *address, "--wait")
        assert stopped.returncode == 0 and "STOPPED" in stopped.stderr, stopped.stderr
        row = state(first)
        assert "sub" in row and "STOPPED" in row
        record = msgspec.json.decode((store / "sub" / "run.json").read_bytes(), type=RunRecord)
        assert record.state == "interrupted"
        mark("stopped; run record says interrupted")
        assert not (store / "sub" / "stages" / "evaluate" / "manifest.json").exists()  # stopped before the end

        # a password through a side door (?password=) is refused before anything reaches the cluster
        password = urlsplit(redis_url).password or ""
        assert password
        side_door = redis_url.replace(f":{password}@", "@", 1) + f"?password={password}"
        refused = cli("submit", "configs/demo.toml", *address, *services, "--redis-url", side_door, "--run-id", "x")
        assert refused.returncode == 2 and "--redis-url" in refused.stderr and password not in refused.stderr

        # resume: the same config and run id, with Ray's job options; follow its log to the end
        again = cli(
            "submit", "configs/demo.toml", *address, *services, "--run-id", "sub", "--submission-id", "sub-resume-1",
            "--entrypoint-num-cpus", "0", "--env", "PUNCHLINE_S3_OUTAGE_S=900",
        )  # fmt: skip
        assert again.returncode == 0, again.stderr
        second = again.stdout.strip()
        assert second == "sub-resume-1"
        followed = cli("logs", second, *address, "--follow")
        assert followed.returncode == 0, followed.stdout[-3000:] + followed.stderr[-2000:]
        assert "run sub: finished" in followed.stdout and "SUCCEEDED" in followed.stderr
        assert "stage_skipped" in followed.stdout or "stage_start" in followed.stdout  # the driver's log lines
        assert "SUCCEEDED" in state(second)
        assert "run sub: finished" in cli("logs", second, *address).stdout
        assert '"state":"finished"' in cli("status", "sub", "--store", str(store), "--json").stdout
        assert artifacts(store / "sub" / "artifacts") == expected
        # the demo's simulated provider listened on the driver node's address, where workers on other nodes reach it
        record = msgspec.json.decode((store / "sub" / "run.json").read_bytes(), type=RunRecord)
        assert urlsplit(record.services.simulator_url).hostname == cluster.node_ip != "127.0.0.1"
        mark(f"resumed run finished; {len(expected)} artifacts identical to the local run's")
        assert cli("logs", "no-such-job", *address).returncode == 2
        # the run's log is in the store beside run.json; no secret in Ray's job table or in any job's log
        assert b'"run_end"' in (store / "sub" / "log.jsonl").read_bytes()
        ray_bin = str(Path(sys.executable).parent / "ray")
        table = subprocess.run(
            [ray_bin, "job", "list", *address],
            env=cluster.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert table.returncode == 0 and "sub-resume-1" in table.stdout, table.stderr[-2000:]
        shown = table.stdout + cli("jobs", *address, "--all").stdout
        shown += cli("logs", first, *address).stdout + cli("logs", second, *address).stdout
        assert password not in shown
        listed = [ln for ln in cli("jobs", *address).stdout.splitlines() if ln.strip()]
        assert len(listed) == 1 + 2  # the header and one line per job
        # an ended job can be deleted (a running one must be stopped first)
        deleted = cli("delete", first, *address)
        assert deleted.returncode == 0, deleted.stderr
        assert first not in cli("jobs", *address).stdout

        # `ray job submit --working-dir` of the user's folder: refused while the store is relative, then fine
        ray_cli = [str(Path(sys.executable).parent / "ray"), "job", "submit", *address, "--working-dir", str(project)]
        cmd = [sys.executable.rsplit("/", 1)[-1], "-m", "punchline", "run", "configs/small.toml", "--no-progress"]
        for job, extra in (("wd-relative", []), ("wd-shared", services)):
            done = subprocess.run(
                [*ray_cli, "--submission-id", job, "--no-wait", "--", *cmd, "--run-id", job, *extra],
                cwd=project,
                env=cluster.env,
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            assert done.returncode == 0, done.stderr[-2000:]
        wait_for(lambda: any(s in state("wd-relative") for s in ("FAILED", "SUCCEEDED")), "the relative-store job")
        assert "FAILED" in state("wd-relative")
        refused = cli("logs", "wd-relative", *address).stdout.strip().splitlines()
        assert refused[-1].startswith("punchline: error: store ") and "--store s3://bucket/prefix" in refused[-1]
        assert "ImportError" not in "\n".join(refused)
        mark("ray job submit --working-dir with a relative store: refused")
        wait_for(lambda: any(s in state("wd-shared") for s in ("FAILED", "SUCCEEDED")), "the shared-store job")
        assert "SUCCEEDED" in state("wd-shared"), cli("logs", "wd-shared", *address).stdout[-3000:]
        assert (store / "wd-shared" / "artifacts" / "raw_completions.json").is_file()
        mark("ray job submit --working-dir with a shared store: succeeded")
    finally:
        cluster.shutdown()


@pytest.mark.parametrize(
    ("flag", "url"),
    [
        ("redis_url", "redis://:hunter2@redis:6379/0"),
        ("redis_url", "redis://default:hunter2@redis:6379/0"),
        ("redis_url", "redis://redis:6379/0?password=hunter2"),
        ("redis_url", "rediss://redis:6380/0?ssl_ca_certs=/ca.pem&Password=hunter2"),
        ("redis_url", "redis://redis:6379/0?db=1&auth_token=hunter2"),
        ("redis_url", "redis://redis:6379/0?api-key=hunter2"),
        ("store", "s3://bucket/prefix?secret=hunter2"),
    ],
)
def test_a_credential_in_any_form_never_goes_into_a_job(flag: str, url: str, capsys: Any) -> None:
    from punchline.cluster.cli.main import main

    with pytest.raises(ConfigError, match="carries a secret") as caught:
        refuse_secrets(SubmitOptions(**{flag: url}))
    assert "hunter2" not in str(caught.value)
    # the command refuses it before it reads the config or reaches a cluster (port 9: nothing listens)
    option = "--redis-url" if flag == "redis_url" else "--store"
    code = main(["submit", str(DEMO), option, url, "--address", "http://127.0.0.1:9"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and option in err and "hunter2" not in err


def test_urls_without_secrets_go_through_and_redaction_covers_every_form() -> None:
    from punchline.schedulers.server.redis_client import credentials_in_userinfo, redact_url
    from punchline.workers.logs import redact_text

    refuse_secrets(SubmitOptions(redis_url="rediss://redis:6380/0?ssl_ca_certs=/ca.pem&ssl_keyfile=/k.pem"))
    assert redact_url("redis://redis:6379/0?password=hunter2&db=1") == "redis://redis:6379/0?password=***&db=1"
    assert redact_url("redis://u:hunter2@[::1]:6379/0") == "redis://u:***@[::1]:6379/0"
    line = "python -m punchline run c.toml --redis-url 'redis://h:1/0?token=hunter2' --store s3://b/p?sig=hunter2"
    assert "hunter2" not in redact_text(line) and "--store s3://b/p" in redact_text(line)
    # the driver moves a ?password= into the userinfo, so workers get it as ***, never in their arguments
    moved = credentials_in_userinfo("redis://h:6379/0?password=hunter2&db=1")
    assert moved == "redis://:hunter2@h:6379/0?db=1"
    assert redact_url(moved) == "redis://:***@h:6379/0?db=1"


def test_a_job_takes_only_punchline_settings_as_environment() -> None:
    from punchline.cluster.ray_cluster.ray_jobs import check_submit_options, parse_env

    env = parse_env(["PUNCHLINE_S3_OUTAGE_S=1200", "PUNCHLINE_RATE_RECOVER_WINDOW_S=30"])
    assert env == {"PUNCHLINE_S3_OUTAGE_S": "1200", "PUNCHLINE_RATE_RECOVER_WINDOW_S": "30"}
    check_submit_options(SubmitOptions(env=env, entrypoint_num_cpus=0.5, submission_id="my-run.1"))
    for bad, field in [
        ({"PUNCHLINE_REDIS_URL": "redis://h/0"}, "--env"),
        ({"AWS_SECRET_ACCESS_KEY": "x"}, "--env"),
        ({"OPENAI_API_KEY": "sk-abcdefghijklmnopqrstuvwx"}, "--env"),
        ({"PUNCHLINE_STORE": "s3://b/p?token=hunter2"}, "--env"),
        ({"PUNCHLINE_DEBUG": "sk-abcdefghijklmnopqrstuvwx"}, "--env"),
    ]:
        with pytest.raises(ConfigError, match=field) as caught:
            check_submit_options(SubmitOptions(env=bad))
        assert "hunter2" not in str(caught.value) and "sk-abc" not in str(caught.value)
    for pair in ("NOVALUE", "lower=1", "=x"):
        with pytest.raises(ConfigError, match="--env"):
            parse_env([pair])
    for opts, field in [
        (SubmitOptions(entrypoint_num_cpus=-1.0), "--entrypoint-num-cpus"),
        (SubmitOptions(entrypoint_num_cpus=float("nan")), "--entrypoint-num-cpus"),
        (SubmitOptions(submission_id="a b"), "--submission-id"),
        (SubmitOptions(submission_id=""), "--submission-id"),
        (SubmitOptions(max_workers=10**12), "--max-workers"),
        (SubmitOptions(max_cost_usd=float("inf")), "--max-cost-usd"),
    ]:
        with pytest.raises(ConfigError, match=field):
            check_submit_options(opts)


class _AuthDashboard:
    """An HTTP server on 127.0.0.1 answering every request as a token-auth Ray dashboard answers a client
    with no token (401) or a wrong one (403)."""

    def __init__(self, status: int) -> None:
        import http.server
        import threading

        code = status

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                body = b"Unauthorized: missing or invalid authentication token"
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_DELETE = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize(("status", "word"), [(401, "set RAY_AUTH_TOKEN"), (403, "fix RAY_AUTH_TOKEN")])
def test_a_token_auth_cluster_refusing_us_is_one_line_and_exit_2(status: int, word: str, capsys: Any) -> None:
    from punchline.cluster.cli.main import main

    dashboard = _AuthDashboard(status)
    try:
        for argv in (["jobs"], ["logs", "j1"], ["stop", "j1"], ["delete", "j1"], ["submit", str(DEMO)]):
            code = main([*argv, "--address", dashboard.url])
            err = capsys.readouterr().err.strip().splitlines()
            assert code == 2, (argv, err)
            assert len(err) == 1 and word in err[0] and "internal error" not in err[0], (argv, err)
    finally:
        dashboard.close()
