"""Reproducing the Puns study from upstream's recorded outputs (``punchline puns reproduce``).

Three steps, each an existing piece of the engine: point the reproduce config at the upstream files,
load the recorded answers into the response cache (``import-legacy``: completions, verdicts under the
prompts *this* run builds from its lists, and the cloze answers under the prompts of the tests they
answered), then run the config offline. This module does the parts that are specific to the study:
finding the files, writing the effective config, predicting which cloze tests the run will build (the
recorded answers are keyed by their prompts) and comparing the outcome with the published numbers
(:mod:`punchline.pipelines.puns.data.puns_history`).
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from punchline.cluster.config import RunConfig, load_config
from punchline.cluster.run.driver import RunOptions, RunRecord
from punchline.data.errors import ConfigError, InputError
from punchline.data.storage.jsonio import atomic_write_bytes
from punchline.data.storage.run_layout import RunLayout
from punchline.data.store import Store
from punchline.data.stores import open_store
from punchline.data.units import RunState
from punchline.pipelines.puns import pipeline as puns
from punchline.pipelines.puns.data.classify import candidates, merge_all
from punchline.pipelines.puns.data.cloze import build_tests
from punchline.pipelines.puns.data.cloze_report import ClozeReport
from punchline.pipelines.puns.data.completions import build_raw_entry
from punchline.pipelines.puns.data.puns_history import (
    PUBLISHED_DELTA_PP,
    PUBLISHED_TIERS,
    UPSTREAM_CLASSIFIED,
    UPSTREAM_CLOZE_ANSWERS,
    UPSTREAM_CLOZE_TESTS,
    UPSTREAM_PUNS,
    UPSTREAM_RAW,
    RemovedWord,
    TestsComparison,
    compare_tests,
    delta_matches,
    is_published_selection,
    lists_as_classified,
)
from punchline.pipelines.puns.data.puns_io import (
    dump_cloze_tests,
    load_classified,
    load_cloze_responses,
    load_cloze_tests,
    load_puns,
    load_raw_completions,
)
from punchline.pipelines.puns.data.schemas import ClozeTest, PunEntry
from punchline.pipelines.puns.data.tiers import apply_rankings, rank, tier_counts
from punchline.pipelines.puns.legacy import ImportReport, import_legacy, targets_from_config

CONFIG_NAME = "reproduce.toml"
ANSWERED_TESTS_NAME = "cloze_tests_answered.json"


class UpstreamFiles(msgspec.Struct, kw_only=True):
    """Where the study's recorded outputs are; the cloze files are optional (not in every copy)."""

    folder: str
    puns: str
    raw: str
    classified: str
    cloze_answers: str | None = None  # cloze_benchmark_raw.json
    published_tests: str | None = None  # contextual_cloze_tests_100.json


def find_upstream(folder: str, *, cloze: str | None = None, tests: str | None = None) -> UpstreamFiles:
    """The upstream files in ``folder`` (as absolute paths); the three checkpoints must be there."""
    root = Path(folder).expanduser().resolve()
    if not root.is_dir():
        raise InputError("is not a folder (give the folder holding puns_205.json)", file=str(root))
    found = {}
    for name in (UPSTREAM_PUNS, UPSTREAM_RAW, UPSTREAM_CLASSIFIED):
        if not (root / name).is_file():
            raise InputError(f"missing {name}: --upstream must hold puns_205.json and its checkpoints", file=str(root))
        found[name] = str(root / name)

    def optional(given: str | None, names: tuple[str, ...]) -> str | None:
        if given is not None:
            path = Path(given).expanduser().resolve()
            if not path.is_file():
                raise InputError("no such file", file=str(path))
            return str(path)
        return next((str(root / n) for n in names if (root / n).is_file()), None)

    return UpstreamFiles(
        folder=str(root),
        puns=found[UPSTREAM_PUNS],
        raw=found[UPSTREAM_RAW],
        classified=found[UPSTREAM_CLASSIFIED],
        cloze_answers=optional(cloze, UPSTREAM_CLOZE_ANSWERS),
        published_tests=optional(tests, UPSTREAM_CLOZE_TESTS),
    )


def _toml_key(key: str) -> str:
    bare = key and all(c.isascii() and (c.isalnum() or c in "-_") for c in key)
    return key if bare else json.dumps(key, ensure_ascii=False)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a valid TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def toml_text(tables: Mapping[str, Any], _prefix: str = "") -> str:
    """``tables`` (a decoded config) as TOML: scalars and lists first, then one ``[table]`` per dict.

    Enough for run configs (strings, numbers, booleans, lists of those, nested tables); the effective
    config of a reproduction is written with it so that ``punchline status`` and a resume see it.
    """
    lines = [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in tables.items() if not isinstance(v, dict)]
    out = "\n".join(lines) + ("\n" if lines else "")
    for key, value in tables.items():
        if isinstance(value, dict):
            name = f"{_prefix}.{_toml_key(key)}" if _prefix else _toml_key(key)
            out += f"\n[{name}]\n" + toml_text(value, name)
    return out


