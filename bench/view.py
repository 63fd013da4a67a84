"""Benchmark: ``punchline view`` over a run of a million units with a judge stage.

    .venv/bin/python bench/view.py [--units 1000000] [--shard-size 100] [--keep DIR] [--cold]
    .venv/bin/python bench/view.py --synthetic [--units N] ...    # issue 31's one-stage run and its figures

The run has the files a real run has: a real small run first (``punchline init`` then ``punchline run
configs/prompts_demo.toml``, the prompts demo with its judge, against the offline simulated provider: its
run.json, log, artifacts, stage manifests with usage), then scaled up (:func:`scale`) with the engine's own
writers: its units and answers repeated over ``--units / 2`` rows x its two models (one sample each), the
plan pages cut by ``data.units.cut`` and encoded by ``encode_page``, one shard file per shard as a worker writes
it, a judge stage of one unit per answer (``judge/r<row>/m<model>/s0000``), ``outputs.jsonl``/``answers.jsonl``
written by the generic stages' ``jsonl_chunks``, the stage manifests' usage summed as the coordinator does
(``outputs.parquet`` stays the small run's). The last row's question holds a word no other row has.

Then ``punchline view`` in a process of its own, and: the first answers page cold (a fresh server and no index
kept under ``runs/_view/``) and warm (the stage indexes built), a page further on, a text search for the last
row's word, sorting by the judge's score (the first time builds the order), ``HEAD``, and again after a restart
(the kept indexes). Targets (issue 41): the first answers page < 0.5 s cold; the last row's word found < 2 s.
``--cold``: the run's files are dropped from the page cache first (``posix_fadvise``, those files only).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import msgspec

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from punchline.cluster.records.run_record import RunRecord, Services  # noqa: E402
from punchline.cluster.stages.outputs import OUTPUT_NAMES, OutputRow, jsonl_chunks  # noqa: E402
from punchline.cluster.stages.outputs import Layout as Columns  # noqa: E402
from punchline.data.requests import Message, ProviderRequest, ProviderResponse  # noqa: E402
from punchline.data.storage.run_layout import RunLayout  # noqa: E402
from punchline.data.stores.local import LocalStore  # noqa: E402
from punchline.data.units import (  # noqa: E402
    PlanPage,
    ShardOutput,
    ShardUsage,
    StageManifest,
    UnitResult,
    UnitSpec,
    cut,
    decode_page,
    encode_page,
    plan_page_key,
    shard_key,
)
from punchline.schedulers.ledger import StageCounters  # noqa: E402

MARKER = "zanzibarquokka"  # a word only the last row's question has
INPUT_COLUMNS = ("id", "topic", "question", "options", "answer")  # the demo's rows' columns
MODELS = ("meta-llama/Meta-Llama-3.1-8B-Instruct-Turbo", "meta-llama/Meta-Llama-3.1-70B-Instruct-Turbo")
CONFIG = """[run]
pipeline = "prompts"
shard_size = {shard_size}

[providers.together]
kind = "openai"
base_url = "simulated"

