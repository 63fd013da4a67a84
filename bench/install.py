"""Benchmark: a stranger's first `make run`: from a fresh clone to the demo's first provider call.

    python3 bench/install.py [--rev HEAD] [--repeat 1] [--only make-run|all-extras] [--weights 12] [--keep]

Each way starts from a fresh clone of this repository (``--rev``) in a new temporary folder, with an empty
HOME (no pip cache, no ``~/.ray``, nothing configured) and no virtual environment on PATH, and runs:

* ``make-run``: ``make run``, as the README says (the venv, the runtime's install, the demo);
* ``all-extras``: the old way, what ``make run`` did before issue 41: the venv, ``pip install --upgrade pip``,
  ``pip install -e '.[cluster,test,docs]'`` (the test tools, the docs site and Ray's dashboard packages:
  ``ray[default]`` was then a runtime dependency, today the ``cluster`` extra), then ``punchline run`` of the
  demo.

It prints, for each: seconds from the command's start to the driver's start (the install and the CLI's
import), to the demo's first provider call, and to its end; the ``.venv`` folder's size (``du``) and how
many distributions it holds. The first call is read from the run's log (``runs/demo-*/log.jsonl``): the
first ``shard_done`` event's time less its ``elapsed_s`` is when a worker began the first shard, whose
first request follows at once (the log has no event per call). ``--weights N``: the N heaviest folders
of the ``make run`` venv's site-packages. The ways alternate in order across ``--repeat`` rounds; pip
reaches the same indexes as the machine's pip (its config is the machine's, not HOME's). Only the
standard library: run it with any Python 3.11.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The old way, spelled as the Makefile spelled it before issue 41 (its `$(STAMP)` recipe, then `run`).
ALL_EXTRAS = (
    "test -x .venv/bin/python || python3 -m venv .venv && "
    ".venv/bin/python -m pip install --quiet --upgrade pip && "
    ".venv/bin/python -m pip install --quiet -e '.[cluster,test,docs]' && "
    ".venv/bin/punchline run configs/demo.toml"
)
WAYS = {"make-run": ["make", "run"], "all-extras": ["bash", "-c", ALL_EXTRAS]}
POLL_S = 0.2


@dataclass
class Measured:
    way: str
    driver_s: float | None  # the command's start -> `punchline run` entered (its start_phases.driver_start)
    first_call_s: float | None  # -> the first shard begun (its first provider call)
    total_s: float  # -> the command's end (the demo finished)
    venv_bytes: int  # du of .venv (disk usage)
    distributions: int  # *.dist-info in the venv's site-packages


def stranger_env(home: Path) -> dict[str, str]:
    """The machine's environment as a stranger's shell has it: HOME empty, no venv on PATH, nothing of
    punchline's, Ray's or Python's set."""
    dropped = ("PUNCHLINE_", "RAY_", "XDG_", "PYTHON", "VIRTUAL_ENV", "CONDA")
    env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
    path = [
        p for p in env.get("PATH", "/usr/bin:/bin").split(os.pathsep) if not (Path(p).parent / "pyvenv.cfg").is_file()
    ]
    env.update(
        PATH=os.pathsep.join(path),
        HOME=str(home),
        XDG_CACHE_HOME=str(home / ".cache"),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_DATA_HOME=str(home / ".local" / "share"),
    )
    return env


