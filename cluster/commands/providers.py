"""``punchline fake-provider`` (the offline simulated provider as a foreground server) and
``punchline import-legacy`` (upstream checkpoints into the response cache)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import msgspec

from punchline.data.errors import ConfigError, InputError
from punchline.data.puns.schemas import PunEntry


def register(sub: Any) -> None:
    p = sub.add_parser(
        "fake-provider",
        help="serve the simulated LLM provider (OpenAI + Anthropic APIs) on 127.0.0.1",
        description="Serve the fake provider until Ctrl-C: POST /v1/chat/completions (OpenAI) and "
        "/v1/messages (Anthropic), GET /stats, POST /reset, POST /configure (JSON knobs). Answers are "
        "deterministic; faults (429, 5xx, hangs, truncated or empty bodies) are injected per the knobs. "
        "Point a provider at it with base_url = http://127.0.0.1:PORT/v1 (openai) or http://127.0.0.1:PORT "
        "(anthropic).",
    )
    p.add_argument("--port", type=int, default=8700, help="port to listen on (default 8700; 0 = any free port)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--config", help="TOML file of FakeConfig knobs (top-level keys, e.g. error_503_rate = 0.1)")
    p.add_argument("--puns", action="append", help="puns JSON file the fake answers from (repeatable)")
    p.add_argument(
        "--humor",
        action="append",
        help="Humor file (MERA JSON or parquet) whose references the fake knows (repeatable)",
    )
    p.set_defaults(func=cmd_fake_provider)

    i = sub.add_parser(
        "import-legacy",
        help="load upstream checkpoints (completions, verdicts, cloze answers) into the response cache",
        description="Store upstream's recorded answers in the response cache under the exact request keys a "
        "puns run computes, so that run re-pays for nothing and reproduces upstream's files: every completion "
        "of raw_completions.json, with --classified the judge verdicts of classified_completions.json, with "
        "--cloze the recorded cloze answers (cloze_benchmark_raw.json) of the tests in --tests. Provider and "
        "model ids come from --config (its [puns.collect], [puns.classify] and [puns.evaluate] tables; the "
        "classify prompts are built from the config's jokes and lists, as the run builds them) or default to "
        "upstream's: Together.ai Llama models and claude-sonnet-4-20250514 on provider 'anthropic'.",
    )
    i.add_argument("--raw", help="upstream raw_completions.json")
    i.add_argument("--classified", help="upstream classified_completions.json (the classify stage; needs --raw)")
    i.add_argument("--cloze", help="upstream cloze_benchmark_raw.json: recorded answers to the tests in --tests")
    i.add_argument("--tests", help="the cloze tests file the --cloze answers respond to (keys by position)")
    i.add_argument("--store", required=True, help="checkpoint store: a folder or s3://bucket/prefix")
    i.add_argument("--config", help="the run config whose requests should hit the imported answers")
    i.set_defaults(func=cmd_import_legacy)


def cmd_fake_provider(args: argparse.Namespace) -> int:
    import ipaddress

    from punchline.data.jsonio import validation_location
    from punchline.workers.fake.checks import check_simulator
    from punchline.workers.fake.server import FakeConfig, FakeProviderServer, load_knobs

    if not 0 <= args.port <= 65535:
        raise ConfigError(f"must be a port number 0-65535, got {args.port}", field="--port")
    try:
        ipaddress.ip_address(args.host)
    except ValueError:
        raise ConfigError(f"not an IP address: {args.host!r}", field="--host") from None
    config = FakeConfig()
    if args.config:
        try:
            config = load_knobs(args.config)
        except OSError as exc:
            raise ConfigError(f"cannot read: {exc.strerror}", file=args.config) from None
        except msgspec.ValidationError as exc:
            top, key, detail = validation_location(exc)
            raise ConfigError(detail, file=args.config, field=".".join(k for k in (top, key) if k) or None) from None
        except msgspec.DecodeError as exc:
            raise ConfigError(f"malformed TOML: {exc}", file=args.config) from None
        check_simulator(config, args.config, prefix="")
    for flag, paths in (("--puns", args.puns), ("--humor", args.humor)):
        for path in paths or ():
            if not Path(path).is_file():
                raise ConfigError("file not found", file=path, field=flag)
    if args.puns:
        config = msgspec.structs.replace(config, puns_path=list(args.puns))
    if args.humor:
        config = msgspec.structs.replace(config, humor_path=list(args.humor))
    server = FakeProviderServer(config, host=args.host, port=args.port)
    try:
        server.serve_forever(on_ready=lambda url: print(f"fake provider listening on {url}", flush=True))
    except KeyboardInterrupt:
        print("fake provider stopped", flush=True)
    return 0


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


def targets_from_config(path: str) -> LegacyTargets:
    from punchline.cluster.config import load_config
    from punchline.cluster.pipelines.puns import PunsSettings

    cfg = load_config(path)
    puns = cfg.settings
    if not isinstance(puns, PunsSettings):
        raise ConfigError("import-legacy needs a [puns] table", file=path)
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

    ``jokes`` are the run's jokes (:func:`punchline.cluster.pipelines.puns.run_jokes`): their lists decide
    which words the run's classify prompts ask about, so the verdicts are imported under those prompts.
    Without them the prompts are built from the lists recorded in ``raw_path`` (upstream's own).
    """
    from punchline.data.jsonio import decode_file
    from punchline.data.puns.classify import batches, classify_request
    from punchline.data.puns.cloze_run import cloze_request
    from punchline.data.puns.completions import build_raw_entry, greedy_request, sample_request, truncate_before_blank
    from punchline.data.puns.puns_io import load_cloze_responses, load_cloze_tests
    from punchline.data.puns.schemas import ClassifiedCompletions, RawCompletionEntry, RawCompletions
    from punchline.data.puns.words import extract_word
    from punchline.data.requests import ProviderRequest, ProviderResponse
    from punchline.data.response_cache import CachedResponse, ResponseCache
    from punchline.data.stores import open_store

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
        if classified_path:
            classified: ClassifiedCompletions = decode_file(classified_path, ClassifiedCompletions)
            entries: list[RawCompletionEntry] = list(raw.values())
            if jokes is not None:  # the run's stage 3 records: its lists, upstream's completions
                missing = [j.index for j in jokes if str(j.index) not in raw]
                if missing:
                    raise InputError(
                        f"the run's jokes {missing[:5]} have no completions here, so its classify prompts cannot "
                        "be built",
                        file=raw_path,
                    )
                entries = [build_raw_entry(j, raw[str(j.index)].models) for j in jokes]
            for batch in batches(entries, size=targets.batch_size):
                verdicts: dict[str, dict[str, str]] = {}
                for item in batch:
                    entry_c = classified.get(str(item.index))
                    if entry_c is None:
                        raise InputError(
                            "joke missing from the classified file", file=classified_path, record=item.index
                        )
                    verdicts[str(item.index)] = {w: entry_c.classifications.get(w, "other") for w in item.candidates}
                request = classify_request(targets.classify_provider, targets.classify_model, batch)
                put(request, [json.dumps(verdicts)])
                report.classify_batches += 1
    if cloze_path and tests_path:
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
    report.written = cache.put_many(collected)
    report.already_cached = len(collected) - report.written
    return report


