"""Issue 39, item 2: a driver killed while its provider's 500s are in flight, then a plain resume, end to end
(real drivers as subprocesses, the fake provider over HTTP, the runs folder's own ledger).

Every request's first attempts are answered 500 after 300-500 ms, so at the kill there are calls in flight that
will fail and units waiting out a backoff. The killed driver's workers drain: they retry nothing, so what they
see is only what the kill did to them, and they record none of it (no shard file, no failure); the resume
calls those units again and ends ``finished`` (exit 0) with artifacts byte-identical to a clean run's.
Before, they wrote the units as failed 2-4 s after losing their leases, and the resume, finding the shard
files, ended ``failed`` (exit 1) with 0 calls for them; only ``retry-failed`` repaired it.

* SIGKILL of a driver on the session's Ray (``--ray-address``): its detached workers drain;
* Ctrl-C (SIGINT) of a driver on the default path: its own worker process drains (the driver stops it);
* a run whose provider answers 5xx past its retries ends ``failed``; once the provider is back a plain resume
  calls those units again (their failures were retryable), while 4xx failures stay for ``retry-failed``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from punchline.workers.fake.server import FakeProviderServer
from tests.cluster.run.test_engine_faults import Setup  # the module setup both fault files share
from tests.fixtures.engine import driver_argv, engine_config

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
UNITS = 8 * 2 * 2  # 8 jokes x 2 models x (greedy + samples)
# every request's first three attempts are 500s: whenever the signal comes, the calls in flight are nearly all
# failing ones (with one failing attempt, the retries in flight would be answered and the case often missed)
FAILING = dict(latency_ms_min=300, latency_ms_max=500, fail_first_attempts=3, fail_status=500)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, fake_provider: FakeProviderServer, redis_url: str, ray_local: Any):
    """The config of every test here and the artifact of a clean (uninterrupted, fault-free) run of it."""
    import ray

    from punchline.cluster.run.driver import RunOptions, run

    tmp = tmp_path_factory.mktemp("kill-while-failing")
    fake_provider.restore_defaults()
    fake_provider.reset()
    cfg = engine_config(tmp, fake_provider, jokes=8, shard_size=2, lease_ms=2000)
    opts = RunOptions(run_id="clean", runs_dir=str(tmp / "runs"), redis_url=redis_url, store=str(tmp / "store"))
    assert run(str(cfg), opts).state == "finished"
    expected = (tmp / "store" / "clean" / "artifacts" / "raw_completions.json").read_bytes()
    return Setup(cfg, expected, ray.get_runtime_context().gcs_address)


def wait_for(cond: Callable[[], bool], timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PUNCHLINE_REDIS_URL", "PUNCHLINE_STORE")}


def _failing_in_flight(fake: FakeProviderServer) -> int:
    """Calls the fake holds now (each a 500 to come, unless it is a request's fourth attempt)."""
    s = fake.stats()
    return s.total_calls - s.ok - sum(s.faults.values())


def _kill_while_failing(fake: FakeProviderServer, argv: list[str], sig: int) -> tuple[int, int, str]:
    """Start the driver, send ``sig`` once a quarter of the requests were asked with calls in flight; (its exit
    code, the calls in flight at the signal, its stderr)."""
    fake.configure(**FAILING)
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=_env())
    try:
        wait_for(
            lambda: (
                proc.poll() is not None or (fake.stats().total_calls >= UNITS // 4 and _failing_in_flight(fake) >= 2)
            )
        )
        assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
        os.kill(proc.pid, sig)
        in_flight = _failing_in_flight(fake)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, in_flight, err.decode()


def _resume_and_check(argv: list[str], runs: Path, store: Path, run_id: str, setup: Setup) -> None:
    """A plain resume (the same command) ends ``finished`` with exit 0, nothing failed, and the artifacts
    byte-identical to the clean run's."""
    resumed = subprocess.run(argv, cwd=ROOT, capture_output=True, timeout=300, env=_env())
    assert resumed.returncode == 0, resumed.stderr.decode()[-3000:]
    record = json.loads((runs / run_id / "run.json").read_text())
    assert record["state"] == "finished" and record["failures"] == {}, record["failures"]
    assert (store / run_id / "artifacts" / "raw_completions.json").read_bytes() == setup.expected


def _unwritten_failures(runs: Path, run_id: str) -> list[str]:
    """The killed driver's workers' log: units whose call failed after the driver was gone, left unrecorded."""
    events = [json.loads(line) for line in (runs / run_id / "log.jsonl").read_text().splitlines() if line.strip()]
    assert not [e for e in events if e["event"] == "unit_failed"], "a unit was recorded as failed"
    return [e["reason"] for e in events if e["event"] == "shard_unwritten" and "failed (" in e.get("reason", "")]


def test_kill_9_of_the_driver_while_its_calls_fail_then_a_plain_resume_finishes(
    tmp_path: Path, setup: Setup, fake: FakeProviderServer
) -> None:
    """SIGKILL of a driver whose (detached) Ray workers have 500s in flight: they drain and record nothing for
    those units; the resume, started at once (the workers still draining), calls them again and finishes."""
    argv = driver_argv(setup.cfg, "killed", tmp_path, "--ray-address", setup.address)
    code, in_flight, _ = _kill_while_failing(fake, argv, signal.SIGKILL)
    assert code == -signal.SIGKILL and in_flight >= 1
    _resume_and_check(argv, tmp_path / "runs", tmp_path / "store", "killed", setup)
    assert len(fake.stats().calls) == UNITS
    assert _unwritten_failures(tmp_path / "runs", "killed"), "no call failed after the kill: the case was not met"


def test_ctrl_c_of_a_local_run_while_its_calls_fail_then_a_plain_resume_finishes(
    tmp_path: Path, setup: Setup, fake: FakeProviderServer
) -> None:
    """Ctrl-C of a driver on the default path (its own worker process calling, the runs folder's ledger): the
    driver stops its worker, which drains with 500s in flight and records nothing for those units; exit 130,
    then the plain resume finishes."""
    argv = driver_argv(setup.cfg, "interrupted", tmp_path)
    code, in_flight, err = _kill_while_failing(fake, argv, signal.SIGINT)
    assert code == 130 and in_flight >= 1, err[-2000:]
    assert json.loads((tmp_path / "runs" / "interrupted" / "run.json").read_text())["state"] == "interrupted"
    _resume_and_check(argv, tmp_path / "runs", tmp_path / "store", "interrupted", setup)
    assert len(fake.stats().calls) == UNITS
    assert _unwritten_failures(tmp_path / "runs", "interrupted"), "no call failed after Ctrl-C: the case was not met"


def test_a_plain_resume_calls_again_the_units_that_failed_with_5xx_and_retry_failed_the_4xx(
    tmp_path: Path, setup: Setup, fake: FakeProviderServer
) -> None:
    """One model answers 503 to every attempt (its provider down for the run's length), the other 400: every
    unit fails (the 503s after their retries) and the run ends ``failed`` (exit 1). Once the provider is back, a
    plain resume calls again just the 503s (a retryable last error) and still ends ``failed`` with the 400s,
    which are permanent: ``retry-failed`` calls those, and the run ends with the clean run's artifacts."""
    cfg = tmp_path / "cfg.toml"
    cfg.write_text(setup.cfg.read_text().replace("max_retries = 8", "max_retries = 1"))  # fail fast
    argv = driver_argv(cfg, "down", tmp_path, "--ray-address", setup.address)
    runs = tmp_path / "runs"

    def failures() -> dict[str, str]:
        return json.loads((runs / "down" / "run.json").read_text())["failures"].get("collect", {})

    fake.configure(status_for_model={"sim/llama-70b": 503, "sim/llama-3b": 400})
    first = subprocess.run(argv, cwd=ROOT, capture_output=True, timeout=300, env=_env())
    assert first.returncode == 1, first.stderr.decode()[-3000:]
    assert len(failures()) == UNITS
    assert fake.stats().calls_by_model == {"sim/llama-70b": UNITS, "sim/llama-3b": UNITS // 2}  # 503s retried once

    fake.restore_defaults()
    fake.reset()
    resumed = subprocess.run(argv, cwd=ROOT, capture_output=True, timeout=300, env=_env())
    assert resumed.returncode == 1, resumed.stderr.decode()[-3000:]
    assert fake.stats().calls_by_model == {"sim/llama-70b": UNITS // 2}  # the 503s, once each; not the 400s
    assert len(failures()) == UNITS // 2 and all("400" in reason for reason in failures().values())

    fake.reset()
    retried = subprocess.run(
        [*argv[:3], "retry-failed", "down", "--runs-dir", str(runs), "--no-progress"],
        cwd=ROOT,
        capture_output=True,
        timeout=300,
        env={**_env(), "PUNCHLINE_RAY_ADDRESS": setup.address},
    )
    assert retried.returncode == 0, retried.stderr.decode()[-3000:]
    assert fake.stats().calls_by_model == {"sim/llama-3b": UNITS // 2}
    assert json.loads((runs / "down" / "run.json").read_text())["state"] == "finished" and failures() == {}
    assert (tmp_path / "store" / "down" / "artifacts" / "raw_completions.json").read_bytes() == setup.expected
