"""One settings tree: every environment variable in the registry, every config key described, the
reference in the docs generated from the code, and one runs folder for every command."""

from __future__ import annotations

import inspect
import os
import re
import time
from pathlib import Path

import msgspec
import pytest

import punchline
from punchline.cluster.cli.main import main
from punchline.cluster.cli.settings_doc import config_tables, reference
from punchline.cluster.ray_cluster.autoscale import AutoscaleSettings
from punchline.cluster.ray_cluster.ray_jobs import JOB_ENV, SubmitOptions, refuse_secrets
from punchline.cluster.run.driver import RunOptions, RunRecord, Services
from punchline.data import settings
from punchline.data.errors import ConfigError
from punchline.data.stores.s3 import S3Settings
from punchline.schedulers.rate_limit import RateLimitSettings
from punchline.schedulers.server.redis_client import RedisSettings
from punchline.services.ray_settings import RaySettings

PACKAGE = Path(punchline.__file__).parent
DOC = Path(__file__).resolve().parents[2] / "docs" / "settings.md"
NAME = re.compile(r"PUNCHLINE_[A-Z0-9_]+")


def package_sources() -> list[Path]:
    return [Path(d) / f for d, _, files in os.walk(PACKAGE, followlinks=True) for f in files if f.endswith(".py")]


def test_every_variable_the_package_and_its_docs_name_is_in_the_registry() -> None:
    sources = package_sources()
    assert len(sources) > 60, "the walk found the package's modules"
    repo = DOC.parents[1]  # README, docs and deploy manifests name no variable that does not exist
    sources += [repo / "README.md", *repo.glob("docs/**/*.md"), *(p for p in repo.glob("deploy/**/*") if p.is_file())]
    unknown = []
    for path in sources:
        for name in set(NAME.findall(path.read_text())):
            # a name ending in "_" is a family in prose (PUNCHLINE_RATE_*): some variable must start with it
            known = (
                any(v.startswith(name) for v in settings.BY_NAME) if name.endswith("_") else name in settings.BY_NAME
            )
            if not known:
                unknown.append(f"{path}: {name}")
    assert unknown == [], "PUNCHLINE_* names missing from punchline/data/settings.py:\n" + "\n".join(unknown)


def test_the_registry_is_complete_and_consistent() -> None:
    assert len(settings.ENV_VARS) == len(settings.BY_NAME), "a variable is defined twice"
    for var in settings.ENV_VARS:
        assert var.name.startswith("PUNCHLINE_") and var.description, var.name
        assert not (var.job and var.secret), f"{var.name}: a secret can never be set per job"
        if var.default is not None and var.kind in ("int", "float"):
            assert var.in_range(var.default), f"{var.name}: the default is out of its own range"
    # the rate limiter: one variable per field, and the struct's defaults are the registry's
    assert {f"PUNCHLINE_RATE_{f.upper()}" for f in RateLimitSettings.__struct_fields__} == {
        n for n in settings.BY_NAME if n.startswith("PUNCHLINE_RATE_")
    }
    assert JOB_ENV == settings.JOB_VARS and "PUNCHLINE_REDIS_URL" not in JOB_ENV


def test_every_from_env_has_one_signature() -> None:
    for cls in (RunOptions, RaySettings, AutoscaleSettings, S3Settings, RateLimitSettings, RedisSettings):
        params = list(inspect.signature(cls.from_env).parameters)
        assert params == ["env"], f"{cls.__name__}.from_env{params}"
        assert isinstance(cls.from_env({}), cls)