def cmd_import_legacy(args: argparse.Namespace) -> int:
    if not (args.raw or args.cloze):
        raise ConfigError("nothing to import: give --raw (and --classified) and/or --cloze with --tests")
    from punchline.cluster.config import check_service_url

    check_service_url(args.store, "--store")
    if "://" not in args.store:
        from punchline.data.jsonio import check_out_dir

        check_out_dir(args.store, flag="--store")
    targets = targets_from_config(args.config) if args.config else LegacyTargets()
    jokes = None
    if args.config and args.classified:
        from punchline.cluster.config import load_config
        from punchline.cluster.pipelines.puns import run_jokes

        jokes = run_jokes(load_config(args.config))
    report = import_legacy(
        args.raw, args.classified, args.store, targets, jokes=jokes, cloze_path=args.cloze, tests_path=args.tests
    )
    print(describe_import(report, args.store))
    return 0


def describe_import(report: ImportReport, store: str) -> str:
    text = (
        f"imported {report.written} answers into {store} ({report.already_cached} were already cached, "
        f"{report.empty_answers} empty upstream answers kept as they were, "
        f"{report.classify_batches} classification batches, {report.cloze_answers} cloze answers)"
    )
    if report.cloze_words_differ:
        text += (
            f"; {report.cloze_words_differ} recorded cloze words differ from the first word a run extracts from "
            "the recorded text"
        )
    return text
