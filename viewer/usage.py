"""A run's calls, retries, 429s and latency per stage and model, for the models page and ``/metrics``, without
reading every shard file of the run on each view.

Why: summing every shard file's usage took about 7 s at 10^6 units (10^4 shard files) on a cold cache, so the
models page missed the viewer's targets (issue 31: opens in under 2 s). Where the sum comes from, per stage:

* a finished stage's manifest carries it (``StageManifest.usage``, written by the coordinator). A manifest is
  dropped with any of its shards (``retry-failed``), so it never disagrees with them: one small file, no shard read;
* a finished stage whose manifest predates ``usage`` (a run of an older punchline) is summed from its shard files
  once, then kept under the viewer's cache folder keyed by the manifest's digest, so the next start reads one file;
* a stage without a manifest (running, or ended with failed units) is summed incrementally: each view reads the
  shard files it has not read yet for at most ``scan_s``, and a background thread goes on with the rest, so the
  page answers at once and says "partial: N of M shards read" until the sum is whole. A shard file read is never
  read again (they are written once); one that vanished (``retry-failed`` dropped it) starts the stage's sum over.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
from pathlib import Path

import msgspec
import structlog

from punchline.data.errors import PunchlineError
from punchline.data.storage.jsonio import atomic_write_bytes
from punchline.data.storage.run_layout import RunLayout
from punchline.data.store import Store
from punchline.data.units import ModelUsage, ShardUsage, StageManifest

log = structlog.get_logger("punchline.view")

SCAN_S = 0.5  # what a view spends reading shard files it has not read yet; a background thread reads the rest


class _UsageOnly(msgspec.Struct):
    usage: ShardUsage | None = None


class KeptUsage(msgspec.Struct):
    """``<runs>/_view/<run>/<stage>.usage``: a finished stage's sum, for the manifest it was summed under."""

    manifest_sha256: str
    usage: ShardUsage


_usage_only = msgspec.msgpack.Decoder(_UsageOnly)
_manifest = msgspec.json.Decoder(StageManifest)
_kept = msgspec.msgpack.Decoder(KeptUsage)


class UsageRead(msgspec.Struct, kw_only=True):
    """Per stage, per model usage; ``notes`` say which stages' sums are partial."""

    models: dict[str, dict[str, ModelUsage]] = {}
    notes: list[str] = []


def shard_usage(store: Store, key: str) -> ShardUsage:
    """One shard file's usage (an empty one for a file that is gone or does not decode: the page goes on)."""
    raw = store.get(key)
    try:
        return (_usage_only.decode(raw).usage if raw else None) or ShardUsage()
    except (msgspec.DecodeError, ValueError):
        return ShardUsage()


def _copy(usage: ShardUsage) -> ShardUsage:
    return msgspec.msgpack.decode(msgspec.msgpack.encode(usage), type=ShardUsage)


class _StageSum:
    """The running sum of one stage's shard files read so far (shared by the views and the background reader)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.read: set[str] = set()
        self.total = ShardUsage()
        self.reading = False  # a background thread is reading the rest

    def advance(self, store: Store, keys: list[str], deadline: float) -> None:
        """Read the files of ``keys`` not read yet, until ``deadline`` (time.monotonic)."""
        for key in keys:
            if time.monotonic() > deadline:
                return
            with self.lock:
                if key in self.read:
                    continue
            usage = shard_usage(store, key)  # outside the lock: a view never waits for the background's read
            with self.lock:
                if key not in self.read:
                    self.read.add(key)
                    self.total.add(usage)

    def listed(self, keys: list[str]) -> None:
        """The stage's files now: the sum starts over if a file it holds is gone (dropped by ``retry-failed``)."""
        with self.lock:
            if not self.read <= set(keys):
                self.read, self.total = set(), ShardUsage()

    def snapshot(self) -> tuple[ShardUsage, int]:
        """A copy of the sum, and how many files it holds."""
        with self.lock:
            return _copy(self.total), len(self.read)


