"""The runtime carries plain ``ray``; what needs Ray's dashboard, job SDK or client says, in one line and exit 2, that
it needs the ``cluster`` extra (data/extras.py), and a local head starts without it.

The suite's venv has the extra (``make test`` installs it). A Python without it is this one with the extra's
modules made unimportable in a child process (``sys.modules[name] = None``: an import fails as for a package
never installed, and ``importlib.util.find_spec`` finds nothing), which then runs the real command.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from punchline.data.extras import CLUSTER_EXTRA, CLUSTER_MODULES, missing_cluster_modules

REPO = Path(__file__).resolve().parents[2]

WITHOUT_EXTRA = f"""
import sys
for name in {CLUSTER_MODULES!r}:
    sys.modules[name] = None  # as `pip install punchline` leaves this Python: no cluster extra
"""

CLI = "from punchline.cluster.cli.main import entry\nsys.argv[0] = 'punchline'\nentry()\n"


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PUNCHLINE_", "RAY_"))}
    env["HOME"] = str(home)
    return env


def _without_extra(code: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    home = cwd / "home"
    home.mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRA + code, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=_env(home),
        timeout=300,
    )


def _one_line_naming_the_extra(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr and f"pip install '{CLUSTER_EXTRA}'" in lines[0], lines[0]
    return lines[0]


def test_the_suites_venv_has_the_cluster_extra() -> None:
    assert missing_cluster_modules() == []


def test_job_commands_without_the_extra_name_it(tmp_path: Path) -> None:
    done = _without_extra(CLI, "jobs", "--address", "http://127.0.0.1:9", cwd=tmp_path)
    assert "job SDK" in _one_line_naming_the_extra(done)


def test_a_ray_client_address_without_the_extra_names_it_before_the_run_starts(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    config = str(REPO / "configs" / "demo.toml")
    done = _without_extra(
        CLI, "run", config, "--no-progress", "--runs-dir", str(runs), "--ray-address", "ray://127.0.0.1:9", cwd=tmp_path
    )
    line = _one_line_naming_the_extra(done)
    assert "ray://" in line and "--ray-address" in line
    assert not list(runs.glob("demo-*")), "a run started"


def test_the_local_heads_dashboard_without_the_extra_names_it(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    config = str(REPO / "configs" / "demo.toml")
    done = _without_extra(CLI, "run", config, "--no-progress", "--runs-dir", str(runs), "--ray-dashboard", cwd=tmp_path)
    line = _one_line_naming_the_extra(done)
    assert "--ray-dashboard" in line and "dashboard" in line
    assert not list(runs.glob("demo-*/stages/*")), "a stage started"


HEAD_COMMAND = """
from punchline.services.ray_keeper import head_command
from punchline.services.ray_settings import RaySettings
print(any(a.startswith('--ray-client-server-port=') for a in head_command(RaySettings(), '/tmp/x')))
"""


def test_the_local_head_asks_for_a_client_server_only_with_ray_client_installed(tmp_path: Path) -> None:
    # Ray refuses `ray start --ray-client-server-port` without grpc, and starts no client server then
    without = _without_extra(HEAD_COMMAND, cwd=tmp_path)
    assert without.returncode == 0 and without.stdout.strip() == "False", without.stderr
    with_it = subprocess.run([sys.executable, "-c", HEAD_COMMAND], capture_output=True, text=True, timeout=120)
    assert with_it.returncode == 0 and with_it.stdout.strip() == "True", with_it.stderr
