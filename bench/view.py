"""Benchmark: ``punchline view`` over a run of a million units.

    .venv/bin/python bench/view.py [--units 1000000] [--shard-size 100] [--keep DIR] [--cold]

Writes a finished run in the store's real format (run.json, plan pages cut by ``data.units.cut``, one shard
file per shard as a worker writes it, a stage manifest): one ``generate`` stage asking two models the same
prompts (``generate/r<row>/m<model>``, three samples each, 1% of the units failed), then starts ``punchline
view`` on it in a process of its own and prints: the time to open the run page, the first samples page (it
builds the stage's index), the time per page (random pages, a model's pages, two models compared, a scan for
failed units), ``/run/<id>/metrics`` and the latency-per-model page (both read the stage manifest's usage, which
the coordinator writes, not the shard files), and the server's RSS after all that.
``--cold``: the run's files are dropped from the page cache first (``posix_fadvise``, those files only), as after a
reboot or on a run larger than the memory. Targets (issue 31): open < 2 s, a page < 200 ms, RSS < 300 MB.
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
from pathlib import Path

import msgspec

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from punchline.cluster.records.run_record import RunRecord, Services  # noqa: E402
from punchline.data.requests import Message, ProviderRequest, ProviderResponse  # noqa: E402
from punchline.data.stores.local import LocalStore  # noqa: E402
from punchline.data.units import (  # noqa: E402
    PlanPage,
    ShardOutput,
    ShardUsage,
    StageManifest,
    UnitResult,
    UnitSpec,
    cut,
    encode_page,
    plan_page_key,
    shard_key,
)
from punchline.schedulers.ledger import StageCounters  # noqa: E402

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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--units", type=int, default=1_000_000)
    ap.add_argument("--shard-size", type=int, default=100)
    ap.add_argument("--keep", help="write the run here (and reuse it if there)")
    ap.add_argument("--cold", action="store_true", help="drop the run's files from the page cache first")
    args = ap.parse_args()
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
