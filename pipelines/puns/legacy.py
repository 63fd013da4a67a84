"""Upstream's recorded Puns answers into the response cache (``punchline import-legacy``, and the first
step of ``punchline puns reproduce``).

Each recorded answer is stored under the exact request key a puns run computes for it, so that run
re-pays for nothing and reproduces upstream's files: the completions of raw_completions.json, the judge
verdicts of classified_completions.json (under the classify prompts the run builds from its own lists)
and the recorded cloze answers of cloze_benchmark_raw.json. Existing cache entries are kept.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import msgspec

from punchline.cluster.config import RunConfig, check_service_url, load_config
from punchline.data.errors import ConfigError, InputError
from punchline.data.requests import ProviderRequest, ProviderResponse
from punchline.data.storage.jsonio import check_out_dir, decode_file
from punchline.data.storage.response_cache import CachedResponse, ResponseCache
from punchline.data.stores import open_store
from punchline.pipelines.puns.data.classify import batches, classify_request
from punchline.pipelines.puns.data.cloze_run import cloze_request
from punchline.pipelines.puns.data.completions import (
    build_raw_entry,
    greedy_request,
    sample_request,
    truncate_before_blank,
)
from punchline.pipelines.puns.data.puns_io import load_cloze_responses, load_cloze_tests
from punchline.pipelines.puns.data.schemas import ClassifiedCompletions, PunEntry, RawCompletionEntry, RawCompletions
from punchline.pipelines.puns.data.words import extract_word
from punchline.pipelines.puns.pipeline import PunsSettings, run_jokes

UPSTREAM_PROVIDER = "together"
UPSTREAM_MODELS = {
    "3b": "meta-llama/Llama-3.2-3B-Instruct-Turbo",
    "8b": "meta-llama/Meta-Llama-3.1-8B-Instruct-Turbo",
    "70b": "meta-llama/Meta-Llama-3.1-70B-Instruct-Turbo",
    "3.3-70b": "meta-llama/Llama-3.3-70B-Instruct-Turbo",
    "405b": "meta-llama/Meta-Llama-3.1-405B-Instruct-Turbo",
}
UPSTREAM_CLASSIFY = ("anthropic", "claude-sonnet-4-20250514")


class LegacyTargets(msgspec.Struct, kw_only=True):
    """Which requests the imported answers stand for (what a run with that config will ask)."""

    provider: str = UPSTREAM_PROVIDER
    models: dict[str, str] = {}  # nickname -> model id; empty = upstream's table
    samples: int = 20
    classify_provider: str = UPSTREAM_CLASSIFY[0]
    classify_model: str = UPSTREAM_CLASSIFY[1]
    batch_size: int = 10
    evaluate_provider: str = UPSTREAM_PROVIDER
    evaluate_models: dict[str, str] = {}  # nickname -> model id; empty = upstream's table


class ImportReport(msgspec.Struct, kw_only=True):
    written: int = 0
    already_cached: int = 0
    empty_answers: int = 0
    classify_batches: int = 0
    cloze_answers: int = 0
    cloze_words_differ: int = 0  # recorded extracted_word differs from what a run extracts from raw_response

    def describe(self, store: str) -> str:
        """One line saying what was imported into ``store``."""
        text = (
            f"imported {self.written} answers into {store} ({self.already_cached} were already cached, "
            f"{self.empty_answers} empty upstream answers kept as they were, "
            f"{self.classify_batches} classification batches, {self.cloze_answers} cloze answers)"
        )
        if self.cloze_words_differ:
            text += (
                f"; {self.cloze_words_differ} recorded cloze words differ from the first word a run extracts from "
                "the recorded text"
            )
        return text


def targets_from_config(cfg: RunConfig) -> LegacyTargets:
    """The provider and model ids a run with ``cfg`` asks (its collect, classify and evaluate tables)."""
    puns = cfg.settings
    if not isinstance(puns, PunsSettings):
        raise ConfigError("import-legacy needs a [puns] table", file=cfg.source or None)
    collect = puns.collect
    settings = cfg.provider(collect.provider)
    targets = LegacyTargets(
        provider=collect.provider,
        models={nick: settings.model_id(nick) for nick in collect.models},
        samples=collect.samples,
    )
    if puns.classify is not None:
        cl = puns.classify
        targets.classify_provider = cl.provider
        targets.classify_model = cfg.provider(cl.provider).model_id(cl.model)
        targets.batch_size = cl.batch_size
    if puns.evaluate is not None:
        ev = puns.evaluate
        targets.evaluate_provider = ev.provider
        targets.evaluate_models = {nick: cfg.provider(ev.provider).model_id(nick) for nick in ev.models}
    return targets


Put = Callable[[ProviderRequest, list[str]], None]


def import_legacy_files(
    raw_path: str | None,
    classified_path: str | None,
    store_url: str,
    *,
    config_path: str | None = None,
    cloze_path: str | None = None,
    tests_path: str | None = None,
) -> ImportReport:
    """``punchline import-legacy``: the store and the files checked, the requests those of the run config at
    ``config_path`` (else upstream's), then :func:`import_legacy`."""
    if not (raw_path or cloze_path):
        raise ConfigError("nothing to import: give --raw (and --classified) and/or --cloze with --tests")
    check_service_url(store_url, "--store")
    if "://" not in store_url:
        check_out_dir(store_url, flag="--store")
    cfg = load_config(config_path) if config_path else None
    targets = targets_from_config(cfg) if cfg is not None else LegacyTargets()
    jokes = run_jokes(cfg) if cfg is not None and classified_path else None
    return import_legacy(
        raw_path, classified_path, store_url, targets, jokes=jokes, cloze_path=cloze_path, tests_path=tests_path
    )


def import_legacy(
    raw_path: str | None,
    classified_path: str | None,
    store_url: str,
    targets: LegacyTargets,
    *,
    jokes: list[PunEntry] | None = None,
    cloze_path: str | None = None,
    tests_path: str | None = None,
) -> ImportReport:
    """Write the legacy answers into the store's response cache (existing entries are kept).

    ``jokes`` are the run's jokes (:func:`punchline.pipelines.puns.pipeline.run_jokes`): their lists decide
    which words the run's classify prompts ask about, so the verdicts are imported under those prompts.
    Without them the prompts are built from the lists recorded in ``raw_path`` (upstream's own).
    """
    if classified_path and not raw_path:
        raise ConfigError("--classified needs --raw (the verdicts are keyed by the prompts built from it)")
    if cloze_path and not tests_path:
        raise ConfigError("--cloze needs --tests (the answers are keyed by the prompts of the tests they answer)")
    cache = ResponseCache(open_store(store_url))
    report = ImportReport()
    collected: list[CachedResponse] = []  # written together at the end: a few packs, not a file per answer

    def put(request: ProviderRequest, texts: list[str]) -> None:
        if not texts or not any(texts):
            report.empty_answers += 1
        response = ProviderResponse(texts=texts, model=request.model)
        collected.append(CachedResponse(request=request, response=response, source="legacy-import"))

    if raw_path:
        raw: RawCompletions = decode_file(raw_path, RawCompletions)
        _import_completions(raw, raw_path, targets, put)
        if classified_path:
            entries = _classify_entries(raw, raw_path, jokes)
            report.classify_batches += _import_verdicts(entries, classified_path, targets, put)
    if cloze_path and tests_path:
        _import_cloze(cloze_path, tests_path, targets, put, report)
    report.written = cache.put_many(collected)
    report.already_cached = len(collected) - report.written
    return report


def _import_completions(raw: RawCompletions, raw_path: str, targets: LegacyTargets, put: Put) -> None:
    """Each joke's greedy completion and samples, per model the run asks for."""
    models = targets.models or UPSTREAM_MODELS
    for key, entry in raw.items():
        prompt = truncate_before_blank(entry.sentence)
        if prompt != entry.prompt:
            raise InputError("prompt is not the sentence cut before its blank", file=raw_path, record=key)
        for nick, done in entry.models.items():
            model_id = models.get(nick)
            if model_id is None:
                continue  # a model the run does not ask for
            put(greedy_request(targets.provider, model_id, prompt), [done.greedy])
            put(sample_request(targets.provider, model_id, prompt, n=targets.samples), list(done.samples))


def _classify_entries(raw: RawCompletions, raw_path: str, jokes: list[PunEntry] | None) -> list[RawCompletionEntry]:
    """The records the run's classify stage builds its prompts from: its lists, upstream's completions."""
    if jokes is None:
        return list(raw.values())
    missing = [j.index for j in jokes if str(j.index) not in raw]
    if missing:
        raise InputError(
            f"the run's jokes {missing[:5]} have no completions here, so its classify prompts cannot be built",
            file=raw_path,
        )
    return [build_raw_entry(j, raw[str(j.index)].models) for j in jokes]


def _import_verdicts(entries: list[RawCompletionEntry], classified_path: str, targets: LegacyTargets, put: Put) -> int:
    """One classify answer per batch of the run's prompts; the number of batches."""
    classified: ClassifiedCompletions = decode_file(classified_path, ClassifiedCompletions)
    count = 0
    for batch in batches(entries, size=targets.batch_size):
        verdicts: dict[str, dict[str, str]] = {}
        for item in batch:
            entry = classified.get(str(item.index))
            if entry is None:
                raise InputError("joke missing from the classified file", file=classified_path, record=item.index)
            verdicts[str(item.index)] = {w: entry.classifications.get(w, "other") for w in item.candidates}
        put(classify_request(targets.classify_provider, targets.classify_model, batch), [json.dumps(verdicts)])
        count += 1
    return count


def _import_cloze(cloze_path: str, tests_path: str, targets: LegacyTargets, put: Put, report: ImportReport) -> None:
    """The recorded cloze answers, keyed by the prompts of the tests they answer."""
    tests = load_cloze_tests(tests_path)
    responses = load_cloze_responses(cloze_path, tests)
    eval_models = targets.evaluate_models or UPSTREAM_MODELS
    for nick, answers in responses.items():
        model_id = eval_models.get(nick)
        if model_id is None:
            continue  # a model the run does not ask for
        for position, answer in answers.responses.items():
            put(cloze_request(targets.evaluate_provider, model_id, tests[int(position)]), [answer.raw_response])
            report.cloze_answers += 1
            report.cloze_words_differ += extract_word(answer.raw_response) != answer.extracted_word
