"""Store implementations, and the factory that picks one by URL (the interface in
``punchline.data.store`` never imports them)."""

from __future__ import annotations

from punchline.data.store import Store
from punchline.data.stores.local import LocalStore


def open_store(url: str) -> Store:
    """``s3://bucket/prefix`` gives the S3 backend; anything else is a local folder."""
    if url.startswith("s3://"):
        from punchline.data.stores.s3 import S3Settings, S3Store  # lazy: boto3 takes a second to import

        return S3Store.from_url(url, S3Settings.from_env())
    return LocalStore(url)
