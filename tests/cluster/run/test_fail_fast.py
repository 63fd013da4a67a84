"""Permanent errors fail fast: a wrong password or key, a certificate that does not verify, an unknown
host or a missing bucket stop the run with exit 2 and one line naming the service and the setting,
before anything starts (no Ray, no ledger, nothing written). Only refused connections and timeouts
are waited out.

Every test here is capped at 15 s (the ``timeout`` marker): waiting out a mistake would blow it.
"""

from __future__ import annotations

import contextlib
import http.server
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from punchline.cluster.cli.main import main
from punchline.cluster.run.preflight import check_provider, check_redis, store_failure
from punchline.data.errors import LedgerUnavailable, ServiceRejected
from punchline.services.redis_server import EmbeddedRedis, free_port
from punchline.workers.fake.server import FakeProviderServer

# a hang guard, not a speed test: generous, so a loaded machine (the suite beside busy processes) passes
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A TLS listener on 127.0.0.1 with a self-signed certificate nobody trusts: the port."""
    folder = tmp_path_factory.mktemp("tls")
    key, cert = folder / "key.pem", folder / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with contextlib.suppress(OSError, ssl.SSLError), context.wrap_socket(conn, server_side=True) as tls:
                tls.recv(1024)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        listener.close()


def _run(cfg: Path, tmp: Path, *extra: str) -> list[str]:
    return ["run", str(cfg), "--runs-dir", str(tmp / "runs"), "--no-progress", *extra]


def _one_line(capsys: pytest.CaptureFixture[str], code: int) -> str:
    _, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _nothing_started(tmp: Path) -> None:
    assert not (tmp / "runs").exists(), "the run wrote something before refusing"


def test_a_wrong_redis_password_exits_2_at_once(
    tmp_path: Path, make_config, fake: FakeProviderServer, redis_server: EmbeddedRedis, capsys
) -> None:
    wrong = redis_server.url.replace(redis_server.password, "not-the-password-x9")
    line = _one_line(capsys, main(_run(make_config(), tmp_path, "--redis-url", wrong)))
    assert "Redis" in line and "password" in line and "PUNCHLINE_REDIS_URL" in line, line
    assert "not-the-password-x9" not in line and redis_server.password not in line
    assert ":***@" in line  # the URL is shown, its password never
    _nothing_started(tmp_path)


def test_a_redis_certificate_that_does_not_verify_exits_2(
    tmp_path: Path, make_config, fake: FakeProviderServer, tls_server: int, capsys
) -> None:
    url = f"rediss://:pw-secret-123@127.0.0.1:{tls_server}/0"
    line = _one_line(capsys, main(_run(make_config(), tmp_path, "--redis-url", url)))
    assert "certificate" in line and "ssl_ca_certs" in line, line
    assert "pw-secret-123" not in line
    _nothing_started(tmp_path)


def test_an_unknown_redis_host_exits_2(tmp_path: Path, make_config, fake: FakeProviderServer, capsys) -> None:
    line = _one_line(capsys, main(_run(make_config(), tmp_path, "--redis-url", "redis://no-such-host.invalid:6379/0")))
    assert "unknown host" in line and "Redis" in line, line
    _nothing_started(tmp_path)


def test_a_refused_connection_is_waited_out_then_refused() -> None:
    """Nothing listening at the start is waited for (PUNCHLINE_START_WAIT_S, 60 s by default), then it is
    a setting to fix, not an outage to wait out for ten minutes."""
    started = time.monotonic()
    with pytest.raises(ServiceRejected, match="nothing answers there \\(waited 1 s"):
        check_redis(f"redis://127.0.0.1:{free_port()}/0", patience_s=1.0)
    assert time.monotonic() - started < 10


# --- permanent errors that used to be waited out (issue 21) ---------------------------------------------


def _wait_1s(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PUNCHLINE_START_WAIT_S", "1")


def test_a_provider_path_that_answers_404_exits_2_without_a_call(
    tmp_path: Path, make_config, fake: FakeProviderServer, capsys
) -> None:
    """The exact endpoint the units call is checked (a request without a model: refused for free)."""
    cfg = make_config()
    cfg.write_text(cfg.read_text().replace(fake.openai_base_url, fake.openai_base_url + "/wrong", 1))
    before = fake.stats().total_calls
    line = _one_line(capsys, main(_run(cfg, tmp_path)))
    assert "HTTP 404" in line and "/chat/completions" in line and "base_url" in line and "providers.sim" in line, line
    assert fake.stats().total_calls == before  # nothing was paid for
    _nothing_started(tmp_path)


def test_the_endpoint_check_is_free_on_a_good_provider(fake: FakeProviderServer) -> None:
    from punchline.cluster.run.preflight import check_provider
    from punchline.data.provider_settings import ProviderSettings

    before = fake.stats().total_calls
    for kind, url in (("openai", fake.openai_base_url), ("anthropic", fake.anthropic_base_url)):
        assert check_provider("p", ProviderSettings(kind=kind, base_url=url), key_required=False) == "ok"
    assert fake.stats().total_calls == before


def test_a_provider_port_where_nothing_listens_exits_2_after_the_start_wait(
    tmp_path: Path, make_config, fake: FakeProviderServer, monkeypatch, capsys
) -> None:
    _wait_1s(monkeypatch)
    cfg = make_config()
    cfg.write_text(cfg.read_text().replace(fake.openai_base_url, f"http://127.0.0.1:{free_port()}/v1", 1))
    line = _one_line(capsys, main(_run(cfg, tmp_path)))
    assert "nothing answers there (waited 1 s" in line and "providers.sim" in line and "base_url" in line, line
    _nothing_started(tmp_path)


def _plain_as_tls(url: str) -> str:
    return url.replace("redis://", "rediss://", 1) + "?ssl_cert_reqs=none"


@pytest.mark.parametrize("case", ["tls-to-plain", "http-server", "missing-unix-socket", "nothing-listens"])
def test_a_redis_url_that_cannot_work_exits_2(
    tmp_path: Path, make_config, fake: FakeProviderServer, redis_url: str, monkeypatch, capsys, case: str
) -> None:
    _wait_1s(monkeypatch)
    url = {
        "tls-to-plain": _plain_as_tls(redis_url),
        "http-server": fake.url.replace("http://", "redis://") + "/0",
        "missing-unix-socket": f"unix://{tmp_path}/no-such.sock",
        "nothing-listens": f"redis://127.0.0.1:{free_port()}/0",
    }[case]
    started = time.monotonic()
    line = _one_line(capsys, main(_run(make_config(), tmp_path, "--redis-url", url)))
    assert time.monotonic() - started < 12
    assert "Redis at" in line and "--redis-url" in line, line
    assert urlsplit(redis_url).password not in line
    _nothing_started(tmp_path)


@pytest.mark.parametrize("case", ["loopback port", "localhost port", "missing unix socket", "stale unix socket"])
def test_nothing_listening_on_this_machine_is_final_in_seconds(
    tmp_path: Path, make_config, fake: FakeProviderServer, monkeypatch, capsys, case: str
) -> None:
    """Issue 34: a wrong port or socket on this machine is a mistake, not a service starting: with the default
    start wait (60 s) it is refused after a short grace, in one line that says why, not after the wait."""
    monkeypatch.delenv("PUNCHLINE_START_WAIT_S", raising=False)
    stale = tmp_path / "stale.sock"
    if case == "stale unix socket":  # a socket file left by a server that died: nobody listens on it
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(stale))
        sock.close()
    url = {
        "loopback port": f"redis://:pw-secret-123@127.0.0.1:{free_port()}/0",
        "localhost port": f"redis://localhost:{free_port()}/0",
        "missing unix socket": f"unix://{tmp_path}/no-such.sock",
        "stale unix socket": f"unix://{stale}",
    }[case]
    line = _one_line(capsys, main(_run(make_config(), tmp_path, "--redis-url", url)))
    expect = {
        "loopback port": "connection refused at 127.0.0.1",
        "localhost port": "connection refused at localhost",
        "missing unix socket": "no unix socket at",
        "stale unix socket": "nothing listens on the unix socket",
    }
    assert expect[case] in line and "--redis-url" in line and "waited" not in line, line
    assert "pw-secret-123" not in line
    _nothing_started(tmp_path)


def test_a_provider_that_rejects_the_key_exits_2_before_any_call(
    tmp_path: Path, make_config, fake: FakeProviderServer, monkeypatch, capsys
) -> None:
    fake.configure(require_api_key="sk-the-right-key-0123456789")
    monkeypatch.setenv("PUNCHLINE_TEST_PROVIDER_KEY", "sk-a-wrong-key-9876543210")
    cfg = make_config()
    cfg.write_text(
        cfg.read_text().replace('kind = "openai"\n', 'kind = "openai"\napi_key_env = "PUNCHLINE_TEST_PROVIDER_KEY"\n')
    )
    line = _one_line(capsys, main(_run(cfg, tmp_path)))
    assert "providers.sim" in line and "401" in line and "PUNCHLINE_TEST_PROVIDER_KEY" in line, line
    assert "wrong-key" not in line and "right-key" not in line
    stats = fake.stats()
    assert stats.models_calls >= 1 and stats.total_calls == 0  # checked with a free request, nothing paid
    _nothing_started(tmp_path)


def test_a_provider_key_missing_exits_2(tmp_path: Path, make_config, fake: FakeProviderServer, capsys) -> None:
    cfg = make_config()
    cfg.write_text(cfg.read_text().replace('kind = "openai"\n', 'kind = "openai"\napi_key_env = "PUNCHLINE_UNSET_X"\n'))
    line = _one_line(capsys, main(_run(cfg, tmp_path)))
    assert "PUNCHLINE_UNSET_X is not set" in line and "providers.sim" in line, line
    assert fake.stats().total_calls == 0
    _nothing_started(tmp_path)


@pytest.mark.parametrize(
    ("base_url", "expect"),
    [("http://no-such-host.invalid/v1", "unknown host"), ("https://127.0.0.1:{tls}/v1", "certificate")],
)
def test_a_provider_host_that_cannot_work_exits_2(
    tmp_path: Path, make_config, fake: FakeProviderServer, tls_server: int, capsys, base_url: str, expect: str
) -> None:
    cfg = make_config()
    cfg.write_text(cfg.read_text().replace(fake.openai_base_url, base_url.format(tls=tls_server), 1))
    line = _one_line(capsys, main(_run(cfg, tmp_path)))
    assert expect in line and "providers.sim" in line and "base_url" in line, line
    _nothing_started(tmp_path)


def test_a_missing_bucket_exits_2(tmp_path: Path, make_config, fake: FakeProviderServer, s3_settings, capsys) -> None:
    line = _one_line(capsys, main(_run(make_config(), tmp_path, "--store", "s3://no-such-bucket-punchline/p")))
    assert "no such bucket" in line and "--store" in line, line
    _nothing_started(tmp_path)


def test_an_unknown_s3_endpoint_exits_2(
    tmp_path: Path, make_config, fake: FakeProviderServer, s3_settings, monkeypatch, capsys
) -> None:
    monkeypatch.setenv("PUNCHLINE_S3_ENDPOINT_URL", "http://no-such-host.invalid:9000")
    line = _one_line(capsys, main(_run(make_config(), tmp_path, "--store", "s3://punchline-test/p")))
    assert "unknown host" in line and "PUNCHLINE_S3_ENDPOINT_URL" in line, line
    _nothing_started(tmp_path)


@pytest.mark.parametrize(
    ("code", "status", "setting"),
    [
        ("InvalidAccessKeyId", 403, "AWS_ACCESS_KEY_ID"),
        ("SignatureDoesNotMatch", 403, "AWS_SECRET_ACCESS_KEY"),
        ("AccessDenied", 403, "AWS_ACCESS_KEY_ID"),
        ("ExpiredToken", 400, "AWS_SESSION_TOKEN"),
        ("SomethingNew", 401, "AWS_ACCESS_KEY_ID"),
    ],
)
def test_s3_credential_errors_name_the_setting(code: str, status: int, setting: str) -> None:
    import botocore.exceptions

    from punchline.data.errors import StoreError

    error = botocore.exceptions.ClientError(
        {"Error": {"Code": code, "Message": "x"}, "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject"
    )
    try:
        raise StoreError("store: cannot read") from error
    except StoreError as exc:
        reason = store_failure(exc)
    assert reason is not None and setting in reason


def test_s3_outages_are_not_permanent() -> None:
    import botocore.exceptions

    error = botocore.exceptions.ClientError(
        {"Error": {"Code": "SlowDown"}, "ResponseMetadata": {"HTTPStatusCode": 503}}, "GetObject"
    )
    assert store_failure(error) is None
    assert store_failure(ConnectionRefusedError(111, "Connection refused")) is None


def test_service_rejected_is_a_config_error() -> None:
    """The CLI's exit 2 path: ServiceRejected is a ConfigError, never a LedgerUnavailable (waited out)."""
    from punchline.data.errors import ConfigError

    assert issubclass(ServiceRejected, ConfigError) and not issubclass(ServiceRejected, LedgerUnavailable)


