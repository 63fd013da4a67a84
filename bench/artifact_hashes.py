"""The demos' artifacts as SHA-256 digests: what "behaviour unchanged" means for a change that moves code.

Runs the demo (`configs/demo.toml`), the prompts demo and the Humor demo, each in a new runs folder under an
empty HOME, with the package imported from ``--source`` (a checkout, e.g. ``git archive <commit> | tar -x -C
DIR``; default: this one), and prints one line per artifact: ``<demo>/<path> <sha256>``. Two trees' outputs
compared with ``diff`` say whether a refactor changed anything a user keeps::

    python bench/artifact_hashes.py --source /tmp/before > before.txt
    python bench/artifact_hashes.py > after.txt
    diff before.txt after.txt && echo byte-identical
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
DEMOS = ("demo", "prompts_demo", "humor_demo")


def digests(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (its relative path) and its SHA-256."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def run_demo(source: Path, demo: str, work: Path) -> dict[str, str]:
    """Run one demo from ``source`` in a new folder of ``work``; its artifacts' digests."""
    home = work / f"home-{demo}"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PUNCHLINE_", "RAY_"))}
    env.update(HOME=str(home), PYTHONPATH=str(source))
    runs = work / f"runs-{demo}"
    cmd = [sys.executable, "-m", "punchline", "run", str(source / "configs" / f"{demo}.toml")]
    cmd += ["--runs-dir", str(runs), "--run-id", demo, "--no-progress"]
    done = subprocess.run(cmd, env=env, cwd=work, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{demo}: exit {done.returncode}\n{done.stderr[-2000:]}")
    return digests(runs / demo / "artifacts")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=Path, default=HERE, help="the checkout to import punchline from")
    parser.add_argument("--demo", action="append", choices=DEMOS, help="only these demos (default: all three)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="punchline-hashes-") as tmp:
        for demo in args.demo or DEMOS:
            for path, digest in run_demo(args.source.resolve(), demo, Path(tmp)).items():
                print(f"{demo}/{path} {digest}", flush=True)


if __name__ == "__main__":
    main()
