"""The figure cache (data/figures/figure_cache.py): a draw's files are kept by the digest of its name, its input, the
drawing code and the rendering libraries; the same digest copies them (byte for byte, checked), anything else
draws again, and a partial or damaged entry is drawn again rather than copied."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from punchline.data.figures.figure_cache import FIGURE_PREFIX, INDEX, FigureCache, code_digest
from punchline.data.stores.local import LocalStore


class Draws:
    """A draw that counts its calls and writes bytes that name its input and its call."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, inputs: bytes) -> dict[str, bytes]:
        self.calls += 1
        return {"a.png": b"png of " + inputs, "a.svg": b"svg of " + inputs}


def test_the_same_input_copies_the_files_a_new_input_draws(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    draw = Draws()
    cache = FigureCache(store, ["punchline.data"])
    first = cache.files("fig", b"x", lambda: draw(b"x"))
    assert first == {"a.png": b"png of x", "a.svg": b"svg of x"} and draw.calls == 1
    again = FigureCache(store, ["punchline.data"]).files("fig", b"x", lambda: draw(b"x"))  # a later run
    assert again == first and draw.calls == 1
    assert cache.files("fig", b"y", lambda: draw(b"y"))["a.png"] == b"png of y" and draw.calls == 2
    assert cache.files("other", b"x", lambda: draw(b"x")) == first and draw.calls == 3  # another draw's name
    assert all(k.startswith(FIGURE_PREFIX) for k in store.list(FIGURE_PREFIX))


def test_a_damaged_or_partial_entry_is_drawn_again(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    draw = Draws()
    cache = FigureCache(store, ["punchline.data"])
    cache.files("fig", b"x", lambda: draw(b"x"))
    prefix = f"{FIGURE_PREFIX}{cache.digest('fig', b'x')}/"
    store.put(prefix + "a.png", b"flipped bits")
    assert cache.files("fig", b"x", lambda: draw(b"x"))["a.png"] == b"png of x" and draw.calls == 2
    assert store.get(prefix + "a.png") == b"png of x"  # rewritten whole
    store.delete(prefix + INDEX)  # a draw that died before its index: not an entry
    assert cache.files("fig", b"x", lambda: draw(b"x"))["a.svg"] == b"svg of x" and draw.calls == 3


def test_the_digest_covers_the_drawing_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "figpkg_probe"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "draw.py").write_text("COLOR = 'blue'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = code_digest(["figpkg_probe"])
    assert "figpkg_probe.draw" not in sys.modules  # read, not imported
    (package / "draw.py").write_text("COLOR = 'red'\n")
    assert code_digest(["figpkg_probe"]) != before
    store = LocalStore(tmp_path / "store")
    assert FigureCache(store, ["figpkg_probe"]).digest("fig", b"x") != FigureCache(store, ["punchline.data"]).digest(
        "fig", b"x"
    )
