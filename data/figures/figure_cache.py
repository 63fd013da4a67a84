"""Figures drawn once, by what they were drawn from: a rerun on the same data copies them instead of drawing.

Why: a reduce that draws figures spends seconds in matplotlib (a second and more to import it, then 0.1-0.3 s a
figure and format on the 2-core machine): the demo's rank and evaluate reduces were 2.4 s of a fully cached rerun
that took 6.3 s, its answers all in the response cache and its figures the same bytes as the run before's. The
figures are deterministic (plots.py: no dates, no versions, a fixed SVG salt), so the bytes a draw wrote for an
input are the bytes it writes again for that input, with the same code and the same libraries.

So the files a draw writes are kept in the store, under ``_cache/figures/<digest>/``, beside the response cache
(shared by the runs of the store, like it), where the digest covers everything the bytes depend on:

* the draw's name and its input (the caller's encoding of the data the files are drawn from);
* the source of the code that draws them: every module of the packages named (all of them, not only the ones a
  figure imports today: a change anywhere there draws again, never an old figure for new code);
* the versions of the libraries that render them (matplotlib, numpy, Pillow, fontTools) and of Python.

Each run still gets every file into its own folder (the caller writes them as its artifacts); only the drawing
is skipped. An entry is complete once its ``files.json`` is written (last): it lists each file with the SHA-256 of
its bytes, checked on every read, so a partial or damaged entry is drawn again (and rewritten), never copied.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import msgspec

from punchline.data.storage.response_cache import CACHE_PREFIX
from punchline.data.store import Store

FIGURE_PREFIX = f"{CACHE_PREFIX}figures/"  # beside the response cache's packs (one place spells ``_cache/``)
INDEX = "files.json"
FORMAT = b"punchline figure cache 1"
LIBRARIES = ("matplotlib", "numpy", "pillow", "fonttools")  # what turns a figure into bytes


class FigureFiles(msgspec.Struct, kw_only=True):
    """An entry's index: each file's name and the SHA-256 of its bytes."""

    sha256: dict[str, str]


def code_digest(packages: Iterable[str]) -> str:
    """The SHA-256 of the source of every module of ``packages`` (their own ``.py`` files, not their
    sub-packages'), found without importing them (a drawing module imports matplotlib at its top)."""
    h = hashlib.sha256()
    for package in packages:
        spec = importlib.util.find_spec(package)
        locations = spec.submodule_search_locations if spec is not None else None
        if not locations:
            raise ValueError(f"{package} is not a package")
        for path in sorted(p for loc in locations for p in Path(loc).glob("*.py")):
            h.update(f"{package}/{path.name}\0".encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def libraries() -> str:
    """The versions of Python and of the libraries that render the figures (read without importing them)."""
    versions = [f"python {sys.version_info.major}.{sys.version_info.minor}"]
    for name in LIBRARIES:
        try:
            versions.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{name} -")
    return "\n".join(versions)


class FigureCache:
    """The files draws wrote, in ``store`` under ``_cache/figures/``, by the digest of the draw's name, its input,
    the source of ``packages`` and the rendering libraries' versions (the module's docstring says why)."""

    def __init__(self, store: Store, packages: Iterable[str]) -> None:
        self.store = store
        self.code = code_digest(packages)
        self.libraries = libraries()

    def digest(self, name: str, inputs: bytes) -> str:
        h = hashlib.sha256(FORMAT)
        for part in (name.encode(), self.code.encode(), self.libraries.encode(), inputs):
            h.update(len(part).to_bytes(8, "big"))
            h.update(part)
        return h.hexdigest()

    def files(self, name: str, inputs: bytes, draw: Callable[[], Mapping[str, bytes]]) -> dict[str, bytes]:
        """The files ``draw()`` writes from ``inputs`` (file name -> bytes): the ones kept from an earlier draw
        of the same digest when they are all there and whole, else drawn now and kept."""
        prefix = f"{FIGURE_PREFIX}{self.digest(name, inputs)}/"
        kept = self._read(prefix)
        if kept is not None:
            return kept
        drawn = dict(draw())
        for file, data in drawn.items():
            self.store.put(prefix + file, data)
        index = FigureFiles(sha256={file: hashlib.sha256(data).hexdigest() for file, data in drawn.items()})
        self.store.put(prefix + INDEX, msgspec.json.encode(index))  # last: the entry is complete from here on
        return drawn

    def _read(self, prefix: str) -> dict[str, bytes] | None:
        raw = self.store.get(prefix + INDEX)
        if raw is None:
            return None
        try:
            index = msgspec.json.decode(raw, type=FigureFiles)
        except msgspec.DecodeError:
            return None
        out: dict[str, bytes] = {}
        for file, sha in index.sha256.items():
            data = self.store.get(prefix + file)
            if data is None or hashlib.sha256(data).hexdigest() != sha:
                return None
            out[file] = data
        return out
