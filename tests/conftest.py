"""Shared fixtures: each real service (Redis, moto's S3 server, the fake provider, Ray) is started
once per session by its own module under ``tests/fixtures``."""

from pathlib import Path

import pytest

pytest_plugins = [
    "tests.fixtures.redis",
    "tests.fixtures.s3",
    "tests.fixtures.provider",
    "tests.fixtures.ray",
]

SHARED_PUNS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "puns"
SHARED_HUMOR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "humor"


@pytest.fixture(scope="session")
def shared_puns() -> Path:
    """The upstream Puns files; CI has ``../shared`` beside the checkout, so a missing folder is a failure."""
    assert SHARED_PUNS.is_dir(), f"{SHARED_PUNS} is missing: tests need ../shared beside the checkout"
    return SHARED_PUNS


@pytest.fixture(scope="session")
def shared_humor() -> Path:
    assert SHARED_HUMOR.is_dir(), f"{SHARED_HUMOR} is missing: tests need ../shared beside the checkout"
    return SHARED_HUMOR
