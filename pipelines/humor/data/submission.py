"""A MERA submission of a Humor run, shaped as ``scripts/log_to_submission_v2.py`` packs one.

Why this shape (MERA-Evaluation/MERA ``scripts/log_to_submission_v2.py`` at
ce16dba769b38f2ff236f335006beae350f254a8): the leaderboard scores the model's *own* text, so
``Humor.json`` is ``{"data": {"test": [{"outputs": <text>, "meta": {"id": <int>}}, ...]}}`` with the text as
lm-eval's filter chain leaves it (``remove_whitespace_and_nones``: ``lstrip()``), never our parser's reading
(which would turn a hedge into a clean answer). The sample logs travel beside it as ``logs_public.zip``:
``samples_humor_<stamp>.jsonl`` (one row per item: ``doc`` with ``meta.id``, ``arguments``, ``resps``,
``filtered_resps``) and ``results_<stamp>.json``, all with one run stamp, as lm-eval names them. The whole
folder is then zipped (``<dir>.zip``), as the script does.

Every test item needs exactly one answer: a missing or repeated id is an :class:`InputError`, before anything
is written.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path

import msgspec

from punchline.data.errors import InputError
from punchline.data.storage.jsonio import atomic_write_bytes
from punchline.pipelines.humor.data.mera import mera_filtered
from punchline.pipelines.humor.data.prompts import mera_task_text
from punchline.pipelines.humor.data.schema import HumorItem

TASK = "humor"
SUBMISSION_FILE = "Humor.json"
LOGS_NAME = "logs_public"
STAMP_FORMAT = "%Y-%m-%dT%H-%M-%S.%f"  # lm-eval's log-name date (the script parses it back)
UNTIL = ("\n\n",)  # lm-eval's default stop: humor.yaml sets no `until`
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # fixed member times: the same inputs give the same bytes


def run_stamp(ts: float) -> str:
    """The stamp lm-eval puts in its log names, for a POSIX time."""
    return datetime.fromtimestamp(ts, UTC).strftime(STAMP_FORMAT)


def answers_stamp(answers: dict[int, str]) -> str:
    """A stamp derived from the answers themselves (a time in 2020-2023): the packing script only needs the
    samples and results of one run to share it, and a rerun that replays the same answers from the cache
    then packs the same bytes."""
    blob = json.dumps(sorted(answers.items()), ensure_ascii=False).encode("utf-8")
    digest = int.from_bytes(hashlib.sha256(blob).digest()[:8], "big")
    return run_stamp(1_580_000_000 + digest % 100_000_000 + (digest % 1_000_000) / 1e6)


def answers_by_id(items: Sequence[HumorItem], answers: Iterable[tuple[int, str]], *, source: str) -> dict[int, str]:
    """``(id, text)`` pairs as ``{id: text}``, one per item: a repeated, unknown or missing id is an error."""
    known = {item.id for item in items}
    out: dict[int, str] = {}
    for item_id, text in answers:
        if item_id in out:
            raise InputError(f"id {item_id} answered twice", file=source, field="id")
        if item_id not in known:
            raise InputError(f"id {item_id} is not a test item", file=source, field="id")
        out[item_id] = text
    missing = sorted(known - set(out))
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (" …" if len(missing) > 10 else "")
        raise InputError(f"{len(missing)} test item(s) have no answer: ids {shown}", file=source, field="id")
    return out


def submission_doc(items: Sequence[HumorItem], answers: dict[int, str]) -> dict[str, object]:
    """``Humor.json``'s content, in item order."""
    test = [{"outputs": mera_filtered(answers[it.id]), "meta": {"id": int(it.id)}} for it in items]
    return {"data": {"test": test}}


def sample_rows(items: Sequence[HumorItem], answers: dict[int, str]) -> list[dict[str, object]]:
    """lm-eval's ``samples_humor_<stamp>.jsonl`` rows for the items (the fields the packing script reads)."""
    rows: list[dict[str, object]] = []
    for i, item in enumerate(items):
        text = answers[item.id]
        rows.append(
            {
                "doc_id": i,
                "doc": msgspec.to_builtins(item),
                "target": item.outputs.strip(),
                "arguments": {"gen_args_0": {"arg_0": mera_task_text(item), "arg_1": {"until": list(UNTIL)}}},
                "resps": [[text]],
                "filtered_resps": [mera_filtered(text)],
                "filter": "scoring",
            }
        )
    return rows


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(zipfile.ZipInfo(name, date_time=_ZIP_TIME), data, zipfile.ZIP_DEFLATED)
    return buf.getvalue()


def _json(obj: object) -> bytes:
    return json.dumps(obj, ensure_ascii=False, indent=4).encode("utf-8")


def submission_files(
    items: Sequence[HumorItem],
    answers: dict[int, str],
    *,
    stamp: str | None = None,
    results: dict[str, object] | None = None,
) -> dict[str, bytes]:
    """``Humor.json`` and ``logs_public.zip`` (samples + results of one stamp, by default
    :func:`answers_stamp`) as ``{name: bytes}``."""
    stamp = stamp or answers_stamp(answers)
    samples = b"".join(json.dumps(r, ensure_ascii=False).encode("utf-8") + b"\n" for r in sample_rows(items, answers))
    logs = _zip(
        {
            f"samples_{TASK}_{stamp}.jsonl": samples,
            f"results_{stamp}.json": _json({"results": {TASK: results or {}}}),
        }
    )
    return {SUBMISSION_FILE: _json(submission_doc(items, answers)), f"{LOGS_NAME}.zip": logs}


def submission_zip(files: dict[str, bytes]) -> bytes:
    """The whole submission folder as one archive (the script's final ``make_archive``)."""
    return _zip(files)


def write_submission(out_dir: str | os.PathLike[str], files: dict[str, bytes]) -> list[str]:
    """Write the files into ``out_dir`` and the folder's archive ``<out_dir>.zip`` beside it."""
    out = Path(out_dir)
    written = []
    for name, data in files.items():
        atomic_write_bytes(out / name, data)
        written.append(str(out / name))
    archive = out.parent / f"{out.name}.zip"
    atomic_write_bytes(archive, submission_zip(files))
    return [*written, str(archive)]
