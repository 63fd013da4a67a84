"""The wheel, installed into a fresh virtual environment, is one package: ``punchline``.

A Ray user's working folder (``ray job submit --working-dir .``) often holds its own ``data/`` or
``cluster/`` package; ours must never collide with it. The dependencies come from the test venv
through a ``.pth`` line (no registry needed), the project itself only from the wheel.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=False, **kw)  # type: ignore[call-overload,no-any-return]


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    tmp = tmp_path_factory.mktemp("wheel")
    # Build from a clean copy: setuptools reuses a checkout's build/ folder, stale files and all.
    src = tmp / "src"
    shutil.copytree(
        REPO,
        src,
        symlinks=True,
        ignore=shutil.ignore_patterns(".git", ".venv", "runs", "build", "*.egg-info", "__pycache__", ".*_cache"),
    )
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    built = _run(
        [*pip_wheel, "-w", str(tmp), str(src)],
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp.glob("punchline-*.whl")
    venv = tmp / "venv"
    made = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], timeout=120)
    assert made.returncode == 0, made.stderr
    purelib = Path(
        sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)})  # the new venv's site-packages
    )
    # Third-party dependencies from the test venv: a plain path entry, so its .pth files (our editable
    # install among them) are not processed.
    (purelib / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    installed = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "--quiet",
            "--no-deps",
            str(wheel),
        ],
        timeout=300,
    )
    assert installed.returncode == 0, installed.stderr
    yield venv


def test_wheel_holds_one_package(wheel_venv: Path, tmp_path: Path) -> None:
    py = str(wheel_venv / "bin" / "python")
    for name in ("data", "cluster", "workers", "schedulers"):
        probe = _run([py, "-c", f"import {name}"], cwd=tmp_path, timeout=60)
        assert probe.returncode != 0 and "No module named" in probe.stderr, name
    where = _run([py, "-c", "import punchline.data.store as s; print(s.__file__)"], cwd=tmp_path, timeout=60)
    assert where.returncode == 0, where.stderr
    assert str(wheel_venv) in where.stdout and str(REPO) not in where.stdout
    samples = _run([py, "-c", "import punchline.data, pathlib; print(pathlib.Path(punchline.data.__file__).parent)"])
    assert (Path(samples.stdout.strip()) / "samples" / "puns_sample.json").is_file()


def test_run_from_a_folder_with_its_own_data_package(wheel_venv: Path, tmp_path: Path) -> None:
    user = tmp_path / "project"
    (user / "data").mkdir(parents=True)
    (user / "data" / "__init__.py").write_text("raise ImportError('the user data package was imported')\n")
    (user / "data" / "store.py").write_text("Store = None\n")
    (user / "cluster").mkdir()
    (user / "cluster" / "__init__.py").write_text("raise ImportError('the user cluster package was imported')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PUNCHLINE_", "RAY_"))}
    env["PYTHONPATH"] = str(user)  # as Ray's --working-dir does
    done = _run(
        [
            str(wheel_venv / "bin" / "punchline"),
            "run",
            str(REPO / "configs" / "demo.toml"),
            "--no-progress",
            "--runs-dir",
            str(user / "runs"),
        ],
        cwd=user,
        env=env,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    (run_dir,) = (user / "runs").glob("demo-*")
    assert (run_dir / "artifacts" / "puns_ranked.json").is_file()
