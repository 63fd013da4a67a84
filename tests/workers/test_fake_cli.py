"""``punchline fake-provider`` as a real foreground process: serves, counts, stops on Ctrl-C."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from punchline.workers.fake.server import fetch_stats

ROOT = Path(__file__).resolve().parents[2]


def test_fake_provider_command_serves_until_interrupted(tmp_path: Path) -> None:
    cfg = tmp_path / "fake.toml"
    cfg.write_text('status_for_model = { "bad-model" = 404 }\nseed = 5\n')
    proc = subprocess.Popen(
        [sys.executable, "-m", "punchline.cluster.cli.main", "fake-provider", "--port", "0", "--config", str(cfg)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("fake provider listening on http://127.0.0.1:")
        url = line.rsplit(" ", 1)[1].strip()
        assert fetch_stats(url).total_calls == 0
        import urllib.request

        with urllib.request.urlopen(f"{url}/config", timeout=5) as resp:
            assert b'"bad-model":404' in resp.read().replace(b" ", b"")
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert "stopped" in out


def test_bad_config_is_one_clear_error(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text("no_such_knob = 1\n")
    done = subprocess.run(
        [sys.executable, "-m", "punchline.cluster.cli.main", "fake-provider", "--config", str(cfg)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert "no_such_knob" in done.stderr and str(cfg) in done.stderr
