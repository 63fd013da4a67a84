"""MERA's submission of a finished Humor run (``punchline humor submission RUN``), read back from its store.

Why a module of its own: it works on a run that has ended (its record, its config as recorded, its answers
artifacts), not inside the engine's stages, and it is the one piece of the pipeline a command calls directly.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import msgspec

from punchline.cluster.config import RunConfig, check_run_id, load_config, resolve_path
from punchline.cluster.run.driver import RunRecord
from punchline.data.errors import InputError
from punchline.data.settings import runs_dir as resolve_runs_dir
from punchline.data.storage.jsonio import check_out_dir
from punchline.data.storage.run_layout import RunLayout
from punchline.data.stores import open_store
from punchline.pipelines.humor.data.loaders import load_humor
from punchline.pipelines.humor.data.submission import answers_by_id, submission_files, write_submission
from punchline.pipelines.humor.settings import answers_artifact, settings_of
from punchline.pipelines.humor.stages import answer_lines


def _run_record(run_id: str, runs_dir: str | None) -> tuple[RunRecord, RunConfig]:
    """A Humor run's record and its config (as recorded when the run started; relative paths resolve
    against the config's original folder)."""
    check_run_id(run_id, field="RUN")
    path = RunLayout(run_id).local(resolve_runs_dir(runs_dir)).record
    try:
        record = msgspec.json.decode(path.read_bytes(), type=RunRecord)
    except OSError:
        raise InputError("no such run (no run.json)", file=str(path), field="RUN") from None
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise InputError(f"unreadable run record: {exc}", file=str(path)) from None
    if record.pipeline != "humor":
        raise InputError(f"run {run_id} is a {record.pipeline!r} run, not humor", file=str(path), field="pipeline")
    with tempfile.TemporaryDirectory(prefix="punchline-humor-") as tmp:
        recorded = Path(tmp) / Path(record.config_path).name
        recorded.write_text(record.config_toml, encoding="utf-8")
        cfg = load_config(recorded)
    cfg.source = record.config_path
    return record, cfg


def submission_of_run(run_id: str, *, runs_dir: str | None, out_dir: str, models: list[str] | None) -> list[str]:
    """Write ``<out_dir>/<nick>/{Humor.json,logs_public.zip}`` and ``<out_dir>/<nick>.zip`` for each model of a
    finished Humor run. Everything is checked (every model's answers: one per item) before anything is written."""
    record, cfg = _run_record(run_id, runs_dir)
    settings = settings_of(cfg)
    chosen = models or list(settings.models)
    unknown = [m for m in chosen if m not in settings.models]
    if unknown:
        raise InputError(f"not a model of run {run_id}: {', '.join(unknown)}", field="--model")
    out = check_out_dir(out_dir)
    items = load_humor(resolve_path(cfg, settings.data)).data
    store = open_store(record.services.store_url)
    packs = {}
    for nick in chosen:
        key = RunLayout(run_id).artifact(answers_artifact(nick))
        source = f"{record.services.store_url}/{key}"
        raw = store.get(key)
        if raw is None:
            raise InputError("missing: the run has no answers for this model yet", file=source)
        answers = answers_by_id(items, answer_lines(raw, source), source=source)
        packs[nick] = submission_files(items, answers)
    written = []
    for nick, files in packs.items():
        written += write_submission(out / nick, files)
    return written