def reproduce_config_text(template: str, upstream: UpstreamFiles) -> str:
    """The template config with its [puns] paths on ``upstream``, offline, and without the evaluate
    stage when there are no recorded cloze answers to replay (it could only fail, unit by unit)."""
    try:
        tables = msgspec.toml.decode(Path(template).read_bytes(), type=dict[str, Any])
    except OSError as exc:
        raise ConfigError(f"cannot read config: {exc.strerror}", file=template) from None
    except msgspec.DecodeError as exc:
        raise ConfigError(f"malformed TOML: {exc}", file=template) from None
    load_config(template)  # every other mistake, named as `punchline run` names it
    tables.setdefault("run", {})["offline"] = True
    section = tables.get("puns")
    if not isinstance(section, dict) or section.get("classify") is None or section.get("cloze") is None:
        raise ConfigError("a reproduction needs [puns] with classify and cloze tables", file=template)
    section["jokes"] = upstream.puns
    section["lists_at_classification"] = upstream.classified
    if upstream.cloze_answers is None:
        section.pop("evaluate", None)
    elif isinstance(section.get("evaluate"), dict):
        section["evaluate"]["score_against"] = upstream.puns
    else:
        raise ConfigError("a reproduction of the cloze answers needs a [puns.evaluate] table", file=template)
    return "# written by `punchline puns reproduce` from " + template + "\n" + toml_text(tables)


def predicted_tests(cfg: RunConfig, upstream: UpstreamFiles) -> list[ClozeTest]:
    """The cloze tests the run will build: its collect and classify stages replay the recorded answers,
    so its tiers follow from its lists and upstream's verdicts, computed here by the same functions."""
    cloze = puns.settings_of(cfg).cloze
    assert cloze is not None
    jokes = puns.run_jokes(cfg)
    raw = load_raw_completions(upstream.raw)
    classified = load_classified(upstream.classified)
    missing = [j.index for j in jokes if str(j.index) not in raw or str(j.index) not in classified]
    if missing:
        raise InputError(f"jokes {missing[:5]} have no recorded completions or verdicts", file=upstream.raw)
    run_raw = {str(j.index): build_raw_entry(j, raw[str(j.index)].models) for j in jokes}
    verdicts = {
        key: {w: classified[key].classifications.get(w, "other") for w in candidates(entry)}
        for key, entry in run_raw.items()
    }
    ranked = apply_rankings(jokes, rank(merge_all(run_raw, verdicts)))
    return build_tests(ranked, seed=cloze.seed, pairs=cloze.pairs)


def answered_tests(cfg: RunConfig, upstream: UpstreamFiles) -> list[ClozeTest] | None:
    """The tests the recorded cloze answers are keyed by, when upstream's published tests file is not at
    hand (None when it is: the answers are keyed by it): the tests this run will build, provided they are
    the published selection (same jokes, order, prompts), so that each answer keeps its prompt."""
    if upstream.published_tests is not None:
        return None
    tests = predicted_tests(cfg, upstream)
    if not is_published_selection(tests):
        raise InputError(
            "the cloze tests this run builds are not the published ones, so the recorded answers cannot be "
            f"replayed against them; put contextual_cloze_tests_100.json into {upstream.folder}",
            file=upstream.cloze_answers,
        )
    return tests


class PreparedReproduction(msgspec.Struct, kw_only=True):
    """A reproduction ready to run: its effective config written into the run's folder, the recorded
    answers in the run's response cache, and the options that run it (its run id, offline)."""

    upstream: UpstreamFiles
    config_path: str
    cfg: RunConfig
    opts: RunOptions
    store_url: str
    imported: ImportReport


