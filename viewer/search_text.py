"""A finished stage's searchable text, kept under ``runs/_view/<run>/<stage>.text``: what a text search looks through.

A search looks for its text in each unit's id, prompt, answers and error. Read from the store, that is every plan
page decompressed and every shard file read, most of it what a search never matches (field names, numbers, a system
message repeated in every unit): about 700 MB for a million units, seconds of work for each search. So the first
search of a finished stage (or the run page, in the background) writes that text once, lower-cased, each distinct
string of a shard once, shard after shard, beside a table of where each shard's text starts; a search then is one
``find`` over the file, mapped into memory (no copy), from the shard its cursor is in, and decodes only the shards
where the text is. A stage still running is searched in its files (its shards are not all written).
"""

from __future__ import annotations

import bisect
import contextlib
import mmap
import os
import threading
import time
from array import array
from pathlib import Path

import msgspec
import structlog

from punchline.data.errors import PunchlineError
from punchline.data.storage.jsonio import atomic_write_bytes
from punchline.viewer.index import Layout, RunFiles, plain


class _Message(msgspec.Struct, array_like=True):  # as data.requests.Message is stored
    role: str
    content: str


class _Request(msgspec.Struct):
    messages: list[_Message] = []


class _Unit(msgspec.Struct):
    unit_id: str
    request: _Request


class _Page(msgspec.Struct):
    shards: list[list[_Unit]] = []


class _Response(msgspec.Struct):
    texts: list[str] = []


class _Result(msgspec.Struct):
    unit_id: str = ""
    response: _Response | None = None
    error: str | None = None


class _Shard(msgspec.Struct):
    results: list[_Result] = []


class _Starts(msgspec.Struct):
    digest: str
    shards: int
    starts: bytes  # where each shard's text starts, and the end


log = structlog.get_logger("punchline.view")
_page = msgspec.msgpack.Decoder(_Page)
_shard = msgspec.msgpack.Decoder(_Shard)
_starts = msgspec.msgpack.Decoder(_Starts)
SEP = "\x00"  # between strings: a search's text never holds it


def needle_of(text: str) -> bytes:
    """What is looked for in the kept text: the search's text lower-cased, as it was written."""
    return text.lower().replace(SEP, "").encode()


class SearchText:
    """One stage's kept text, mapped; :meth:`next_holding` finds the next shard whose text holds a needle."""

    def __init__(self, path: Path, starts: array[int]) -> None:
        self.starts = starts
        self._file = open(path, "rb")  # noqa: SIM115 - kept open for the mapping, closed by close()
        size = starts[-1]
        self._map = mmap.mmap(self._file.fileno(), size, access=mmap.ACCESS_READ) if size else None

    def next_holding(self, needle: bytes, shard: int) -> int:
        """The first shard from ``shard`` on whose text holds ``needle``; the number of shards when none does."""
        total = len(self.starts) - 1
        if self._map is None or shard >= total:
            return total
        at = self._map.find(needle, self.starts[shard])
        return total if at < 0 else bisect.bisect_right(self.starts, at) - 1

    def holds(self, needle: bytes, shard: int) -> bool:
        if self._map is None or shard >= len(self.starts) - 1:
            return False
        return self._map.find(needle, self.starts[shard], self.starts[shard + 1]) >= 0

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
        self._file.close()


class SearchTexts:
    """A run's kept texts, per stage: loaded when kept for the stage's plan digest, else built in the background."""

    def __init__(self, files: RunFiles) -> None:
        self.files = files
        self._have: dict[str, SearchText] = {}
        self._building: set[str] = set()
        self._lock = threading.Lock()

    def ready(self, stage: str, layout: Layout, digest: str, wait_s: float = 0.0) -> SearchText | None:
        """The stage's text if kept; if not, it is written in the background, and None after ``wait_s`` at most
        (a search waits for it: reading the store's files instead takes as long, and finds less)."""
        have = self._ready(stage, layout, digest)
        deadline = time.monotonic() + wait_s
        while have is None and time.monotonic() < deadline:
            with self._lock:
                building = stage in self._building
            if not building:
                return self._ready(stage, layout, digest, start=False)
            time.sleep(0.05)
            have = self._ready(stage, layout, digest, start=False)
        return have

    def _ready(self, stage: str, layout: Layout, digest: str, start: bool = True) -> SearchText | None:
        with self._lock:
            have = self._have.get(stage)
            if have is not None and len(have.starts) - 1 == layout.shards_total:
                return have
        if self.files.cache_dir is None or not digest:
            return None
        loaded = self._load(stage, layout, digest)
        if loaded is not None:
            with self._lock:
                self._have[stage] = loaded
            return loaded
        with self._lock:
            if stage in self._building or not start:
                return None
            self._building.add(stage)
        threading.Thread(
            target=self._build, args=(stage, layout, digest), name=f"punchline-view-text-{stage}", daemon=True
        ).start()
        return None

    def _paths(self, stage: str) -> tuple[Path, Path]:
        assert self.files.cache_dir is not None
        return self.files.cache_dir / f"{stage}.text", self.files.cache_dir / f"{stage}.text.starts"

    def _load(self, stage: str, layout: Layout, digest: str) -> SearchText | None:
        text, starts_path = self._paths(stage)
        try:
            saved = _starts.decode(starts_path.read_bytes())
            if saved.digest != digest or saved.shards != layout.shards_total:
                return None
            starts = array("Q")
            starts.frombytes(saved.starts)
            if text.stat().st_size != starts[-1]:
                return None
            return SearchText(text, starts)
        except (OSError, msgspec.DecodeError, ValueError):
            return None

    def build(self, stage: str, layout: Layout, digest: str) -> None:
        """Write the stage's text: a pass over its plan pages and shard files (a plan page, a shard file at a time)."""
        text, starts_path = self._paths(stage)
        text.parent.mkdir(parents=True, exist_ok=True)
        starts = array("Q", [0])
        shard = 0
        partial = text.with_name(text.name + ".partial")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # answers and errors: the run's own
        with open(fd, "wb") as out:
            for key in layout.page_keys:
                raw = self.files.store.get(key)
                page = _page.decode(plain(raw)) if raw is not None else _Page()
                for units in page.shards:
                    strings: dict[str, None] = {}
                    for u in units:
                        strings[u.unit_id] = None
                        strings.update((m.content, None) for m in u.request.messages)
                    data = self.files.shard_raw(stage, shard)
                    with contextlib.suppress(msgspec.DecodeError, ValueError):  # an unreadable shard: its plan only
                        for r in _shard.decode(data).results if data is not None else ():
                            if r.response is not None:
                                strings.update((t, None) for t in r.response.texts)
                            if r.error:
                                strings[r.error] = None
                    blob = (SEP.join(strings).lower() + SEP).encode()
                    out.write(blob)
                    starts.append(starts[-1] + len(blob))
                    shard += 1
        partial.replace(text)
        atomic_write_bytes(starts_path, msgspec.msgpack.encode(_Starts(digest, shard, starts.tobytes())))

    def _build(self, stage: str, layout: Layout, digest: str) -> None:
        try:
            self.build(stage, layout, digest)
        except (OSError, PunchlineError, msgspec.DecodeError, ValueError) as exc:
            # a read-only runs folder, or a file that does not read: searches read the store's files
            log.info("view_search_text_failed", stage=stage, error=f"{type(exc).__name__}: {exc}"[:200])
        finally:
            with self._lock:
                self._building.discard(stage)
