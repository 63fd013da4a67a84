"""Benchmark: the notebook API, ``punchline.prompts(DataFrame, ...)``, run as a notebook cell runs it.

    .venv/bin/python bench/notebook.py [--rows 36] [--n 3]

Against the simulated provider, in a runs folder in a temporary directory: the trivia sample
(``data/samples/prompts_sample.jsonl``; ``--rows`` more repeats it with new ids) as a pandas DataFrame,
one model x ``--n`` samples, answers parsed against a JSON schema. Three calls:

* the cell's first run (a new run: every request paid);
* the same cell again (the run id is the content's hash: the finished run answers, 0 requests);
* the same rows as a list of dicts (another data file, so another run: every answer from the response cache).

Prints one line per call: seconds, the rows of the DataFrame returned, the requests paid and the answers taken
from the response cache by that call.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd

import punchline

ROOT = Path(__file__).resolve().parents[1]
PROVIDERS = {
    "sim": {
        "kind": "openai",
        "base_url": "simulated",
        "models": {"8b": {"id": "sim-8b", "input_usd_per_mtok": 0.18, "output_usd_per_mtok": 0.18}},
    }
}
SCHEMA = {"type": "object", "required": ["answer"], "properties": {"answer": {"type": "string"}}}


def rows(count: int) -> list[dict[str, Any]]:
    sample = [json.loads(line) for line in (ROOT / "data/samples/prompts_sample.jsonl").read_text().splitlines()]
    out = []
    for i in range(count):
        row = sample[i % len(sample)]
        again = f" (asked again, #{i // len(sample)})" if i >= len(sample) else ""  # a new prompt: not a cache hit
        out.append({**row, "id": f"r{i:06d}", "question": row["question"] + again})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=36)
    parser.add_argument("--n", type=int, default=3)
    args = parser.parse_args()
    data = rows(args.rows)
    with tempfile.TemporaryDirectory() as tmp:
        runs = str(Path(tmp) / "runs")
        seen: dict[str, tuple[int, int]] = {}  # run id -> (requests, cache hits) its record had already
        for label, table in (("first run", pd.DataFrame(data)), ("same cell again", pd.DataFrame(data)),
                             ("list of dicts", data)):  # fmt: skip
            start = time.perf_counter()
            out = punchline.prompts(
                table,
                "Question: {{ question }}\nOptions: {{ options | join(' | ') }}",
                models=["8b"],
                n=args.n,
                parse=SCHEMA,
                providers=PROVIDERS,
                runs_dir=runs,
                max_tokens=64,
            )
            seconds = time.perf_counter() - start
            run_id, runs_used = out.attrs["punchline"]["run_id"], out.attrs["punchline"]["runs_dir"]
            counters = punchline.status(run_id, runs_dir=runs_used).counters["generate"]
            before = seen.get(run_id, (0, 0))
            seen[run_id] = (counters.provider_requests, counters.cache_hits)
            print(
                f"{label:16s} {seconds:6.2f} s  {len(out):6d} rows  run {run_id}  "
                f"requests {counters.provider_requests - before[0]}  cache hits {counters.cache_hits - before[1]}"
            )


if __name__ == "__main__":
    main()