def prepare_reproduction(
    template: str,
    opts: RunOptions,
    *,
    upstream_folder: str,
    cloze: str | None = None,
    published_tests: str | None = None,
) -> PreparedReproduction:
    """Everything before the run of ``punchline puns reproduce``: the upstream files found, the effective
    config and the recorded answers checked (before anything is written), the config written as
    ``<runs_dir>/<run id>/reproduce.toml``, the recorded answers imported into the store's response cache.
    The run id is ``opts.run_id``, else one derived from the effective config (the same study, the same run)."""
    upstream = find_upstream(upstream_folder, cloze=cloze, tests=published_tests)
    text = reproduce_config_text(template, upstream)
    run_id = opts.run_id or f"puns-reproduce-{hashlib.sha256(text.encode()).hexdigest()[:8]}"
    opts = msgspec.structs.replace(opts, run_id=run_id, offline=True)
    with tempfile.TemporaryDirectory() as tmp:  # check everything before writing anything
        (Path(tmp) / CONFIG_NAME).write_text(text, encoding="utf-8")
        cfg = load_config(Path(tmp) / CONFIG_NAME)
        tests = answered_tests(cfg, upstream) if upstream.cloze_answers else None
        if upstream.cloze_answers:  # the recorded answers must fit the tests they are keyed by
            answered = tests if tests is not None else load_cloze_tests(str(upstream.published_tests))
            load_cloze_responses(upstream.cloze_answers, answered)
    run_dir = Path(opts.runs_dir) / run_id
    config_path = run_dir / CONFIG_NAME
    atomic_write_bytes(config_path, text.encode("utf-8"))
    tests_path = upstream.published_tests if upstream.cloze_answers else None
    if tests is not None:
        tests_path = str(run_dir / ANSWERED_TESTS_NAME)
        dump_cloze_tests(tests_path, tests)
    cfg = msgspec.structs.replace(cfg, source=str(config_path))  # the same text, now where the run reads it
    store_url = opts.store or cfg.run.store or opts.runs_dir
    imported = import_legacy(
        upstream.raw,
        upstream.classified,
        store_url,
        targets_from_config(cfg),
        jokes=puns.run_jokes(cfg),
        cloze_path=upstream.cloze_answers,
        tests_path=tests_path,
    )
    return PreparedReproduction(
        upstream=upstream, config_path=str(config_path), cfg=cfg, opts=opts, store_url=store_url, imported=imported
    )


class ModelShift(msgspec.Struct):
    nick: str
    p_funny_straight_ctx: float
    p_funny_funny_ctx: float
    delta_pp: float
    published_delta_pp: float | None


class Reproduction(msgspec.Struct, kw_only=True):
    """What a reproduction ended with, beside what was published."""

    state: RunState
    provider_calls: int
    units: int
    cache_hits: int
    removed_words: list[RemovedWord]
    tiers: dict[str, int]
    tiers_match: bool
    tests: int
    tests_match: bool  # the published selection: same jokes, order, prompts, tiers, balances
    published_file: TestsComparison | None  # against upstream's tests file, when it is there
    shifts: list[ModelShift]  # empty when no cloze answers were replayed
    table_match: bool | None  # None: no recorded cloze answers

    @property
    def complete(self) -> bool:
        return self.table_match is not None

    @property
    def matches(self) -> bool:
        return self.state == "finished" and self.tiers_match and self.tests_match and self.table_match is not False


def reproduction_of(record: RunRecord, upstream: UpstreamFiles) -> Reproduction:
    """The ended run's artifacts (in the store its record names) beside the published numbers."""
    return summarize(open_store(record.services.store_url), record, upstream)


def summarize(store: Store, record: RunRecord, upstream: UpstreamFiles) -> Reproduction:
    """Read the run's artifacts and compare them with the published numbers."""

    def artifact(name: str) -> bytes | None:
        return store.get(RunLayout(record.run_id).artifact(name))

    _, removed = lists_as_classified(load_puns(upstream.puns), load_classified(upstream.classified))
    ranked_raw = artifact(puns.RANKED)
    tiers = tier_counts(msgspec.json.decode(ranked_raw, type=list[PunEntry])) if ranked_raw else {}
    tests_raw = artifact(puns.TESTS)
    tests = msgspec.json.decode(tests_raw, type=list[ClozeTest]) if tests_raw else []
    published_file = None
    if upstream.published_tests is not None and tests:
        published_file = compare_tests(tests, load_cloze_tests(upstream.published_tests))
    shifts: list[ModelShift] = []
    table_match = None
    report_raw = artifact("cloze_report/report.json")
    if report_raw is not None:
        report = msgspec.json.decode(report_raw, type=ClozeReport)
        for nick, m in report.models.items():
            shifts.append(
                ModelShift(nick, m.straight.p_funny, m.funny.p_funny, m.delta_funny_pp, PUBLISHED_DELTA_PP.get(nick))
            )
        table_match = delta_matches({s.nick: s.delta_pp for s in shifts})
    counters = record.counters.values()
    return Reproduction(
        state=record.state,
        provider_calls=sum(c.provider_requests for c in counters),
        units=sum(c.units_total for c in counters),
        cache_hits=sum(c.cache_hits for c in counters),
        removed_words=removed,
        tiers=tiers,
        tiers_match=tiers == PUBLISHED_TIERS,
        tests=len(tests),
        tests_match=is_published_selection(tests),
        published_file=published_file,
        shifts=shifts,
        table_match=table_match,
    )
