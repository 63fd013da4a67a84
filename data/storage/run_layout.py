"""Where a run's files are: the one place their names are spelled.

A run keeps its state under ``<run-id>/`` in the store (a local folder or S3) and, on the driver's machine, in
``<runs-dir>/<run-id>/``. Every module that reads or writes one of those files asks a :class:`RunLayout` for its
key or path, so the layout can change in one place and a reader never guesses it::

    <store>/<run-id>/run.json                      the run's record (also runs/<run-id>/run.json)
    <store>/<run-id>/log.jsonl                     the run's log, copied from runs/<run-id>/log.jsonl
    <store>/<run-id>/artifacts/<name>              what the stages produced
    <store>/<run-id>/stages/<stage>/manifest.json  a stage finished (its counts and artifacts)
    <store>/<run-id>/stages/<stage>/plan.sha256    the digest of the stage's plan
    <store>/<run-id>/stages/<stage>/plan/<page>    the plan's pages of units
    <store>/<run-id>/stages/<stage>/shards/<n>     a shard's committed results
    <store>/<run-id>/batches/                      provider batches' records
    <store>/<run-id>/sentinels/<token>.json        the shared-store check's sentinels
"""

from __future__ import annotations

from pathlib import Path

import msgspec

RECORD = "run.json"
LOG = "log.jsonl"
SPOOL = "spool"  # answers paid for while the store was out, on the machine that paid (runs/<run-id>/spool/)


class RunLayout(msgspec.Struct, frozen=True):
    """The keys of one run's files in its store, and their paths in a runs folder (:meth:`local`)."""

    run_id: str

    @property
    def record(self) -> str:
        return f"{self.run_id}/{RECORD}"

    @property
    def log(self) -> str:
        return f"{self.run_id}/{LOG}"

    @property
    def artifacts(self) -> str:
        """The prefix of every artifact key (with its trailing slash)."""
        return f"{self.run_id}/artifacts/"

    def artifact(self, name: str) -> str:
        return f"{self.artifacts}{name}"

    def stage(self, stage: str) -> str:
        """The prefix of a stage's files (no trailing slash)."""
        return f"{self.run_id}/stages/{stage}"

    def manifest(self, stage: str) -> str:
        return f"{self.stage(stage)}/manifest.json"

    def plan_digest(self, stage: str) -> str:
        return f"{self.stage(stage)}/plan.sha256"

    def plan_page(self, stage: str, page: int) -> str:
        return f"{self.stage(stage)}/plan/{page:06d}.msgpack"

    def shards(self, stage: str) -> str:
        """The prefix of a stage's shard files (with its trailing slash)."""
        return f"{self.stage(stage)}/shards/"

    def shard(self, stage: str, shard: int) -> str:
        return f"{self.shards(stage)}{shard:06d}.msgpack"

    @property
    def batches(self) -> str:
        return f"{self.run_id}/batches/"

    def sentinel(self, token: str) -> str:
        return f"{self.run_id}/sentinels/{token}.json"

    def local(self, runs_dir: str | Path) -> LocalRunFiles:
        return LocalRunFiles(Path(runs_dir) / self.run_id)


class LocalRunFiles(msgspec.Struct, frozen=True):
    """A run's folder on the driver's machine: ``<runs-dir>/<run-id>/``."""

    folder: Path

    @property
    def record(self) -> Path:
        return self.folder / RECORD

    @property
    def log(self) -> Path:
        return self.folder / LOG

    @property
    def spool(self) -> Path:
        return self.folder / SPOOL