@pytest.mark.parametrize(
    ("cls", "env", "named"),
    [
        (RunOptions, {"PUNCHLINE_RUNS_DIR": ""}, "PUNCHLINE_RUNS_DIR"),
        (RaySettings, {"PUNCHLINE_RAY_NUM_CPUS": "zero"}, "PUNCHLINE_RAY_NUM_CPUS"),
        (RaySettings, {"PUNCHLINE_RAY_NUM_CPUS": "0"}, "PUNCHLINE_RAY_NUM_CPUS"),
        (AutoscaleSettings, {"PUNCHLINE_MAX_WORKERS": str(10**12)}, "PUNCHLINE_MAX_WORKERS"),
        (AutoscaleSettings, {"PUNCHLINE_WORKER_NODE_CPUS": "nan"}, "PUNCHLINE_WORKER_NODE_CPUS"),
        (S3Settings, {"PUNCHLINE_S3_OUTAGE_S": "-1"}, "PUNCHLINE_S3_OUTAGE_S"),
        (S3Settings, {"PUNCHLINE_S3_ADDRESSING_STYLE": "sideways"}, "PUNCHLINE_S3_ADDRESSING_STYLE"),
        (RateLimitSettings, {"PUNCHLINE_RATE_HEADROOM": "1.5"}, "PUNCHLINE_RATE_HEADROOM"),
        (RateLimitSettings, {"PUNCHLINE_RATE_RECOVER_WINDOW_S": "soon"}, "PUNCHLINE_RATE_RECOVER_WINDOW_S"),
    ],
)
def test_a_bad_value_is_one_error_naming_the_variable(cls: type, env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        cls.from_env(env)  # type: ignore[attr-defined]
    assert caught.value.field == named and "\n" not in str(caught.value)


def test_values_are_typed_and_empty_is_unset() -> None:
    env = {"PUNCHLINE_RATE_HEADROOM": " 0.5 ", "PUNCHLINE_S3_OUTAGE_S": "", "PUNCHLINE_MAX_WORKERS": "7"}
    assert RateLimitSettings.from_env(env).headroom == 0.5
    assert S3Settings.from_env(env).outage_s == settings.S3_OUTAGE_S.default == 600.0
    assert AutoscaleSettings.from_env(env).max_workers == 7
    assert settings.DEBUG.get({"PUNCHLINE_DEBUG": "yes"}) is True and settings.DEBUG.get({}) is False
    assert RaySettings.from_env({"RAY_ADDRESS": "ray://h:10001"}).address == "ray://h:10001"  # the `also` name
    assert settings.runs_dir(None, {"PUNCHLINE_RUNS_DIR": "/x"}) == "/x"
    assert settings.runs_dir("flag", {"PUNCHLINE_RUNS_DIR": "/x"}) == "flag"


def test_a_secret_value_is_never_echoed() -> None:
    with pytest.raises(ConfigError) as caught:
        settings.EnvVar("PUNCHLINE_X", "int", 0, "a secret number", secret=True).parse("hunter2")
    assert "hunter2" not in str(caught.value)


def test_submit_env_values_are_checked_like_the_environment() -> None:
    refuse_secrets(SubmitOptions(env={"PUNCHLINE_S3_OUTAGE_S": "1200", "PUNCHLINE_RATE_HEADROOM": "0.9"}))
    with pytest.raises(ConfigError, match="PUNCHLINE_S3_OUTAGE_S"):
        refuse_secrets(SubmitOptions(env={"PUNCHLINE_S3_OUTAGE_S": "forever"}))
    with pytest.raises(ConfigError, match="--env"):
        refuse_secrets(SubmitOptions(env={"PUNCHLINE_REDIS_URL": "redis://h:6379/0"}))


def test_every_config_key_has_a_description() -> None:
    tables = config_tables()
    paths = {t.path for t in tables}
    # the engine's tables and every built-in pipeline's, nested tables included
    expected = ["run", "providers.<name>", "providers.<name>.models.<name>", "simulator", "puns.collect"]
    expected += ["humor.judge", "curate.raters.<name>", "prompts.judge.parse", "prompts.sampling.<name>"]
    assert set(expected) <= paths
    missing = [f"[{t.path}] {k.name}" for t in tables for k in t.keys if not k.description]
    assert missing == [], "config keys without a description (msgspec.Meta(description=...)):\n" + "\n".join(missing)
    assert sum(len(t.keys) for t in tables) > 110
    assert all(t.summary for t in tables), [t.path for t in tables if not t.summary]


def test_the_reference_in_the_docs_is_the_generated_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["settings"]) == 0
    printed = capsys.readouterr().out
    assert printed == reference()
    assert DOC.read_text() == printed, "docs/settings.md is stale: run `punchline settings > docs/settings.md`"
    for var in settings.ENV_VARS:
        assert f"`{var.name}`" in printed
    assert "| `batch_max_bytes` | int | `100000000` | 1024 – 10000000000 |" in printed


def _record(runs: Path, run_id: str) -> None:
    record = RunRecord(
        run_id=run_id,
        pipeline="puns",
        config_path="demo.toml",
        config_toml="",
        created_at=time.time(),
        services=Services(redis_url="redis://127.0.0.1:1/0", store_url=str(runs)),
        stages=["collect"],
        state="finished",
        finished_at=time.time(),
    )
    (runs / run_id).mkdir(parents=True)
    (runs / run_id / "run.json").write_bytes(msgspec.json.encode(record))


def test_every_command_reads_the_runs_folder_of_punchline_runs_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``runs``, ``status``, ``batches`` and ``retry-failed`` find runs under ``PUNCHLINE_RUNS_DIR`` (the
    working directory's ``runs/`` is another folder); ``--runs-dir`` still wins over it."""
    elsewhere = tmp_path / "elsewhere"
    _record(elsewhere, "env-run-1")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PUNCHLINE_STORE", raising=False)
    monkeypatch.setenv("PUNCHLINE_RUNS_DIR", str(elsewhere))
    assert main(["runs"]) == 0
    assert "env-run-1" in capsys.readouterr().out
    assert main(["status", "env-run-1", "--json"]) == 0
    assert '"run_id":"env-run-1"' in capsys.readouterr().out
    assert main(["batches", "env-run-1", "--json"]) == 0
    assert capsys.readouterr().out.strip() == "[]"
    for command in (["retry-failed", "no-such-run"], ["humor", "submission", "no-such-run"]):
        assert main(command) == 2
        assert str(elsewhere) in capsys.readouterr().err, command  # it looked in the variable's folder
    other = tmp_path / "flag"
    _record(other, "flag-run")
    assert main(["runs", "--runs-dir", str(other)]) == 0
    out = capsys.readouterr().out
    assert "flag-run" in out and "env-run-1" not in out
    assert not (tmp_path / "runs").exists(), "nothing was read or made under the working directory's runs/"