class RunUsage:
    """One run's usage per stage and model (see the module's docstring). One per run in the server."""

    def __init__(self, store: Store, run_id: str, cache_dir: Path | None = None, scan_s: float = SCAN_S) -> None:
        self.store = store
        self.run_id = run_id
        self.cache_dir = cache_dir
        self.scan_s = scan_s
        self._lock = threading.Lock()
        self._sums: dict[str, _StageSum] = {}
        self._finished: dict[str, tuple[str, ShardUsage]] = {}  # stage -> (manifest digest, its sum)

    def read(self, stages: list[str], *, whole: bool = False) -> UsageRead:
        """Every stage's usage; ``whole``: wait for every shard file (``/metrics``), else at most ``scan_s`` each."""
        out = UsageRead()
        for stage in stages:
            usage, note = self._stage(stage, whole)
            out.models[stage] = usage.models
            if note:
                out.notes.append(note)
        return out

    def _stage(self, stage: str, whole: bool) -> tuple[ShardUsage, str]:
        layout = RunLayout(self.run_id)
        raw = self.store.get(layout.manifest(stage))
        manifest = None
        if raw is not None:
            with contextlib.suppress(msgspec.DecodeError, ValueError):
                manifest = _manifest.decode(raw)
        if manifest is not None and manifest.usage is not None:
            return manifest.usage, ""
        digest = hashlib.sha256(raw).hexdigest() if manifest is not None and raw is not None else ""
        if digest:
            kept = self._kept(stage, digest)
            if kept is not None:
                return kept, ""
        keys = sorted(self.store.list(layout.shards(stage)))
        with self._lock:
            acc = self._sums.setdefault(stage, _StageSum())
        acc.listed(keys)
        acc.advance(self.store, keys, float("inf") if whole else time.monotonic() + self.scan_s)
        total, done = acc.snapshot()
        if done >= len(keys):
            if digest:
                self._keep(stage, digest, total)
            return total, ""
        self._read_on(stage, acc, keys)
        return total, f"{stage}: partial: {done} of {len(keys)} shards read (the rest are being read: reload)"

    def _read_on(self, stage: str, acc: _StageSum, keys: list[str]) -> None:
        """Read the rest of the stage's shard files in the background (one thread per stage at a time)."""
        with acc.lock:
            if acc.reading:
                return
            acc.reading = True

        def rest() -> None:
            try:
                acc.advance(self.store, keys, float("inf"))
            except Exception as exc:  # the next view reads on, and says how far it got
                log.info("view_usage_failed", run_id=self.run_id, stage=stage, error=str(exc)[:200])
            finally:
                with acc.lock:
                    acc.reading = False

        threading.Thread(target=rest, name=f"punchline-view-usage-{self.run_id}-{stage}", daemon=True).start()

    def _path(self, stage: str) -> Path | None:
        return self.cache_dir / f"{stage}.usage" if self.cache_dir is not None else None

    def _kept(self, stage: str, digest: str) -> ShardUsage | None:
        with self._lock:
            have = self._finished.get(stage)
        if have is not None and have[0] == digest:
            return have[1]
        path = self._path(stage)
        if path is None or not path.is_file():
            return None
        try:
            kept = _kept.decode(path.read_bytes())
        except (OSError, msgspec.DecodeError, ValueError):
            return None
        if kept.manifest_sha256 != digest:
            return None
        with self._lock:
            self._finished[stage] = (digest, kept.usage)
        return kept.usage

    def _keep(self, stage: str, digest: str, usage: ShardUsage) -> None:
        with self._lock:
            self._finished[stage] = (digest, usage)
            self._sums.pop(stage, None)  # the kept sum answers from now on
        path = self._path(stage)
        if path is not None:
            with contextlib.suppress(OSError, PunchlineError):  # a read-only runs folder: summed again next start
                atomic_write_bytes(path, msgspec.msgpack.encode(KeptUsage(manifest_sha256=digest, usage=usage)))
