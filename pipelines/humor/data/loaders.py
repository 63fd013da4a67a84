"""Loading MERA Humor data (``test.json`` / ``shots.json`` or the Hugging Face parquet files) and
prediction files, with errors that name the file, the record and the field."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import msgspec

from punchline.data.errors import InputError
from punchline.data.storage.jsonio import reject_duplicate_keys
from punchline.pipelines.humor.data.schema import HumorFile, HumorItem, HumorShotsFile, HumorTestFile

_PATH_RE = re.compile(r"at `\$(?P<path>[^`]*)`")
_ITEM_RE = re.compile(r"^data\[(\d+)\]\.?(.*)$")


class _AnyJsonFile(msgspec.Struct):
    data: list[HumorItem]
    access: str | None = None


class Prediction(msgspec.Struct, forbid_unknown_fields=False):
    """One line of a predictions JSONL file: the item id and the model's raw answer."""

    id: int
    text: str


def load_json(path: str | os.PathLike[str]) -> HumorFile:
    """``test.json`` (with ``access``) -> :class:`HumorTestFile`; ``shots.json`` -> :class:`HumorShotsFile`."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", file=str(p)) from None
    try:
        f = msgspec.json.decode(raw, type=_AnyJsonFile)
    except msgspec.ValidationError as exc:
        field, detail = _field_of(exc)
        record: int | None = None
        m = _ITEM_RE.match(field or "")
        if m:
            record, field = int(m.group(1)), (m.group(2) or None)
        raise InputError(detail, file=str(p), record=record, field=field) from None
    except msgspec.DecodeError as exc:
        raise InputError(f"malformed JSON: {exc}", file=str(p)) from None
    reject_duplicate_keys(raw, source=str(p))
    if f.access is not None:
        return HumorTestFile(access=f.access, data=f.data)
    return HumorShotsFile(data=f.data)


def _field_of(exc: msgspec.ValidationError) -> tuple[str | None, str]:
    message = str(exc)
    m = _PATH_RE.search(message)
    field = (m.group("path").lstrip(".") or None) if m else None
    return field, _PATH_RE.sub("", message).strip().rstrip("-").strip()


def load_parquet(path: str | os.PathLike[str]) -> HumorShotsFile:
    """A Hugging Face parquet split (columns instruction, inputs struct, outputs, meta struct)."""
    import pyarrow as pa  # lazy: pyarrow takes a second to import, and only parquet input needs it
    import pyarrow.parquet as pq  # lazy: as above

    p = Path(path)
    if not p.is_file():
        raise InputError("file not found", file=str(p))
    try:
        rows: list[dict[str, Any]] = pq.read_table(p).to_pylist()
    except (pa.ArrowException, OSError) as exc:
        raise InputError(f"cannot read parquet: {exc}", file=str(p)) from None
    items: list[HumorItem] = []
    for i, row in enumerate(rows):
        try:
            items.append(msgspec.convert(row, HumorItem))
        except msgspec.ValidationError as exc:
            field, detail = _field_of(exc)
            raise InputError(detail, file=str(p), record=i, field=field) from None
    return HumorShotsFile(data=items)


def load_humor(path: str | os.PathLike[str]) -> HumorFile:
    """Any supported file, chosen by extension (``.parquet`` or JSON)."""
    if str(path).endswith(".parquet"):
        return load_parquet(path)
    return load_json(path)


def load_items(path: str | os.PathLike[str]) -> list[HumorItem]:
    return load_humor(path).data


def load_predictions(path: str | os.PathLike[str]) -> dict[int, str]:
    """JSONL lines ``{"id": int, "text": str}`` -> ``{id: text}``; blank lines are skipped.

    A bad line or a repeated id is an :class:`InputError` naming the 1-based line number.
    """
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", file=str(p)) from None
    decoder = msgspec.json.Decoder(Prediction)
    out: dict[int, str] = {}
    for lineno, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            pred = decoder.decode(line)
        except msgspec.ValidationError as exc:
            field, detail = _field_of(exc)
            raise InputError(detail, file=str(p), record=f"line {lineno}", field=field) from None
        except msgspec.DecodeError as exc:
            raise InputError(f"malformed JSON: {exc}", file=str(p), record=f"line {lineno}") from None
        reject_duplicate_keys(line, source=str(p), record=f"line {lineno}")
        if pred.id in out:
            raise InputError(f"id {pred.id} repeated", file=str(p), record=f"line {lineno}", field="id")
        out[pred.id] = pred.text
    return out


def check_unique_ids(items: list[HumorItem], path: str | os.PathLike[str]) -> None:
    """Scoring needs one reference per id: a repeated id would silently drop an answer (n = 24
    scored as 23), so it is an error naming both records."""
    first: dict[int, int] = {}
    for i, item in enumerate(items):
        item_id = item.meta.id
        if item_id in first:
            raise InputError(
                f"id {item_id} repeats record {first[item_id]}; ids must be unique to score",
                file=str(path),
                record=i,
                field="meta.id",
            )
        first[item_id] = i
