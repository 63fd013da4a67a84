"""Benchmark: what the everyday commands cost to start, this checkout against another one, interleaved.

    .venv/bin/python bench/import_cost.py --against DIR [--repeat 9]

``DIR`` is another tree of the project (e.g. ``git archive main | tar -x -C DIR``); its code is run with
this venv's interpreter by putting ``DIR`` first on ``PYTHONPATH``. For ``--help``, ``runs``, ``status``
and ``plan`` the two trees are run in turn, ``--repeat`` times each, and the median **CPU** seconds of the
command's process (user + system, which a loaded machine inflates far less than wall time) are compared;
the ratio is the figure that carries. Also printed: how many modules each imports, and any of the heavy
optional libraries (ray, the provider SDKs, boto3, matplotlib, pyarrow, jinja2) it imported, which must
be none for these commands. Bytecode is cached under a temporary folder, as an installed copy has it.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import msgspec

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from punchline.cluster.run.driver import RunRecord, Services  # noqa: E402

HEAVY = ("ray", "openai", "anthropic", "boto3", "botocore", "matplotlib", "pyarrow", "jinja2")


def finished_run(runs: Path) -> str:
    """A finished run's record, for ``status`` (no services: it is read from the runs folder)."""
    record = RunRecord(
        run_id="bench-1",
        pipeline="bench",
        config_path="bench.toml",
        config_toml="",
        created_at=0.0,
        state="finished",
        services=Services(redis_url="redis://127.0.0.1:1/0", store_url=str(runs / "_store")),
        stages=["only"],
    )
    (runs / record.run_id).mkdir(parents=True)
    (runs / record.run_id / "run.json").write_bytes(msgspec.json.encode(record))
    return record.run_id


def one(argv: list[str], env: dict[str, str]) -> tuple[float, int, list[str]]:
    """CPU seconds of one command's process, its module count and the heavy libraries it imported."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "punchline.cluster.cli.main", *argv],
        env=env,
        cwd=tempfile.gettempdir(),
        capture_output=True,
        text=True,
        check=False,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    modules = [line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")]
    heavy = sorted({m for m in modules[1:] if m.partition(".")[0] in HEAVY})
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), len(modules) - 1, heavy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", required=True, help="the other tree (its punchline/ beside cluster/, data/, ...)")
    ap.add_argument("--repeat", type=int, default=9)
    args = ap.parse_args()
    other = Path(args.against).resolve()
    if not (other / "punchline" / "__init__.py").is_file():
        raise SystemExit(f"{other} holds no punchline/ package")
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp) / "runs"
        run_id = finished_run(runs)
        commands = {
            "--help": ["--help"],
            "runs": ["runs", "--runs-dir", str(runs)],
            "status": ["status", run_id, "--runs-dir", str(runs)],
            "plan": ["plan", str(ROOT / "configs" / "demo.toml")],
        }
        base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        base["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pyc")
        envs = {"this": {**base, "PYTHONPATH": ""}, "other": {**base, "PYTHONPATH": str(other)}}
        print(f"{'command':<8} {'other cpu s':>11} {'this cpu s':>10} {'this/other':>10}  modules (other/this)  heavy")
        for name, argv in commands.items():
            runs_of: dict[str, list[tuple[float, int, list[str]]]] = {"this": [], "other": []}
            for _ in range(args.repeat):
                for side, env in envs.items():
                    runs_of[side].append(one(argv, env))
            cpu = {side: statistics.median(r[0] for r in got) for side, got in runs_of.items()}
            mods = {side: got[-1][1] for side, got in runs_of.items()}
            heavy = sorted({h for got in runs_of.values() for r in got for h in r[2]})
            print(
                f"{name:<8} {cpu['other']:>11.2f} {cpu['this']:>10.2f} {cpu['this'] / cpu['other']:>10.2f}  "
                f"{mods['other']:>7} / {mods['this']:<11} {', '.join(heavy) or 'none'}"
            )


if __name__ == "__main__":
    main()
