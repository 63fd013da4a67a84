"""A unit's input row beside its answers: the row's fields, its reference answer marked.

The generic stages (``cluster/stages/``: the ``prompts`` pipeline, a plug-in's ``Generate``/``Judge``) have no
reference of their own: a row is a dict of fields, and what the answer is graded against is whichever field the judge's
template reads (``Reference: {{ row.answer }}``). Their units do not carry the row either (a request carries the
rendered prompt), but the run's ``outputs.jsonl`` does: one line per row x model x sample, in row order, the row's
own columns first, before ``row_id`` (``cluster/stages/outputs.py``, whose names this module imports: the generic
stages are the engine's, not a pipeline's). A plug-in's ``Generate``/``Judge`` writes it under the stage's name
instead (``<stage>.jsonl``, ``punchline/plugin/stages.py``): a unit of stage ``s`` reads ``s.jsonl`` when the run
has one whose first line holds a ``row_id``, else ``outputs.jsonl``. A unit id ``<stage>/r<row>/...`` names its row
by position. So the viewer shows a unit's row from that file: the fields before ``row_id``, with those the run's
config names as the reference (``reference = "<column>"`` in any of its tables, as ``[prompts] reference``) or reads
as ``row.<name>``, and the usual names of a reference (``answer``, ``reference``, ``expected``, ...) marked.

Finding row ``k`` in a file of millions of lines is a table of where each row's lines start, built in one streaming
pass (a line at a time, only its ``row_id`` decoded), in the background, usable for the rows it has reached while it
runs, and kept under ``runs/_view/<run>/`` for the file's size and time.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
import tomllib
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
    """The fields a run's config names as the rows' reference (``reference = "<column>"`` in any table:
    ``[prompts] reference``) or reads as ``row.<name>`` (a judge's reference), with the usual names."""
    named: set[str] = set()
    with contextlib.suppress(tomllib.TOMLDecodeError):
        tables = [tomllib.loads(config_toml)]
        while tables:
            table = tables.pop()
            reference = table.get("reference")
            if isinstance(reference, str):
                named.add(reference)
            tables += [value for value in table.values() if isinstance(value, dict)]
    return REFERENCE_NAMES | frozenset(_ROW_READ.findall(config_toml)) | frozenset(named)


class RowInputs:
    """The input rows of one run's units, read from its generic stages' output file (see the module's
    docstring): ``<stage>.jsonl`` (a plug-in's stage), else ``outputs.jsonl``; each file indexed once."""

    def __init__(self, store: Store, run_id: str, cache_dir: Path | None, marked: frozenset[str]) -> None:
        self.store, self.run_id, self.cache_dir, self.marked = store, run_id, cache_dir, marked
        self._files: dict[str, _RowFile] = {}
        self._lock = threading.Lock()

    def row(self, unit_id: str) -> tuple[list[tuple[str, str, bool]], str]:
        """The unit's row as (field, value as text, is a reference) in column order, or why not (a note)."""
        stage = unit_id.split("/", 1)[0]
        with self._lock:
            rows = self._files.get(stage)
            if rows is None:
                name = f"{stage}.jsonl" if self._has_rows(f"{stage}.jsonl") else OUTPUTS_JSONL
                rows = next((f for f in self._files.values() if f.name == name), None)
                if rows is None:
                    rows = _RowFile(self.store, self.run_id, name, self.cache_dir, self.marked)
                self._files[stage] = rows
        return rows.row(unit_id)

    def _has_rows(self, name: str) -> bool:
        """Whether the run has an artifact ``name`` of output rows (its first line holds a ``row_id``)."""
        path = _local_artifact(self.store, self.run_id, name)
        if name == OUTPUTS_JSONL or path is None:
            return False
        try:
            with open(path, "rb") as fh:
                first = _line.decode(fh.readline())
        except (OSError, msgspec.DecodeError):
            return False
        return ROW_ID in first


def _local_artifact(store: Store, run_id: str, name: str) -> Path | None:
    """Where a run's artifact ``name`` is in a local store (None: not a local store, or a name that leads out of
    it)."""
    if not isinstance(store, LocalStore):
        return None
    path = (store.root / RunLayout(run_id).artifact(name)).resolve()
    return path if path.is_relative_to(store.root.resolve()) else None


class _RowFile:
    """The input rows in one output file (``outputs.jsonl`` or a plug-in stage's ``<stage>.jsonl``)."""

    def __init__(self, store: Store, run_id: str, name: str, cache_dir: Path | None, marked: frozenset[str]) -> None:
        self.name = name
        self.marked = marked
        self.cache_dir = cache_dir
        self.path: Path | None = None
        self.note = ""
        self._starts = array("Q")  # where row k's first line starts
        self._done = False
        self._started = False
        self._lock = threading.Lock()
        if isinstance(store, LocalStore):
            path = _local_artifact(store, run_id, name)
            if path is not None and path.is_file():
                self.path = path
            else:
                self.note = f"no {name} (yet): a unit's input row is shown once the run has written it"
        else:
            self.note = f"a unit's input row is read from {name} in a local store only"

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
            return [], "" if self._done else f"finding row {k} in {self.name} (a pass over it, once)"
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self._starts[k])
                fields = _line.decode(fh.readline())
        except (OSError, msgspec.DecodeError) as exc:
            return [], f"{self.name}: row {k} is not readable ({str(exc)[:100]})"
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
        return self.cache_dir / f"{self.name.removesuffix('.jsonl')}.rows" if self.cache_dir is not None else None

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
            self.note = f"{self.name} is not readable: {exc.strerror}"
            return
        finally:
            self._done = True
        kept = self._kept_path()
        if kept is not None:
            with contextlib.suppress(OSError, PunchlineError):  # a read-only runs folder: not kept
                kept_bytes = _Kept(size=stat.st_size, mtime_ns=stat.st_mtime_ns, starts=self._starts.tobytes())
                atomic_write_bytes(kept, msgspec.msgpack.encode(kept_bytes))