[providers.together.models]
"8b" = {{ id = "{m0}", input_usd_per_mtok = 0.18, output_usd_per_mtok = 0.18 }}
"70b" = {{ id = "{m1}", input_usd_per_mtok = 0.88, output_usd_per_mtok = 0.88 }}
"""


def unit(i: int) -> UnitSpec:
    row, m = divmod(i, len(MODELS))
    prompt = f"Question {row}: which planet has the most moons, and how many were known in year {1900 + row % 120}?"
    return UnitSpec(
        unit_id=f"generate/r{row:09d}/m{m:04d}",
        request=ProviderRequest(
            provider="together",
            model=MODELS[m],
            messages=(Message("system", "You answer trivia questions. Reply with JSON only."), Message("user", prompt)),
            temperature=0.7,
            max_tokens=64,
            n=3,
        ),
    )


def result(spec: UnitSpec, rng: random.Random) -> UnitResult:
    key = f"{rng.getrandbits(160):040x}"
    if rng.random() < 0.01:
        return UnitResult(unit_id=spec.unit_id, key=key, error="400 Bad Request: the prompt was refused")
    texts = [f'{{"answer": "Saturn", "confidence": {rng.random():.2f}}}' for _ in range(3)]
    big = spec.request.model == MODELS[1]  # the larger model answers slower, and is retried more often
    return UnitResult(
        unit_id=spec.unit_id,
        key=key,
        response=ProviderResponse(texts=texts, input_tokens=58, output_tokens=30, model=spec.request.model),
        latency_s=round((3.0 if big else 0.2) + rng.expovariate(1.0), 3),
        retries=int(rng.random() < (0.1 if big else 0.02)),
    )


def generate(root: Path, run_id: str, units: int, shard_size: int) -> None:
    store = LocalStore(root)
    encoder = msgspec.msgpack.Encoder()
    rng = random.Random(7)
    counters = StageCounters(units_total=units, started_at=time.time() - 3600)
    total = ShardUsage()  # what the coordinator sums into the stage's manifest

    def on_page(page: PlanPage) -> None:
        store.put(plan_page_key(run_id, "generate", page.first_shard // 64), encode_page(page))
        for offset, specs in enumerate(page.shards):
            results = [result(s, rng) for s in specs]
            usage = ShardUsage(
                units_ok=sum(r.error is None for r in results), units_failed=sum(r.error is not None for r in results)
            )
            for s, r in zip(specs, results, strict=True):
                if r.response is not None:
                    usage.add_call(s.request.model, 58, 30, 88 * 0.88e-6)
                usage.add_unit(s.request.model, r.latency_s, r.retries)
            counters.units_done += usage.units_ok
            counters.units_failed += usage.units_failed
            counters.provider_requests += usage.units_ok
            total.add(usage)
            shard = page.first_shard + offset
            output = ShardOutput(stage="generate", shard=shard, results=results, usage=usage)
            store.put(shard_key(run_id, "generate", shard), encoder.encode(output))

    shape = cut("generate", (unit(i) for i in range(units)), shard_size, 64, on_page)
    counters.shards_total = counters.shards_done = shape.shards_total
    store.put(f"{run_id}/stages/generate/plan.sha256", shape.digest.encode())
    counters.updated_at = time.time()
    manifest = StageManifest(
        stage="generate", units=units, shards=shape.shards_total, failed=0, artifacts=[], usage=total
    )
    store.put(f"{run_id}/stages/generate/manifest.json", msgspec.json.encode(manifest))
    record = RunRecord(
        run_id=run_id,
        pipeline="prompts",
        config_path="bench.toml",
        config_toml=CONFIG.format(shard_size=shard_size, m0=MODELS[0], m1=MODELS[1]),
        created_at=time.time() - 3600,
        finished_at=time.time(),
        services=Services(redis_url="redis://127.0.0.1:1/0", store_url=str(root)),
        stages=["generate"],
        state="finished",
        counters={"generate": counters},
        usage=[],
        failures={"generate": {}},
    )
    store.put(f"{run_id}/run.json", msgspec.json.encode(record))


def fetch(url: str) -> tuple[float, bytes]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as resp:
        body = resp.read()
    return time.perf_counter() - started, body


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def synthetic(args: argparse.Namespace) -> None:
    """Issue 31's bench: one generate stage of two models, random pages, filters, comparison, models page."""
    root = Path(args.keep or tempfile.mkdtemp(prefix="punchline-view-bench-"))
    run_id = f"bench-{args.units}"
    if not (root / run_id / "run.json").exists():
        started = time.perf_counter()
        generate(root, run_id, args.units, args.shard_size)
        took = time.perf_counter() - started
        print(f"wrote {args.units:,} units ({args.units // args.shard_size:,} shards) in {took:.1f} s")
    size = sum(p.stat().st_size for p in (root / run_id).rglob("*") if p.is_file())
    print(f"run on disk: {size / 1e6:.0f} MB under {root}")
    env = {**os.environ, "HOME": tempfile.mkdtemp()}
    shutil.rmtree(root / "_view", ignore_errors=True)  # the indexes a viewer kept: this bench measures building one
    if args.cold:
        drop_from_cache(root / run_id)
    proc, base = start_view(root, run_id, env)
    try:
        print(f"server RSS at start: {rss_mb(proc.pid):.0f} MB")
        took, _ = fetch(base)
        print(f"open the run page:            {took * 1000:7.0f} ms")
        took, body = fetch(f"{base}/models")
        how = "partial: the rest of the shards read in the background" if b"partial:" in body else "whole"
        print(f"latency per model page, cold: {took * 1000:7.0f} ms ({how})")
        took, _ = fetch(f"{base}/samples")
        print(f"first samples page:           {took * 1000:7.0f} ms")
        rng = random.Random(1)
        pages = args.units // 25
        times = [fetch(f"{base}/samples?page={rng.randrange(pages)}")[0] for _ in range(10)]
        print(
            f"{'random pages, index building:':30s}{statistics.median(times) * 1000:7.0f} ms median, "
            f"{max(times) * 1000:.0f} ms max (10 pages, while the run page's background build runs)"
        )
        took, _ = fetch(f"{base}/samples?model={MODELS[1]}")
        print(f"first page of one model:      {took * 1000:7.0f} ms (waits for the index if not built yet)")
        cases = {
            "a random page": lambda: f"{base}/samples?page={rng.randrange(pages)}",
            "a page of one model": lambda: f"{base}/samples?model={MODELS[1]}&page={rng.randrange(pages // 2)}",
            "two models compared": lambda: (
                f"{base}/samples?model={MODELS[0]}&compare={MODELS[1]}&page={rng.randrange(pages // 2)}"
            ),
            "failed units (a scan)": lambda: f"{base}/samples?failed=1&after={rng.randrange(args.units - 5000)}",
            "free-text search (a scan)": lambda: f"{base}/samples?q=year+1999&after={rng.randrange(args.units - 5000)}",
        }
        for name, make in cases.items():
            times = [fetch(make())[0] for _ in range(10)]
            print(
                f"{name + ':':30s}{statistics.median(times) * 1000:7.0f} ms median, "
                f"{max(times) * 1000:.0f} ms max (10 pages)"
            )
        took, _ = fetch(f"{base}/metrics")
        print(f"/metrics, first:               {took * 1000:6.0f} ms")
        took, _ = fetch(f"{base}/metrics")
        print(f"/metrics, again:               {took * 1000:6.0f} ms")
        times = [fetch(f"{base}/models")[0] for _ in range(10)]
        print(
            f"{'latency per model page:':30s}{statistics.median(times) * 1000:7.0f} ms median, "
            f"{max(times) * 1000:.0f} ms max (10 pages)"
        )
        print(f"server RSS after:              {rss_mb(proc.pid):6.0f} MB")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    proc, base = start_view(root, run_id, env)  # started again: it reads the index it kept
    try:
        took, _ = fetch(base)
        print(f"started again, run page:       {took * 1000:6.0f} ms")
        took, _ = fetch(f"{base}/samples?model={MODELS[0]}&page=777")
        print(f"started again, a model's page: {took * 1000:6.0f} ms (the kept index)")
        print(f"server RSS then:               {rss_mb(proc.pid):6.0f} MB")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def real_run(folder: Path) -> Path:
    """A real small run: the prompts demo (two models x 3 samples over 36 rows, parsed, then judged), offline."""
    env = {**os.environ, "HOME": str(folder / "home")}
    cli = str(ROOT / ".venv/bin/punchline")
    subprocess.run([cli, "init", "."], cwd=folder, env=env, check=True, capture_output=True)
    subprocess.run([cli, "run", "configs/prompts_demo.toml"], cwd=folder, env=env, check=True, capture_output=True)
    found = [p for p in (folder / "runs").iterdir() if (p / "run.json").is_file()]
    if len(found) != 1:
        raise SystemExit(f"expected one run under {folder / 'runs'}, found {found}")
    return found[0]


