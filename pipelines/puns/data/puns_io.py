"""Loading, validating and writing the Puns artifacts.

Decoding (via :mod:`punchline.data.storage.jsonio`) already rejects wrong types and unknown tiers; the checks here
catch what a schema cannot express (exactly one blank, non-empty answer lists, unique indices,
tests that point at jokes that exist) so that a bad file fails at load time with the file, the
record and the field named, instead of as a ``KeyError`` half-way through a pipeline stage.
Writers validate first and then write atomically, so an error never leaves a partial ``--out``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from punchline.data.errors import InputError
from punchline.data.storage.jsonio import check_out_file, decode_file, write_upstream_json
from punchline.pipelines.puns.data.schemas import (
    BLANK,
    ClassifiedCompletions,
    ClozeResponses,
    ClozeTest,
    PunEntry,
    RawCompletions,
)

PathLike = str | os.PathLike[str]


def _decode_list(path: PathLike, type_: Any) -> Any:
    """Decode a JSON list; list positions are reported as ``position N`` to tell them from joke indices."""
    try:
        return decode_file(path, type_)
    except InputError as exc:
        if exc.record is not None and str(exc.record).isdigit():
            raise InputError(exc.detail, file=exc.file, record=f"position {exc.record}", field=exc.field) from None
        raise


# --- validation -------------------------------------------------------------------------------


def check_sentence(sentence: str, *, file: str | None, record: str) -> None:
    """A cloze sentence has exactly one blank: the prompt is the text before it."""
    count = sentence.count(BLANK)
    if count != 1:
        what = "no blank" if count == 0 else f"{count} blanks"
        raise InputError(
            f"sentence must contain exactly one {BLANK!r}, found {what}", file=file, record=record, field="sentence"
        )


def _joke_record(position: int, index: int) -> str:
    return f"joke index {index} (position {position})"


def validate_puns(puns: Iterable[PunEntry], *, file: str | None = None) -> None:
    """Raise :class:`InputError` for the first joke that cannot be used by the pipeline."""
    seen: dict[int, int] = {}
    for position, joke in enumerate(puns):
        record = _joke_record(position, joke.index)
        if joke.index in seen:
            raise InputError(
                f"duplicate index {joke.index} (also at position {seen[joke.index]})",
                file=file,
                record=record,
                field="index",
            )
        seen[joke.index] = position
        check_sentence(joke.sentence, file=file, record=record)
        for field in ("straight", "punny"):
            words: list[str] = getattr(joke, field)
            if not words:
                raise InputError("must list at least one completion", file=file, record=record, field=field)
            for word in words:
                if not word.strip():
                    raise InputError("completions must not be blank", file=file, record=record, field=field)


def validate_completions(entries: Mapping[str, object], *, file: str | None = None) -> None:
    """Stage 3/4 checkpoints are keyed by the joke index as a string; the key must agree with the record."""
    for key, entry in entries.items():
        index: int = entry.index  # type: ignore[attr-defined]
        sentence: str = entry.sentence  # type: ignore[attr-defined]
        record = f"joke index {key}"
        if key != str(index):
            raise InputError(f"key {key!r} does not match index {index}", file=file, record=record, field="index")
        check_sentence(sentence, file=file, record=record)


def validate_tests(
    tests: Iterable[ClozeTest],
    puns: Iterable[PunEntry] | None = None,
    *,
    file: str | None = None,
    puns_file: str | None = None,
) -> None:
    """Every test must name jokes that exist in the puns file it will be scored against."""
    known = {p.index for p in puns} if puns is not None else None
    for position, test in enumerate(tests):
        record = f"test {position} (pair {test.pair_id}, {test.type})"
        check_sentence(test.joke_c_sentence, file=file, record=record)
        if known is None:
            continue
        for field in ("joke_a_index", "joke_b_index", "joke_c_index"):
            index: int = getattr(test, field)
            if index not in known:
                where = f" {puns_file}" if puns_file else ""
                raise InputError(
                    f"joke index {index} is not in the puns file{where}", file=file, record=record, field=field
                )


def validate_responses(
    responses: ClozeResponses, tests: list[ClozeTest] | None = None, *, file: str | None = None
) -> None:
    """Responses are keyed by the test's position; each must agree with the test it answers."""
    for nick, model in responses.items():
        for key, resp in model.responses.items():
            record = f"model {nick!r} response {key!r}"
            if not key.isdigit():
                raise InputError("response key must be the test's position in the tests file", file=file, record=record)
            if tests is None:
                continue
            position = int(key)
            if position >= len(tests):
                raise InputError(
                    f"there is no test at position {position} (the tests file has {len(tests)})",
                    file=file,
                    record=record,
                )
            test = tests[position]
            if (resp.pair_id, resp.type) != (test.pair_id, test.type):
                raise InputError(
                    f"answers pair {resp.pair_id} {resp.type} but test {position} is pair {test.pair_id} {test.type}",
                    file=file,
                    record=record,
                    field="pair_id",
                )


# --- loaders ----------------------------------------------------------------------------------


def load_puns(path: PathLike) -> list[PunEntry]:
    """``puns_205.json`` (or any file of that shape, e.g. ``data/samples/puns_sample.json``)."""
    puns: list[PunEntry] = _decode_list(path, list[PunEntry])
    validate_puns(puns, file=str(path))
    return puns


def load_raw_completions(path: PathLike) -> RawCompletions:
    raw: RawCompletions = decode_file(path, RawCompletions)
    validate_completions(raw, file=str(path))
    return raw


def load_classified(path: PathLike) -> ClassifiedCompletions:
    classified: ClassifiedCompletions = decode_file(path, ClassifiedCompletions)
    validate_completions(classified, file=str(path))
    return classified


def load_cloze_tests(
    path: PathLike, puns: list[PunEntry] | None = None, *, puns_file: PathLike | None = None
) -> list[ClozeTest]:
    tests: list[ClozeTest] = _decode_list(path, list[ClozeTest])
    validate_tests(tests, puns, file=str(path), puns_file=str(puns_file) if puns_file else None)
    return tests


def load_cloze_responses(path: PathLike, tests: list[ClozeTest] | None = None) -> ClozeResponses:
    responses: ClozeResponses = decode_file(path, ClozeResponses)
    validate_responses(responses, tests, file=str(path))
    return responses


# --- writers (validate, then write atomically) -------------------------------------------------


def dump_puns(path: PathLike, puns: list[PunEntry]) -> None:
    validate_puns(puns, file=str(path))
    write_upstream_json(path, puns)


def dump_raw_completions(path: PathLike, raw: RawCompletions) -> None:
    validate_completions(raw, file=str(path))
    write_upstream_json(path, raw)


def dump_classified(path: PathLike, classified: ClassifiedCompletions) -> None:
    validate_completions(classified, file=str(path))
    write_upstream_json(path, classified)


def dump_cloze_tests(path: PathLike, tests: list[ClozeTest]) -> None:
    validate_tests(tests, file=str(path))
    write_upstream_json(path, tests)


def dump_cloze_responses(path: PathLike, responses: ClozeResponses) -> None:
    validate_responses(responses, file=str(path))
    write_upstream_json(path, responses)


def out_path(path: PathLike, flag: str = "--out") -> Path:
    """Refuse an ``--out`` that cannot be written (a directory, under a file, in a read-only folder)
    before any work is done."""
    return check_out_file(path, flag=flag)
