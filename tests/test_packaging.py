"""The wheel, installed into a fresh virtual environment outside the checkout, is one package, ``punchline``,
that a stranger runs from an empty folder: ``punchline init``, the demo and the prompts demo, under an empty HOME.

A Ray user's working folder (``ray job submit --working-dir .``) often holds its own ``data/`` or
``cluster/`` package; ours must never collide with it. The dependencies come from the test venv
through a ``.pth`` line (no registry needed: the suite stays within its time), the project itself only from the
wheel; ``pip check`` in the new venv then proves the wheel's declared requirements hold, and a walk of the
package's imports proves each third-party import is declared.
"""

from __future__ import annotations

import ast
import email.parser
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

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
    sdist = _run(
        [sys.executable, "-c", f"from setuptools import build_meta as b; b.build_sdist({str(tmp)!r})"],
        cwd=src,
        timeout=300,
    )
    assert sdist.returncode == 0, sdist.stderr
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
    for name in ("data", "cluster", "workers", "schedulers", "pipelines", "services", "viewer"):
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


def _stranger_env(home: Path) -> dict[str, str]:
    """A machine with nothing configured: an empty HOME, no Ray or punchline settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PUNCHLINE_", "RAY_", "XDG_"))}
    env.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"), XDG_CONFIG_HOME=str(home / ".config"))
    return env


def test_wheel_and_sdist_carry_license_types_and_the_starter_files(wheel_venv: Path) -> None:
    tmp = wheel_venv.parent
    (wheel,) = tmp.glob("punchline-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "punchline/py.typed" in names
    for name in ("demo", "prompts_demo", "humor_demo", "curate_demo"):
        assert f"punchline/configs/{name}.toml" in names
    meta = metadata.Distribution.at(next(wheel_venv.glob("lib/python*/site-packages/punchline-*.dist-info")))
    assert meta.metadata["License-Expression"] == "MIT"
    assert any(c.startswith("Programming Language :: Python :: 3.11") for c in meta.metadata.get_all("Classifier"))
    (sdist,) = tmp.glob("punchline-*.tar.gz")
    with tarfile.open(sdist) as tar:
        assert any(n.endswith("/LICENSE") for n in tar.getnames())


def test_the_new_venv_satisfies_every_declared_requirement(wheel_venv: Path) -> None:
    checked = _run([str(wheel_venv / "bin" / "python"), "-m", "pip", "check"], timeout=120)
    if "No module named pip" in checked.stderr:  # the venv has no pip of its own: ask ours about it
        checked = _run([sys.executable, "-m", "pip", "--python", str(wheel_venv / "bin" / "python"), "check"])
    assert checked.returncode == 0, checked.stdout + checked.stderr


def _wheel_requirements(wheel_venv: Path) -> list[Requirement]:
    """The built wheel's ``Requires-Dist`` lines, read from the wheel itself."""
    (wheel,) = wheel_venv.parent.glob("punchline-*.whl")
    with zipfile.ZipFile(wheel) as whl:
        name = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(whl.read(name).decode())
    return [Requirement(r) for r in meta.get_all("Requires-Dist") or []]


def _in_extra(requirements: list[Requirement], extra: str) -> dict[str, Requirement]:
    return {r.name.lower(): r for r in requirements if r.marker is not None and r.marker.evaluate({"extra": extra})}


def test_the_wheels_runtime_requirements_exclude_the_test_tools_and_rays_dashboard(wheel_venv: Path) -> None:
    """`pip install punchline` (and `make run`) carry what runs; the test tools, the docs site's and Ray's
    dashboard packages come with the extras `make test` installs (docs/install.md)."""
    requirements = _wheel_requirements(wheel_venv)
    runtime = {r.name.lower(): r for r in requirements if r.marker is None}
    test, docs, cluster = (_in_extra(requirements, e) for e in ("test", "docs", "cluster"))
    assert {"pytest", "mypy", "ruff", "moto", "playwright", "litellm", "datasets", "polars"} <= test.keys()
    assert {"mkdocs", "mkdocs-material"} <= docs.keys()
    assert not runtime.keys() & (test.keys() | docs.keys()), "a test or docs tool is a runtime requirement"
    assert runtime["ray"].extras == set(), "ray[default] (the dashboard's packages) is a runtime requirement"
    assert cluster["ray"].extras == {"default"} and cluster["ray"].specifier == runtime["ray"].specifier
    for needed in ("matplotlib", "pyarrow", "redis", "msgspec", "openai", "anthropic"):  # the demo's, the API's
        assert needed in runtime, needed


def _third_party_imports() -> dict[str, str]:
    """Every top-level module the package imports that is neither stdlib nor ours, with one file importing it
    (imports under ``if TYPE_CHECKING:`` are for the type checker only, not the user's install)."""
    found: dict[str, str] = {}
    for root, _dirs, files in os.walk(REPO / "punchline", followlinks=True):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = Path(root) / name
            tree = ast.parse(path.read_text())
            typing_only = {
                id(n)
                for node in ast.walk(tree)
                if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                for stmt in node.body
                for n in ast.walk(stmt)
            }
            for node in ast.walk(tree):
                if id(node) in typing_only:
                    continue
                if isinstance(node, ast.Import):
                    mods = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    mods = [node.module]
                else:
                    continue
                for mod in mods:
                    top = mod.partition(".")[0]
                    if top not in sys.stdlib_module_names and top != "punchline":
                        found.setdefault(top, str(path.relative_to(REPO)))
    return found


def test_every_third_party_import_is_a_declared_dependency() -> None:
    declared = {
        Requirement(r).name.lower().replace("_", "-")
        for r in metadata.requires("punchline") or []
        if "extra ==" not in r  # the test extra is not the user's install
    }
    providers = metadata.packages_distributions()
    undeclared = {
        mod: where
        for mod, where in _third_party_imports().items()
        if not {d.lower().replace("_", "-") for d in providers.get(mod, [mod])} & declared
    }
    assert not undeclared, f"imported but not declared in pyproject.toml's dependencies: {undeclared}"


def test_init_then_the_demo_and_the_prompts_demo_from_an_empty_folder_under_an_empty_home(
    wheel_venv: Path, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    folder = tmp_path / "work"
    folder.mkdir()
    env = _stranger_env(home)
    bin_ = wheel_venv / "bin"
    version = _run([str(bin_ / "punchline"), "--version"], cwd=folder, env=env, timeout=120)
    assert version.returncode == 0 and version.stdout.startswith("punchline "), version.stderr
    init = _run([str(bin_ / "punchline"), "init"], cwd=folder, env=env, timeout=120)
    assert init.returncode == 0, init.stderr
    assert "next: punchline run configs/demo.toml" in init.stdout
    for config in ("configs/demo.toml", "configs/prompts_demo.toml"):
        done = _run([str(bin_ / "punchline"), "run", config, "--no-progress"], cwd=folder, env=env, timeout=900)
        assert done.returncode == 0, f"{config}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
        assert "[info" not in done.stdout, f"{config}: a log line went to stdout: {done.stdout[:500]}"
    assert list((folder / "runs").glob("demo-*/artifacts/puns_ranked.json"))
    assert list((folder / "runs").glob("prompts-demo-*/artifacts/outputs.parquet"))
    assert not (home / ".ray").exists()
    again = _run([str(bin_ / "punchline"), "init"], cwd=folder, env=env, timeout=120)
    assert again.returncode == 0 and "kept  configs/demo.toml" in again.stdout  # a second init overwrites nothing