@contextlib.contextmanager
def _serving(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """A loopback HTTP server with this handler, for as long as the block runs; its base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def answers_400() -> Iterator[str]:
    """An HTTP server that answers 400 to everything (not an API): its base URL."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def _bad(self) -> None:
            self.send_response(400)
            self.send_header("Content-Length", "11")
            self.end_headers()
            self.wfile.write(b"bad request")

        do_GET = do_POST = _bad

        def log_message(self, *args: object) -> None:
            pass

    with _serving(Handler) as base:
        yield f"{base}/v1"


def test_an_address_that_answers_400_to_everything_exits_2(
    tmp_path: Path, make_config, fake: FakeProviderServer, answers_400: str, capsys
) -> None:
    cfg = make_config()
    cfg.write_text(cfg.read_text().replace(fake.openai_base_url, answers_400, 1))
    line = _one_line(capsys, main(_run(cfg, tmp_path)))
    assert "HTTP 400" in line and "providers.sim" in line and "base_url" in line, line
    _nothing_started(tmp_path)


# --- provider checks over plain HTTP, several at once (issue 20 item 2) ---------------------------------


def test_the_provider_check_loads_no_sdk(fake: FakeProviderServer) -> None:
    """Both kinds are checked without importing their SDK (seconds each before the first call)."""
    script = (
        "import sys\n"
        "from punchline.cluster.run.preflight import check_providers\n"
        "from punchline.data.provider_settings import ProviderSettings\n"
        f"ps = {{'o': ProviderSettings(kind='openai', base_url={fake.openai_base_url!r}),\n"
        f"      'a': ProviderSettings(kind='anthropic', base_url={fake.anthropic_base_url!r})}}\n"
        "print(check_providers(ps, key_required=False))\n"
        "print(sorted(m for m in ('openai', 'anthropic') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=100, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["{'o': 'ok', 'a': 'ok'}", "[]"], done.stdout
    assert fake.stats().models_calls == 2 and fake.stats().total_calls == 0


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_the_provider_check_sends_the_key_as_the_sdk_does(
    fake: FakeProviderServer, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """Bearer for OpenAI-compatible APIs, ``x-api-key`` for Anthropic: the right key passes, a wrong one
    is the one-line 401 naming where the key comes from, never the key."""
    from punchline.data.provider_settings import ProviderSettings

    fake.configure(require_api_key="sk-the-right-key-0123456789")
    url = fake.openai_base_url if kind == "openai" else fake.anthropic_base_url
    settings = ProviderSettings(kind=kind, base_url=url, api_key_env="PUNCHLINE_TEST_PROVIDER_KEY")
    monkeypatch.setenv("PUNCHLINE_TEST_PROVIDER_KEY", "sk-the-right-key-0123456789")
    assert check_provider("p", settings, key_required=True) == "ok"
    monkeypatch.setenv("PUNCHLINE_TEST_PROVIDER_KEY", "sk-a-wrong-key-9876543210")
    with pytest.raises(ServiceRejected) as caught:
        check_provider("p", settings, key_required=True)
    line = str(caught.value)
    assert "refused the API key (HTTP 401)" in line and "PUNCHLINE_TEST_PROVIDER_KEY" in line, line
    assert "wrong-key" not in line and "right-key" not in line
    assert fake.stats().total_calls == 0


def test_the_default_base_url_is_the_sdks(monkeypatch: pytest.MonkeyPatch) -> None:
    from punchline.cluster.run.preflight import base_url
    from punchline.data.provider_settings import ProviderSettings

    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:1/anthropic")
    assert base_url(ProviderSettings(kind="openai")) == "https://api.openai.com/v1"
    assert base_url(ProviderSettings(kind="anthropic")) == "http://127.0.0.1:1/anthropic"
    assert base_url(ProviderSettings(kind="anthropic", base_url="http://h/x")) == "http://h/x"


@pytest.fixture
def rendezvous() -> Iterator[str]:
    """An OpenAI-like server whose GET models answers only once two of them are waiting at the same time
    (a sequential checker would wait alone and get 503): its base URL. Path ``/bad/...`` answers 401."""

    barrier = threading.Barrier(2, timeout=30)

    class Handler(http.server.BaseHTTPRequestHandler):
        def _send(self, status: int) -> None:
            body = b'{"object": "list", "data": []}'
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            try:
                barrier.wait()
            except threading.BrokenBarrierError:
                self._send(503)
                return
            self._send(401 if self.path.startswith("/bad/") else 200)

        def do_POST(self) -> None:
            self._send(400)

        def log_message(self, *args: object) -> None:
            pass

    with _serving(Handler) as base:
        yield base


def test_providers_are_checked_at_once(rendezvous: str) -> None:
    from punchline.cluster.run.preflight import check_providers
    from punchline.data.provider_settings import ProviderSettings

    providers = {"a": ProviderSettings(base_url=f"{rendezvous}/a"), "b": ProviderSettings(base_url=f"{rendezvous}/b")}
    assert check_providers(providers, key_required=False) == {"a": "ok", "b": "ok"}


def test_of_several_providers_the_first_failure_in_config_order_is_the_line(rendezvous: str) -> None:
    from punchline.cluster.run.preflight import check_providers
    from punchline.data.provider_settings import ProviderSettings

    providers = {"a": ProviderSettings(base_url=f"{rendezvous}/bad"), "b": ProviderSettings(base_url=f"{rendezvous}/b")}
    with pytest.raises(ServiceRejected, match=r"provider a .*HTTP 401"):
        check_providers(providers, key_required=False)


@pytest.mark.parametrize("key", ["sk-first-line\nsk-second-line", "sk-caf\u00e9-0123456789"])
def test_a_key_no_header_can_carry_is_one_line(
    fake: FakeProviderServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, key: str
) -> None:
    """Refused at once, naming where the key comes from (never the key), instead of waiting for an answer."""
    from punchline.data.provider_settings import ProviderSettings

    key_file = tmp_path / "key"
    key_file.write_text(key)
    settings = ProviderSettings(base_url=fake.openai_base_url, api_key_file=str(key_file))
    with pytest.raises(ServiceRejected, match="no HTTP header can carry") as caught:
        check_provider("p", settings, key_required=True, wait_s=30.0)
    assert str(key_file) in str(caught.value) and "sk-" not in str(caught.value)
    assert fake.stats().models_calls == 0
