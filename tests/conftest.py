"""Shared fixtures: each real service (Redis, moto's S3 server, the fake provider, Ray) is started
once per session by its own module under ``tests/fixtures``."""

import importlib.abc
import signal
import sys
from pathlib import Path

import pytest

pytest_plugins = [
    "tests.fixtures.redis",
    "tests.fixtures.valkey_cluster",
    "tests.fixtures.s3",
    "tests.fixtures.provider",
    "tests.fixtures.ray",
    "tests.fixtures.engine",
]


class _NoTopLevelLayers(importlib.abc.MetaPathFinder):
    """The checkout is on ``sys.path`` under pytest, so ``import data`` would quietly load a second copy
    of a layer; the installed package has no such module, so any code that tries fails here as it would
    for a user."""

    LAYERS = frozenset({"cluster", "workers", "schedulers", "data", "pipelines", "services", "viewer"})

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> None:
        if fullname.partition(".")[0] in self.LAYERS:
            raise ModuleNotFoundError(f"No module named {fullname!r} (the layers are punchline.{fullname})")
        return None


sys.meta_path.insert(0, _NoTopLevelLayers())

# A suite started in the background by a non-interactive shell (``make test &``, ``nohup``) inherits SIGINT
# and SIGQUIT ignored, and so would every process a test starts: the tests that stop a driver or the fake
# provider with SIGINT (Ctrl-C) would then wait for nothing. The tests are that terminal's Ctrl-C, so they
# get the defaults back (the processes they start inherit them).
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGQUIT, signal.SIG_DFL)

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
