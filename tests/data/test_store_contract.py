"""One contract, two backends: a local folder and S3 (moto over HTTP) must behave identically."""

from __future__ import annotations

import pickle
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from punchline.data.errors import InputError, StoreError
from punchline.data.store import Store
from punchline.data.stores import open_store
from punchline.data.stores.local import LocalStore
from punchline.data.stores.s3 import S3Settings, S3Store


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "local":
        return open_store(str(tmp_path / "store"))
    url = request.getfixturevalue("s3_url")
    return open_store(url)  # from_env: endpoint and fake credentials come from the s3 fixtures


class TestStoreContract:
    def test_backend_types(self, store: Store) -> None:
        assert isinstance(store, (LocalStore, S3Store))
        assert store.url

    def test_round_trip_and_overwrite(self, store: Store) -> None:
        assert store.get("shards/0001.json") is None
        assert store.exists("shards/0001.json") is False
        assert store.put("shards/0001.json", b'{"a": 1}') is True
        assert store.get("shards/0001.json") == b'{"a": 1}'
        assert store.exists("shards/0001.json") is True
        assert store.put("shards/0001.json", b'{"a": 2}') is True
        assert store.get("shards/0001.json") == b'{"a": 2}'

    def test_if_absent_second_writer_loses(self, store: Store) -> None:
        assert store.put("commit/u1", b"first", if_absent=True) is True
        assert store.put("commit/u1", b"second", if_absent=True) is False
        assert store.get("commit/u1") == b"first"

    def test_concurrent_if_absent_exactly_one_winner(self, store: Store) -> None:
        for round_ in range(3):
            key = f"race/unit-{round_}"
            results = _race(store, key, writers=8)
            winners = [i for i, won in results.items() if won]
            assert len(results) == 8 and len(winners) == 1, results
            assert store.get(key) == f"writer-{winners[0]}".encode() * 100

    def test_list_sorted_with_prefix(self, store: Store) -> None:
        for key in ["b/2", "a/10", "a/2", "a/1", "ab/x", "c"]:
            store.put(key, key.encode())
        assert list(store.list()) == ["a/1", "a/10", "a/2", "ab/x", "b/2", "c"]
        assert list(store.list("a/")) == ["a/1", "a/10", "a/2"]
        assert list(store.list("a/1")) == ["a/1", "a/10"]
        assert list(store.list("nothing/")) == []

    def test_delete(self, store: Store) -> None:
        store.put("x/y", b"1")
        store.delete("x/y")
        assert store.get("x/y") is None
        assert store.exists("x/y") is False
        assert list(store.list("x/")) == []
        store.delete("x/y")  # absent is fine
        assert store.put("x/y", b"again", if_absent=True) is True

    @pytest.mark.parametrize("key", ["", "/abs", "a/../b", "..", "a//b", "./a", "a/", "a\\b", "a\x00b", ".tmp/x"])
    def test_invalid_keys_rejected(self, store: Store, key: str) -> None:
        with pytest.raises(InputError):
            store.put(key, b"x")
        with pytest.raises(InputError):
            store.get(key)

    def test_put_chunks_writes_their_concatenation(self, store: Store) -> None:
        chunks = [b"{", b'"a": 1', b"", b"}"] + [bytes([i % 256]) * 1000 for i in range(50)]
        store.put("art/big.json", b"old")
        store.put_chunks("art/big.json", iter(chunks))
        assert store.get("art/big.json") == b"".join(chunks)
        assert list(store.list("art/")) == ["art/big.json"]

    def test_get_chunks_reads_the_value_in_pieces(self, store: Store) -> None:
        data = bytes(range(256)) * 9000  # 2.3 MB: more than one piece of the local store's
        store.put("art/big.bin", data)
        pieces = store.get_chunks("art/big.bin")
        assert pieces is not None
        assert b"".join(pieces) == data
        assert store.get_chunks("art/none.bin") is None

    def test_binary_data(self, store: Store) -> None:
        blob = bytes(range(256)) * 1000 + b"\x00\xff"
        store.put("bin/blob", blob)
        assert store.get("bin/blob") == blob
        store.put("bin/empty", b"")
        assert store.get("bin/empty") == b""
        assert store.exists("bin/empty")

    def test_unicode_key(self, store: Store) -> None:
        store.put("puns/café-ü.json", b"1")
        assert list(store.list("puns/")) == ["puns/café-ü.json"]

    def test_pickles_for_ray(self, store: Store) -> None:
        store.put("p", b"v")
        clone = pickle.loads(pickle.dumps(store))
        assert type(clone) is type(store) and clone.url == store.url
        assert clone.get("p") == b"v"