def _units(run: Path, stage: str) -> list[UnitSpec]:
    return [
        u
        for p in sorted((run / "stages" / stage / "plan").iterdir())
        for s in decode_page(p.read_bytes()).shards
        for u in s
    ]


def _results(run: Path, stage: str) -> dict[str, UnitResult]:
    decoder = msgspec.msgpack.Decoder(ShardOutput)
    return {
        r.unit_id: r
        for p in (run / "stages" / stage / "shards").iterdir()
        for r in decoder.decode(p.read_bytes()).results
    }


def scale(real: Path, root: Path, run_id: str, rows: int, shard_size: int, word: str = MARKER) -> None:
    """The real run ``real`` as a run ``run_id`` of ``rows`` rows x its models, one sample each, under ``root`` (see
    the module's docstring): its units and answers repeated (row ``i`` is the real run's row ``i % 36``), written
    with the engine's writers; the last row's question holds ``word``."""
    store = LocalStore(root)
    layout = RunLayout(run_id)
    encoder = msgspec.msgpack.Encoder()
    record = msgspec.json.decode((real / "run.json").read_bytes(), type=RunRecord)
    gen_units = {u.unit_id: u for u in _units(real, "generate")}
    judge_units = {u.unit_id: u for u in _units(real, "judge")}
    gen_results, judge_results = _results(real, "generate"), _results(real, "judge")
    real_rows = [msgspec.json.decode(line) for line in (real / "artifacts" / "outputs.jsonl").read_bytes().splitlines()]
    models = sorted({u.unit_id.split("/")[2] for u in gen_units.values()})
    inputs_of = {r["row_id"]: {k: v for k, v in r.items() if k in INPUT_COLUMNS} for r in real_rows}
    row_ids = list(dict.fromkeys(r["row_id"] for r in real_rows))
    base = len(row_ids)

    def question(i: int, text: str) -> str:
        return text.replace("?", f" {word}?", 1) if i == rows - 1 else text

    def gen(i: int, m: str) -> UnitSpec:
        t = gen_units[f"generate/r{i % base:09d}/{m}"]
        messages = tuple(Message(x.role, question(i, x.content)) for x in t.request.messages)
        request = msgspec.structs.replace(t.request, messages=messages, n=1)
        return UnitSpec(unit_id=f"generate/r{i:09d}/{m}", request=request)

    def judge(i: int, m: str) -> UnitSpec:
        t = judge_units[f"judge/r{i % base:09d}/{m}/s0000"]
        messages = tuple(Message(x.role, question(i, x.content)) for x in t.request.messages)
        return UnitSpec(
            unit_id=f"judge/r{i:09d}/{m}/s0000", request=msgspec.structs.replace(t.request, messages=messages)
        )

    def answer(stage: str, spec: UnitSpec) -> UnitResult:
        row = int(spec.unit_id.split("/")[1][1:])
        real_id = spec.unit_id.replace(f"/r{row:09d}/", f"/r{row % base:09d}/", 1)
        r = (gen_results if stage == "generate" else judge_results)[real_id]
        response = r.response
        if response is not None:
            response = msgspec.structs.replace(
                response, texts=response.texts[:1], finish_reasons=response.finish_reasons[:1]
            )
        return msgspec.structs.replace(r, unit_id=spec.unit_id, response=response)

    counters: dict[str, StageCounters] = {}
    for stage, make in (("generate", gen), ("judge", judge)):
        units = (make(i, m) for i in range(rows) for m in models)
        c = counters[stage] = StageCounters(started_at=time.time() - 3600)
        total = ShardUsage()

        def on_page(page: PlanPage, stage: str = stage, c: StageCounters = c, total: ShardUsage = total) -> None:
            store.put(plan_page_key(run_id, stage, page.first_shard // 64), encode_page(page))
            for offset, specs in enumerate(page.shards):
                results = [answer(stage, s) for s in specs]
                usage = ShardUsage(
                    units_ok=sum(r.error is None for r in results),
                    units_failed=sum(r.error is not None for r in results),
                )
                for s, r in zip(specs, results, strict=True):
                    if r.response is not None:
                        usage.add_call(s.request.model, r.response.input_tokens, r.response.output_tokens, 1e-5)
                    usage.add_unit(s.request.model, r.latency_s, r.retries)
                c.units_done += usage.units_ok
                c.units_failed += usage.units_failed
                c.provider_requests += usage.units_ok
                total.add(usage)
                shard = page.first_shard + offset
                output = ShardOutput(stage=stage, shard=shard, results=results, usage=usage)
                store.put(shard_key(run_id, stage, shard), encoder.encode(output))

        shape = cut(stage, units, shard_size, 64, on_page)
        c.units_total, c.shards_total, c.shards_done, c.updated_at = (
            shape.units_total,
            shape.shards_total,
            shape.shards_total,
            time.time(),
        )
        store.put(layout.plan_digest(stage), shape.digest.encode())
        manifest = StageManifest(
            stage=stage, units=shape.units_total, shards=shape.shards_total, failed=0, artifacts=[]
        )
        manifest.usage = total
        store.put(layout.manifest(stage), msgspec.json.encode(manifest))

    real_outputs = {(r["row_id"], r["model"]): r for r in real_rows if r["sample"] == 0}
    nicks = list(dict.fromkeys(r["model"] for r in real_rows))

    def output_rows(with_inputs: bool) -> Iterator[tuple[OutputRow, dict[str, object]]]:
        for i in range(rows):
            real_id = row_ids[i % base]
            fields = dict(inputs_of[real_id], id=f"q{i:07d}")
            fields["question"] = question(i, str(fields["question"]))
            for nick in nicks:
                out = msgspec.convert(
                    {k: v for k, v in real_outputs[(real_id, nick)].items() if k in OUTPUT_NAMES}, OutputRow
                )
                yield msgspec.structs.replace(out, row_id=fields["id"]), fields if with_inputs else {}

    columns = Columns([inputs_of[row_ids[0]]])
    store.put(layout.artifact("outputs.jsonl"), b"".join(jsonl_chunks(output_rows(True), columns)))
    store.put(layout.artifact("answers.jsonl"), b"".join(jsonl_chunks(output_rows(False))))
    shutil.copy(real / "artifacts" / "outputs.parquet", root / layout.artifact("outputs.parquet"))
    shutil.copy(real / "log.jsonl", root / layout.log)
    record = msgspec.structs.replace(
        record,
        run_id=run_id,
        config_toml=record.config_toml.replace("n = 3 ", "n = 1 ").replace(
            "shard_size = 8", f"shard_size = {shard_size}"
        ),
        services=Services(redis_url="redis://127.0.0.1:1/0", store_url=str(root)),
        counters=counters,
        failures={s: {} for s in counters},
    )
    store.put(layout.record, msgspec.json.encode(record))


def timed(url: str, method: str = "GET") -> tuple[float, int, bytes]:
    request = urllib.request.Request(url, method=method)
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=300) as resp:
        body = resp.read()
        status = resp.status
    return time.perf_counter() - started, status, body


def wait_for(path: Path, timeout_s: float = 600) -> float:
    started = time.perf_counter()
    while not path.exists() and time.perf_counter() - started < timeout_s:
        time.sleep(0.1)
    return time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--units", type=int, default=1_000_000, help="generate's units (rows x 2 models); judge has as many"
    )
    ap.add_argument("--shard-size", type=int, default=100)
    ap.add_argument("--keep", help="write the run here (and reuse it if there)")
    ap.add_argument("--cold", action="store_true", help="drop the run's files from the page cache first")
    ap.add_argument("--synthetic", action="store_true", help="issue 31's one-stage bench instead")
    args = ap.parse_args()
    if args.synthetic:
        synthetic(args)
        return
    root = Path(args.keep or tempfile.mkdtemp(prefix="punchline-view-bench-"))
    run_id = f"judged-{args.units}"
    if not (root / run_id / "run.json").exists():
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="punchline-view-real-") as scratch:
            real = real_run(Path(scratch))
            print(f"a real run of the prompts demo (36 rows, judged): {time.perf_counter() - started:.1f} s")
            started = time.perf_counter()
            scale(real, root, run_id, args.units // 2, args.shard_size)
        print(
            f"scaled to {args.units:,} generate + {args.units:,} judge units in {time.perf_counter() - started:.1f} s"
        )
    size = sum(p.stat().st_size for p in (root / run_id).rglob("*") if p.is_file())
    print(f"run on disk: {size / 1e6:.0f} MB under {root}")
    env = {**os.environ, "HOME": tempfile.mkdtemp()}
    shutil.rmtree(root / "_view", ignore_errors=True)  # a fresh viewer: no index kept
    if args.cold:
        drop_from_cache(root / run_id)
    proc, base = start_view(root, run_id, env)
    last = f"generate/r{args.units // 2 - 1:09d}/"
    try:
        took, _, body = timed(f"{base}/samples?stage=generate")
        judged = body.count(b"judged by")
        print(f"first answers page, cold (no index):  {took * 1000:7.0f} ms ({judged} of 25 with their judge)")
        took, _, _ = timed(f"{base}/samples?stage=generate&page=20000")
        print(f"page 20,000, cold:                    {took * 1000:7.0f} ms")
        took, _, body = timed(f"{base}/samples?stage=generate&q={MARKER}")
        found = last.encode() in body
        print(f"the last row's word, searched, cold:  {took * 1000:7.0f} ms (found: {found}; waits for the kept text)")
        timed(base)  # the run page: it starts building the stage indexes in the background
        built = wait_for(root / "_view" / run_id / "judge.idx")
        print(f"the stage indexes built in:           {built:7.1f} s (background, after the run page)")
        built += wait_for(root / "_view" / run_id / "generate.text.starts")
        print(f"generate's searchable text kept in:   {built:7.1f} s (background, after the run page)")
        times = [timed(f"{base}/samples?stage=generate")[0] for _ in range(5)]
        print(f"first answers page, warm:             {statistics.median(times) * 1000:7.0f} ms median of 5")
        rng = random.Random(1)
        times = [timed(f"{base}/samples?stage=generate&page={rng.randrange(args.units // 25)}")[0] for _ in range(10)]
        print(f"a random answers page, warm:          {statistics.median(times) * 1000:7.0f} ms median of 10")
        took, _, body = timed(f"{base}/samples?stage=generate&q={MARKER}")
        print(
            f"the last row's word, searched:        {took * 1000:7.0f} ms (found: {last.encode() in body}; kept text)"
        )
        took, _, body = timed(f"{base}/samples?stage=generate&sort=score")
        print(f"sorted by the judge's score, first:   {took * 1000:7.0f} ms (builds the order)")
        took, _, body = timed(f"{base}/samples?stage=generate&sort=-score")
        print(f"sorted by the judge's score, desc:    {took * 1000:7.0f} ms")
        times = [timed(f"{base}/samples?stage=generate&sort=score&page={rng.randrange(1000)}")[0] for _ in range(5)]
        print(f"a sorted page, again:                 {statistics.median(times) * 1000:7.0f} ms median of 5")
        took, _, body = timed(f"{base}/samples?stage=generate&sort=-parsed.confidence")
        print(f"sorted by parsed confidence, first:   {took * 1000:7.0f} ms (builds the order)")
        took, status, body = timed(base, "HEAD")
        print(
            f"HEAD of the run page:                 {took * 1000:7.0f} ms (status {status}, {len(body)} bytes of body)"
        )
        took, status, body = timed(f"{base}/samples?stage=generate", "HEAD")
        print(
            f"HEAD of the answers page:             {took * 1000:7.0f} ms (status {status}, {len(body)} bytes of body)"
        )
        print(f"server RSS after:                     {rss_mb(proc.pid):7.0f} MB")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    if args.cold:
        drop_from_cache(root / run_id)
    proc, base = start_view(root, run_id, env)  # started again: it reads the indexes and orders it kept
    try:
        took, _, _ = timed(f"{base}/samples?stage=generate")
        print(f"restarted, first answers page:        {took * 1000:7.0f} ms (the kept indexes)")
        took, _, _ = timed(f"{base}/samples?stage=generate&sort=-score&page=3")
        print(f"restarted, a page sorted by score:    {took * 1000:7.0f} ms (the kept order)")
        took, _, body = timed(f"{base}/samples?stage=generate&q={MARKER}")
        print(f"restarted, the last row's word:       {took * 1000:7.0f} ms (found: {last.encode() in body})")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def drop_from_cache(folder: Path) -> None:
    """Evict these files' pages from the page cache (only theirs: the machine's other work keeps its cache)."""
    for path in folder.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)  # dirty pages are not dropped: written back first
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def start_view(root: Path, run_id: str, env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [str(ROOT / ".venv/bin/punchline"), "view", "--runs-dir", str(root), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    found = re.search(r"http://127\.0\.0\.1:(\d+)", line)
    if not found:
        proc.kill()
        raise SystemExit(f"no URL from punchline view: {line!r}")
    return proc, f"http://127.0.0.1:{found.group(1)}/run/{run_id}"


if __name__ == "__main__":
    main()
