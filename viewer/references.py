"""A unit's input row beside its answers: the row's fields, its reference answer marked.

The generic stages (``cluster/stages/``: the ``prompts`` pipeline, a plug-in's ``Generate``/``Judge``) have no
reference of their own: a row is a dict of fields, and what the answer is graded against is whichever field the judge's
template reads (``Reference: {{ row.answer }}``). Their units do not carry the row either (a request carries the
rendered prompt), but the run's ``outputs.jsonl`` does: one line per row x model x sample, in row order, the row's
own columns first, before ``row_id`` (``cluster/stages/outputs.py``, whose names this module imports: the generic
stages are the engine's, not a pipeline's). A unit id ``<stage>/r<row>/...`` names its row by
position. So the viewer shows a unit's row from that file: the fields before ``row_id``, with those the run's config
reads as ``row.<name>`` and the usual names of a reference (``answer``, ``reference``, ``expected``, ...) marked.

Finding row ``k`` in a file of millions of lines is a table of where each row's lines start, built in one streaming
pass (a line at a time, only its ``row_id`` decoded), in the background, usable for the rows it has reached while it
runs, and kept under ``runs/_view/<run>/`` for the file's size and time.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from array import array
from pathlib import Path
from typing import Any

import msgspec

from punchline.cluster.stages.outputs import OUTPUTS_JSONL, ROW_ID
from punchline.data.answer_format import REFERENCE_COLUMNS
from punchline.data.errors import PunchlineError
from punchline.data.storage.jsonio import atomic_write_bytes
from punchline.data.storage.run_layout import RunLayout
from punchline.data.store import Store
from punchline.data.stores.local import LocalStore

REFERENCE_NAMES = frozenset(REFERENCE_COLUMNS) | {"expected_answer", "solution", "correct_answer"}
NEAR_TOP = 5_000  # a row the pass reaches in moments: a page of it waits for the pass (half a second at most)
_UNIT_ROW = re.compile(r"^[^/]+/r(\d+)(?:/|$)")
_ROW_READ = re.compile(r"\brow\.([A-Za-z_]\w*)")


class _RowId(msgspec.Struct):
    row_id: Any = None


class _Kept(msgspec.Struct):
    size: int
    mtime_ns: int
    starts: bytes


_row_id = msgspec.json.Decoder(_RowId)
_kept = msgspec.msgpack.Decoder(_Kept)
_line = msgspec.json.Decoder(dict[str, Any])


def reference_names(config_toml: str) -> frozenset[str]:
    """The fields a run's config reads as ``row.<name>`` (a judge's reference), with the usual names."""
    return REFERENCE_NAMES | frozenset(_ROW_READ.findall(config_toml))


class RowInputs:
    """The input rows of one run's units, read from its ``outputs.jsonl`` (see the module's docstring)."""

    def __init__(self, store: Store, run_id: str, cache_dir: Path | None, marked: frozenset[str]) -> None:
        self.marked = marked
        self.cache_dir = cache_dir
        self.path: Path | None = None
        self.note = ""
        self._starts = array("Q")  # where row k's first line starts
        self._done = False
        self._started = False
        self._lock = threading.Lock()
        if isinstance(store, LocalStore):
            path = (store.root / RunLayout(run_id).artifact(OUTPUTS_JSONL)).resolve()
            if path.is_relative_to(store.root.resolve()) and path.is_file():
                self.path = path
            else:
                self.note = f"no {OUTPUTS_JSONL} (yet): a unit's input row is shown once the run has written it"
        else:
            self.note = f"a unit's input row is read from {OUTPUTS_JSONL} in a local store only"

    def row(self, unit_id: str) -> tuple[list[tuple[str, str, bool]], str]:
        """The unit's row as (field, value as text, is a reference) in column order, or why not (a note)."""
        found = _UNIT_ROW.match(unit_id)
        if self.path is None or found is None:
            return [], self.note if self.path is None else ""
        k = int(found.group(1))
        self._start()
        waited = 0
        while k < NEAR_TOP and k >= len(self._starts) and not self._done and waited < 50:  # the pass is there soon
            time.sleep(0.01)
            waited += 1
        if k >= len(self._starts):
            return [], "" if self._done else f"finding row {k} in {OUTPUTS_JSONL} (a pass over it, once)"
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self._starts[k])
                fields = _line.decode(fh.readline())
        except (OSError, msgspec.DecodeError) as exc:
            return [], f"{OUTPUTS_JSONL}: row {k} is not readable ({str(exc)[:100]})"
        out = []
        for name, value in fields.items():
            if name == ROW_ID:
                break
            text = value if isinstance(value, str) else msgspec.json.encode(value).decode()
            out.append((name, text, name.removeprefix("input.") in self.marked))
        return out, ""

    def _start(self) -> None:
        with self._lock:
            if self._started:
                return
            self._started = True
        if not self._load():
            threading.Thread(target=self._build, name="punchline-view-rows", daemon=True).start()

    def _kept_path(self) -> Path | None:
        return self.cache_dir / "outputs.rows" if self.cache_dir is not None else None

    def _load(self) -> bool:
        kept = self._kept_path()
        if kept is None or self.path is None or not kept.is_file():
            return False
        try:
            saved = _kept.decode(kept.read_bytes())
            stat = self.path.stat()
        except (OSError, msgspec.DecodeError, ValueError):
            return False
        if (saved.size, saved.mtime_ns) != (stat.st_size, stat.st_mtime_ns):
            return False
        starts = array("Q")
        starts.frombytes(saved.starts)
        self._starts, self._done = starts, True
        return True

    def _build(self) -> None:
        """One pass over the file, a line at a time: where each row's lines start (usable as it grows)."""
        assert self.path is not None
        try:
            stat = self.path.stat()
            last: Any = object()
            at = 0
            with open(self.path, "rb", buffering=1 << 20) as fh:
                for line in fh:
                    with contextlib.suppress(msgspec.DecodeError):
                        rid = _row_id.decode(line).row_id
                        if rid != last:
                            self._starts.append(at)
                            last = rid
                    at += len(line)
        except OSError as exc:
            self.note = f"{OUTPUTS_JSONL} is not readable: {exc.strerror}"
            return
        finally:
            self._done = True
        kept = self._kept_path()
        if kept is not None:
            with contextlib.suppress(OSError, PunchlineError):  # a read-only runs folder: not kept
                kept_bytes = _Kept(size=stat.st_size, mtime_ns=stat.st_mtime_ns, starts=self._starts.tobytes())
                atomic_write_bytes(kept, msgspec.msgpack.encode(kept_bytes))
