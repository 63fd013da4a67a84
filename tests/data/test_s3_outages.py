"""S3 outages are waited out (data/stores/s3.py): connection errors and 5xx are retried with backoff
for a bounded time, through a TCP proxy in front of moto's server that can be switched off."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import botocore.exceptions
import msgspec
import pytest

from punchline.data.errors import ConfigError, StoreError
from punchline.data.stores.s3 import S3Settings, S3Store
from tests.fixtures.s3 import TcpProxy


def via(proxy: TcpProxy, settings: S3Settings, url: str, **knobs: Any) -> S3Store:
    quick = {"retry_initial_s": 0.05, "retry_max_s": 0.3, "max_attempts": 1, "connect_timeout_s": 2.0}
    quick.update(knobs)
    return S3Store.from_url(url, msgspec.structs.replace(settings, endpoint_url=proxy.url, **quick))


class InThread:
    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.result = fn()
        except BaseException as exc:
            self.error = exc

    def join(self) -> Any:
        self.thread.join(60)
        assert not self.thread.is_alive()
        if self.error:
            raise self.error
        return self.result


def wait_for(cond: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def test_every_operation_waits_for_s3_to_come_back(s3_proxy: TcpProxy, s3_settings: S3Settings, s3_url: str) -> None:
    store = via(s3_proxy, s3_settings, s3_url)
    store.put("before", b"old")
    s3_proxy.down()
    ops = {
        "put": InThread(lambda: store.put("paid/answer", b"an answer that cost money", if_absent=True)),
        "get": InThread(lambda: store.get("before")),
        "exists": InThread(lambda: store.exists("before")),
        "list": InThread(lambda: list(store.list(""))),
        "delete": InThread(lambda: store.delete("nothing-here")),
    }
    wait_for(lambda: s3_proxy.resets >= 2 * len(ops))  # every operation tried and was refused, twice
    assert all(op.thread.is_alive() for op in ops.values()), "an operation gave up during the outage"
    s3_proxy.up()
    assert ops["put"].join() is True
    assert ops["get"].join() == b"old"
    assert ops["exists"].join() is True
    assert "before" in ops["list"].join()
    ops["delete"].join()
    assert store.get("paid/answer") == b"an answer that cost money"


def test_an_outage_longer_than_the_bound_is_a_store_error(
    s3_proxy: TcpProxy, s3_settings: S3Settings, s3_url: str
) -> None:
    store = via(s3_proxy, s3_settings, s3_url, outage_s=0.5)
    s3_proxy.down()
    with pytest.raises(StoreError, match=r"PUNCHLINE_S3_OUTAGE_S=0\.5"):
        store.get("k")


def _client_error(status: int, code: str) -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError(
        {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject"
    )


def test_5xx_is_retried_and_access_denied_is_not(
    s3_settings: S3Settings, s3_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = msgspec.structs.replace(s3_settings, retry_initial_s=0.01, retry_max_s=0.05, max_attempts=1)
    store = S3Store.from_url(s3_url, fast)
    real_put: Callable[..., object] = store.client.put_object
    failures = [_client_error(503, "SlowDown"), _client_error(500, "InternalError")]
    calls: list[dict[str, object]] = []

    def put_object(**kwargs: object) -> object:
        calls.append(kwargs)
        if failures:
            raise failures.pop(0)
        return real_put(**kwargs)

    monkeypatch.setattr(store.client, "put_object", put_object)
    assert store.put("k", b"v", if_absent=True) is True
    assert len(calls) == 3 and store.get("k") == b"v"

    calls.clear()
    failures[:] = [_client_error(403, "AccessDenied")]
    with pytest.raises(StoreError, match="AccessDenied"):
        store.put("k2", b"v")
    assert len(calls) == 1


def test_outage_bound_from_the_environment() -> None:
    assert S3Settings.from_env({}).outage_s == 600.0
    assert S3Settings.from_env({"PUNCHLINE_S3_OUTAGE_S": "45"}).outage_s == 45.0
    for bad in ("soon", "-1"):
        with pytest.raises(ConfigError, match="PUNCHLINE_S3_OUTAGE_S"):
            S3Settings.from_env({"PUNCHLINE_S3_OUTAGE_S": bad})
