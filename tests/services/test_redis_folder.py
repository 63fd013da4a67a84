"""A folder's running Redis server seen from outside, without a Redis client: the keeper's only view of it."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
from pathlib import Path

from punchline.schedulers.server.redis_client import connect
from punchline.schedulers.server.server_info import load_scripts_as, server_info, starting_server_id
from punchline.services.redis_folder import find_running, recorded_pid, serves_dir, stop_running
from punchline.services.redis_server import EmbeddedRedis

ROOT = Path(__file__).resolve().parents[2]


def test_server_info_reads_the_server_it_reaches(redis_server: EmbeddedRedis) -> None:
    info = server_info(redis_server.url)
    assert info is not None and int(info["process_id"]) == redis_server.pid
    assert info["run_id"] == connect(redis_server.url).info("server")["run_id"]


def test_server_info_is_none_for_a_wrong_password_a_dead_port_or_another_protocol(
    redis_server: EmbeddedRedis,
) -> None:
    assert server_info(redis_server.url.replace(redis_server.password, "not-the-password")) is None
    assert server_info(redis_server.url.split("@")[0].split(":")[0] + f"://127.0.0.1:{redis_server.port}/0") is None
    assert server_info("redis://127.0.0.1:1/0", timeout_s=0.5) is None
    assert server_info("http://127.0.0.1:1/") is None
    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    try:
        assert server_info(f"redis://:pw@127.0.0.1:{web.server_address[1]}/0", timeout_s=2) is None
    finally:
        web.shutdown()


def test_a_unix_socket_server_is_found_and_stopped(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path, unix_socket=True).start()
    pid = server.pid
    server.detach()  # as the runs folder's server: started by one process, stopped by another
    try:
        assert serves_dir(server.url, tmp_path)
        assert find_running(tmp_path) == server.url and recorded_pid(tmp_path) == pid
        assert stop_running(tmp_path, timeout_s=15)
        assert find_running(tmp_path) is None and not stop_running(tmp_path)
    finally:
        stop_running(tmp_path)


def test_the_keeper_imports_no_logging_stack() -> None:
    probe = "import sys, punchline.services.redis_keeper; print(sorted({'structlog', 'ray'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_start_asks_the_server_it_started_and_loads_scripts_only_as_a_user_that_may(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path).start()  # a ledger: its default user (the run's) may not load a script
    try:
        assert starting_server_id(server.url, server.pid or 0) == server_info(server.url)["run_id"]  # type: ignore[index]
        assert starting_server_id(server.url, (server.pid or 0) + 1) is None  # another process on the port
        assert starting_server_id(server.url.replace(server.password, "not-it"), server.pid or 0) is None
        assert load_scripts_as(server.url).startswith("NOPERM")  # the run's user
        assert load_scripts_as(server.url.replace(server.password, "not-it")).startswith("WRONGPASS")
        assert load_scripts_as("redis://127.0.0.1:1/0").startswith("ConnectionRefusedError")
    finally:
        server.stop()