def _unix(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def run_marks(runs: Path) -> tuple[float | None, float | None]:
    """(the driver's start, the first shard's start) in unix seconds, from the demo's log; None: not yet."""
    driver = first = None
    for log in runs.glob("demo-*/log.jsonl"):
        for line in log.read_text(errors="replace").splitlines():
            if '"start_phases"' not in line and '"shard_done"' not in line:
                continue
            try:
                event = json.loads(line)
            except ValueError:  # the line being written
                continue
            if event.get("event") == "start_phases" and driver is None:
                driver = float(event["driver_start"])
            elif event.get("event") == "shard_done":
                began = _unix(event["timestamp"]) - float(event.get("elapsed_s", 0.0))
                first = began if first is None else min(first, began)
    return driver, first


def venv_weight(venv: Path) -> tuple[int, int]:
    """(du of the venv in bytes, its distributions)."""
    du = subprocess.run(["du", "-sk", str(venv)], capture_output=True, text=True, check=True)
    dists = len(list(venv.glob("lib/python*/site-packages/*.dist-info")))
    return int(du.stdout.split()[0]) * 1024, dists


def heaviest(venv: Path, count: int) -> list[tuple[int, str]]:
    """The ``count`` heaviest entries of the venv's site-packages (KiB, name)."""
    (site,) = venv.glob("lib/python*/site-packages")
    du = subprocess.run(["du", "-sk", *map(str, site.iterdir())], capture_output=True, text=True, check=True)
    rows = [(int(size), Path(path).name) for size, path in (ln.split("\t", 1) for ln in du.stdout.splitlines())]
    return sorted(rows, reverse=True)[:count]


def measure(way: str, rev: str, *, keep: bool, weights: int) -> Measured:
    tmp = Path(tempfile.mkdtemp(prefix=f"punchline-install-{way}-"))
    clone, home = tmp / "punchline", tmp / "home"
    home.mkdir()
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "--quiet", rev], check=True)
    out = tmp / "output.txt"
    try:
        with out.open("wb") as sink:
            start = time.time()
            proc = subprocess.Popen(WAYS[way], cwd=clone, env=stranger_env(home), stdout=sink, stderr=subprocess.STDOUT)
            while proc.poll() is None:
                time.sleep(POLL_S)
            total = time.time() - start
        if proc.returncode != 0:
            raise SystemExit(f"{way} failed ({proc.returncode}): {out.read_text(errors='replace')[-3000:]}")
        driver, first = run_marks(clone / "runs")
        size, dists = venv_weight(clone / ".venv")
        if weights and way == "make-run":
            print(f"the {weights} heaviest entries of the make-run venv's site-packages (MiB):")
            for kib, name in heaviest(clone / ".venv", weights):
                print(f"  {kib / 1024:8.1f}  {name}")
        return Measured(
            way,
            None if driver is None else driver - start,
            None if first is None else first - start,
            total,
            size,
            dists,
        )
    finally:
        if keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--rev", default="HEAD", help="the commit to clone (default HEAD: uncommitted changes are not in it)"
    )
    ap.add_argument("--repeat", type=int, default=1, help="rounds, the ways' order alternating")
    ap.add_argument("--only", choices=sorted(WAYS), help="one way only")
    ap.add_argument("--weights", type=int, default=12, help="list the N heaviest site-packages entries (0: none)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folders (printed)")
    args = ap.parse_args()
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.rev], capture_output=True, text=True)
    if rev.returncode != 0:
        raise SystemExit(f"--rev {args.rev}: {rev.stderr.strip()}")
    ways = [args.only] if args.only else ["make-run", "all-extras"]
    print(f"commit {rev.stdout.strip()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at the start")
    found: list[Measured] = []
    for round_ in range(args.repeat):
        for way in ways if round_ % 2 == 0 else ways[::-1]:
            found.append(measure(way, args.rev, keep=args.keep, weights=args.weights if round_ == 0 else 0))
            print(f"  {way}: done, load {os.getloadavg()[0]:.1f}", flush=True)
    print(f"{'way':<11} {'driver s':>8} {'first call s':>12} {'total s':>7} {'.venv GiB':>9} {'dists':>5}")
    for m in found:
        print(
            f"{m.way:<11} {_s(m.driver_s):>8} {_s(m.first_call_s):>12} {m.total_s:>7.1f} "
            f"{m.venv_bytes / 2**30:>9.2f} {m.distributions:>5}"
        )
    print(f"load {os.getloadavg()[0]:.1f} at the end")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