def _race(store: Store, key: str, *, writers: int) -> dict[int, bool]:
    """``writers`` threads released together, each trying ``put(if_absent=True)`` on ``key``."""
    barrier = threading.Barrier(writers)
    results: dict[int, bool] = {}
    errors: list[BaseException] = []

    def writer(i: int) -> None:
        try:
            barrier.wait()
            results[i] = store.put(key, f"writer-{i}".encode() * 100, if_absent=True)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    return results


def test_local_store_leaves_no_temp_files(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.put("a/b", b"1")
    store.put("a/b", b"2", if_absent=True)
    assert list((tmp_path / ".tmp").iterdir()) == []
    assert list(store.list()) == ["a/b"]


@pytest.mark.slow  # Ray or several processes: not in `make test-fast`
def test_local_if_absent_across_processes(tmp_path: Path) -> None:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    with ctx.Pool(4) as pool:
        results = pool.starmap(_put_once, [(str(tmp_path), i) for i in range(8)])
    assert sum(results) == 1
    winner = results.index(True)
    assert LocalStore(tmp_path).get("k") == f"w{winner}".encode()


def _put_once(root: str, i: int) -> bool:
    return LocalStore(root).put("k", f"w{i}".encode(), if_absent=True)


def test_local_key_folder_collision_is_store_error(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.put("a", b"file")
    with pytest.raises(StoreError):
        store.put("a/b", b"x")


def test_s3_settings_from_env_and_repr_has_no_secret() -> None:
    env = {
        "AWS_ENDPOINT_URL": "http://minio:9000",
        "AWS_DEFAULT_REGION": "eu-west-1",
        "AWS_SECRET_ACCESS_KEY": "very-secret-value",
    }
    settings = S3Settings.from_env(env)
    assert settings.endpoint_url == "http://minio:9000" and settings.region == "eu-west-1"
    assert "very-secret-value" not in repr(settings)
    env["PUNCHLINE_S3_ENDPOINT_URL"] = "http://other:9000"
    assert S3Settings.from_env(env).endpoint_url == "http://other:9000"


def test_s3_missing_bucket_is_store_error(s3_settings: S3Settings) -> None:
    store = S3Store.from_url("s3://no-such-bucket-here/x", s3_settings)
    with pytest.raises(StoreError):
        store.put("k", b"v")


def test_s3_server_without_conditional_puts_falls_back(
    s3_url: str, s3_settings: S3Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server answering 501 to If-None-Match: the store switches to HEAD-then-PUT."""
    import botocore.exceptions

    store = S3Store.from_url(s3_url, s3_settings)
    real_put: Callable[..., object] = store.client.put_object
    calls: list[dict[str, object]] = []

    def put_object(**kwargs: object) -> object:
        calls.append(kwargs)
        if "IfNoneMatch" in kwargs:
            raise botocore.exceptions.ClientError(
                {"Error": {"Code": "NotImplemented", "Message": "no"}, "ResponseMetadata": {"HTTPStatusCode": 501}},
                "PutObject",
            )
        return real_put(**kwargs)

    monkeypatch.setattr(store.client, "put_object", put_object)
    assert store.put("k", b"one", if_absent=True) is True
    assert store.put("k", b"two", if_absent=True) is False
    assert store.get("k") == b"one"
    assert sum("IfNoneMatch" in c for c in calls) == 1  # remembered: asked only once


def test_local_folders_removed_behind_the_stores_back_are_made_again(tmp_path: Path) -> None:
    """A store remembers the folders it made (no mkdir per write) and makes them again once they are gone."""
    store = LocalStore(tmp_path / "root")
    assert store.put("a/b/k1", b"one")
    shutil.rmtree(tmp_path / "root")
    assert store.put("a/b/k2", b"two", if_absent=True)
    assert store.get("a/b/k2") == b"two" and store.get("a/b/k1") is None


def test_local_put_chunks_streams_many_small_and_large_chunks(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    chunks = [f"line {i}\n".encode() for i in range(200_000)] + [b"x" * (3 << 20)] + [b"tail"]
    store.put_chunks("big", chunks)
    assert store.get("big") == b"".join(chunks)
