"""Every Redis key is spelled in ``schedulers/keys.py`` and nowhere else, and spelled as it always was.

A key is an interface between processes (and between versions: a resumed run reads what the last one
wrote), so a second spelling is a bug waiting for a typo, and a changed spelling loses a run's ledger.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import punchline
from punchline.data import settings
from punchline.data.provider_settings import ModelSettings, ProviderSettings
from punchline.schedulers import keys
from punchline.schedulers.budget import budget_keys, usage_key
from punchline.schedulers.inflight import bounds_of
from punchline.schedulers.ledger import StageKeys, fence_key, request_key
from punchline.schedulers.rate_limit import Limits, RateLimitSettings, RateScope
from punchline.schedulers.run_claim import claim_key
from punchline.workers.calls.call_stats import run_key, worker_key
from punchline.workers.driver_watch import driver_claim_key

ROOT = Path(punchline.__file__).parent
LAYERS = ("cluster", "workers", "schedulers", "data")
# a word of a key between colons (or at a literal's end after one), or the default namespace's prefix
KEY_SHAPED = re.compile(
    r":(run|stage|todo|leased|holders|meta|counters|failed|req|fence|budget|spent|reserved|alive|usage"
    r"|rl|tok|state|m|inflight|calls|driver)(:|$)|^pl:|^\{none\}"
)


def _literals(path: Path) -> list[tuple[int, str]]:
    """The string literals of a module (f-strings' constant parts included), docstrings left out."""
    tree = ast.parse(path.read_text(), filename=str(path))
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def engine_modules() -> list[Path]:
    found = []
    for layer in LAYERS:
        for folder, _, files in os.walk(ROOT / layer, followlinks=True):
            found += [Path(folder) / f for f in files if f.endswith(".py")]
    return sorted(found)


def test_no_key_is_spelled_outside_keys_py() -> None:
    modules = engine_modules()
    assert len(modules) > 60, "the walk found the engine's modules"
    stray = [
        f"{path.relative_to(ROOT)}:{line}: {text!r}"
        for path in modules
        if path.name != "keys.py" or path.parent.name != "schedulers"
        for line, text in _literals(path)
        if KEY_SHAPED.search(text)
    ]
    assert stray == [], "key-shaped literals outside schedulers/keys.py:\n" + "\n".join(stray)


def test_the_scan_sees_a_stray_key(tmp_path: Path) -> None:
    """The checker itself: an f-string spelling a key is found; a docstring naming one is not."""
    bad = tmp_path / "bad.py"
    bad.write_text('"""Writes ``pl:run:<id>:driver``."""\ndef k(ns, r):\n    return f"{ns}:run:{r}:calls"\n')
    assert [text for _, text in _literals(bad) if KEY_SHAPED.search(text)] == [":run:", ":calls"]


def test_keys_are_spelled_with_the_hash_tags_a_cluster_needs() -> None:
    """The strings every family produces. Renamed in session 16 for a Redis Cluster (issue 42, item 3): the keys
    one script takes together share a hash tag, so they hash to one slot (a run's, a provider's, a request
    group's); a resume under the new names rebuilds the queue from the store (docs/architecture.md)."""
    stage = StageKeys("pl", "r1", "s")
    assert stage.todo == "pl:{run:r1}:stage:s:todo"
    assert (stage.leased, stage.holders, stage.meta, stage.counters, stage.failed, stage.fence) == (
        "pl:{run:r1}:stage:s:leased",
        "pl:{run:r1}:stage:s:holders",
        "pl:{run:r1}:stage:s:meta",
        "pl:{run:r1}:stage:s:counters",
        "pl:{run:r1}:stage:s:failed",
        "pl:{run:r1}:fence",
    )
    assert request_key("pl", "abc") == "pl:req:{a}:abc"
    assert fence_key("ns") == "ns:fence" and fence_key("ns", "a") == "ns:req:{a}:fence"
    assert budget_keys("r1") == ["pl:{run:r1}:budget:spent", "pl:{run:r1}:budget:reserved", "pl:{run:r1}:budget:alive"]
    assert usage_key("r1", "x") == "x:{run:r1}:budget:usage"
    assert run_key("pl", "r1") == "pl:{run:r1}:calls"
    assert worker_key("pl", "r1", "w7") == "pl:{run:r1}:calls:w7"
    assert driver_claim_key("r1") == claim_key("r1") == "pl:run:r1:driver"  # one key alone: unchanged
    scope = RateScope("pl", "openai", "gpt", Limits(requests_per_minute=60), RateLimitSettings())
    assert scope.keys == [
        "pl:rl:{openai}:req",
        "pl:rl:{openai}:tok",
        "pl:rl:{openai}:state",
        "pl:rl:{openai}:m:gpt:req",
        "pl:rl:{openai}:m:gpt:tok",
    ]
    provider = ProviderSettings(max_concurrency=4, models={"g": ModelSettings(id="gpt", max_concurrency=2)})
    assert bounds_of(provider, "openai", "gpt").keys == ("pl:inflight:{openai}", "pl:inflight:{openai}:m:gpt")


def test_stage_keys_are_values() -> None:
    """Two spellings of one stage are one stage (a worker's heartbeat groups its claims by them)."""
    assert StageKeys("pl", "r", "s") == StageKeys("pl", "r", "s")
    assert len({StageKeys("pl", "r", "s"), StageKeys("pl", "r", "s"), StageKeys("pl", "r", "t")}) == 2


def test_the_rate_limiter_namespace_defaults_to_the_ledger_one() -> None:
    """``PUNCHLINE_RATE_NAMESPACE`` lives in the data layer (which cannot import keys.py): same default."""
    assert settings.RATE_NAMESPACE.default == keys.NAMESPACE
