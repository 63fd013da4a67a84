"""The bad-input corpus: every command, fed a mistake a person makes, answers with one line and exit 2.

Each case runs ``punchline.cluster.cli.main.main`` in-process (no subprocess, no Ray, no Redis: a bad
value must be refused before any service starts) in a fresh workspace, and checks:

* exit status 2, nothing on stdout, exactly one line on stderr, no traceback;
* the line names where the mistake is (the file, record or field given in the case);
* nothing was written: the workspace is byte-for-byte as it was (no runs/, no ledger, no output);
* it ends (a hang is a failure: a generous ``timeout`` marker, so a loaded machine still passes).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from punchline.cluster.cli.main import main

ROOT = Path(__file__).resolve().parents[3]
SAMPLES = ROOT / "data" / "samples"
CONFIGS = ROOT / "configs"

# --- a tiny TOML writer (the configs are plain tables of scalars, lists and inline tables) -------------


def _key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(v)


def to_toml(doc: dict[str, Any], prefix: str = "") -> str:
    scalars = {k: v for k, v in doc.items() if not isinstance(v, dict) or not v or prefix.count(".") >= 2}
    tables = {k: v for k, v in doc.items() if k not in scalars}
    out = [f"[{prefix}]"] if prefix and scalars else []
    out += [f"{_key(k)} = {_value(v)}" for k, v in scalars.items()]
    for k, v in tables.items():
        out.append(to_toml(v, f"{prefix}.{_key(k)}" if prefix else _key(k)))
    return "\n".join(out) + "\n"


# --- the workspace ---------------------------------------------------------------------------------


def _config(name: str, data_key: tuple[str, str], data_file: Path) -> dict[str, Any]:
    doc = tomllib.loads((CONFIGS / name).read_text())
    doc[data_key[0]][data_key[1]] = str(data_file)
    return doc


def _record(run_id: str) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "pipeline": "puns",
        "config_path": "configs/demo.toml",
        "config_toml": "",
        "created_at": 1.0,
        "services": {"redis_url": "redis://127.0.0.1:1/0", "store_url": "runs"},
        "stages": ["collect"],
        "state": "finished",
    }


class Workspace:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.puns = root / "puns.json"
        shutil.copy(SAMPLES / "puns_sample.json", self.puns)
        self.humor = root / "humor.json"
        shutil.copy(SAMPLES / "humor_sample.json", self.humor)
        self.cands = root / "cands.json"
        shutil.copy(SAMPLES / "candidate_jokes.json", self.cands)
        self.prompts = root / "prompts.jsonl"
        shutil.copy(SAMPLES / "prompts_sample.jsonl", self.prompts)
        self.runs = root / "runs"
        (self.runs / "good").mkdir(parents=True)
        (self.runs / "good" / "run.json").write_text(json.dumps(_record("good")))

    def config(self, kind: str, edit: Callable[[dict[str, Any]], None] | None = None) -> Path:
        if kind == "puns":
            doc = _config("demo.toml", ("puns", "jokes"), self.puns)
        elif kind == "humor":
            doc = _config("humor_demo.toml", ("humor", "data"), self.humor)
        elif kind == "prompts":
            doc = _config("prompts_demo.toml", ("prompts", "data"), self.prompts)
        else:
            doc = _config("curate_demo.toml", ("curate", "jokes"), self.cands)
        if edit is not None:
            edit(doc)
        path = self.root / f"{kind}.toml"
        path.write_text(to_toml(doc))
        return path

    def write(self, name: str, text: str) -> Path:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def json_edit(self, source: Path, name: str, edit: Callable[[Any], Any]) -> Path:
        data = json.loads(source.read_text())
        result = edit(data)
        return self.write(name, json.dumps(data if result is None else result, ensure_ascii=False))


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) if p.is_file() else (-1, 0)
        for p in root.rglob("*")
    }


# --- the cases ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    id: str
    argv: Callable[[Workspace], list[str]]
    expect: tuple[str, ...]  # every one appears in the error line (a file, a record, a field)
    env: tuple[tuple[str, str], ...] = ()  # environment variables the case sets


CASES: list[Case] = []


def case(
    id: str, expect: str | tuple[str, ...], env: dict[str, str] | None = None
) -> Callable[[Callable[[Workspace], list[str]]], None]:
    def register(fn: Callable[[Workspace], list[str]]) -> None:
        CASES.append(Case(id, fn, (expect,) if isinstance(expect, str) else expect, tuple((env or {}).items())))

    return register


def setter(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        *parents, last = path.split("/")
        node = doc
        for p in parents:
            node = node.setdefault(p, {})
        if value is _DELETE:
            del node[last]
        else:
            node[last] = value

    return edit


_DELETE = object()
RUN = ["--no-progress"]


def config_cases(kind: str, path: str, value: Any, expect: str | tuple[str, ...]) -> None:
    """The same mistake in a config, through `run`, `plan` (and `humor run` for Humor configs)."""
    label = f"{kind}:{path}={value!r}"

    def run(ws: Workspace) -> list[str]:
        return ["run", str(ws.config(kind, setter(path, value))), "--runs-dir", str(ws.runs), *RUN]

    def plan(ws: Workspace) -> list[str]:
        return ["plan", str(ws.config(kind, setter(path, value)))]

    case(f"run {label}", expect)(run)
    case(f"plan {label}", expect)(plan)
    if kind == "humor":

        def humor_run(ws: Workspace) -> list[str]:
            return ["humor", "run", str(ws.config(kind, setter(path, value))), "--runs-dir", str(ws.runs), *RUN]

        case(f"humor run {label}", expect)(humor_run)


NAN, INF = float("nan"), float("inf")

# [run]
for v in (0, -1, 10**9):
    config_cases("puns", "run/shard_size", v, "run.shard_size")
config_cases("puns", "run/shard_size", "eight", "run.shard_size")
for v in (10, -5, 10**12):
    config_cases("puns", "run/lease_ms", v, "run.lease_ms")
for v in (0, -1, 5000):
    config_cases("puns", "run/workers_per_node", v, "run.workers_per_node")
for v in (-1, 10**9):
    config_cases("puns", "run/units_in_flight", v, "run.units_in_flight")
for v in (-1, 10**9):
    config_cases("puns", "run/max_workers", v, "run.max_workers")
for v in (-1.0, 0.0, NAN):
    config_cases("puns", "run/worker_cpus", v, "run.worker_cpus")
for v in (NAN, -1.0, INF):
    config_cases("puns", "run/max_cost_usd", v, "run.max_cost_usd")
config_cases("puns", "run/pipeline", "nope", "run.pipeline")
for v in ("a/b", "../x", ".hidden"):
    config_cases("puns", "run/name", v, "run.name")
config_cases("puns", "run/colour", "blue", "colour")
config_cases("puns", "run/store", "ftp://host/x", "run.store")
config_cases("puns", "run/store", "s3://Not_A_Bucket/x", "run.store")
config_cases("puns", "run/redis_url", "http://x:6379", "run.redis_url")
config_cases("puns", "run/redis_url", "redis://h:99999/0", "run.redis_url")
# [providers.*]
for v in ("not a url", "ftp://example.com", "http://", "http://h:0/v1", "localhost:8000"):
    config_cases("puns", "providers/together/base_url", v, ("providers.together", "base_url"))
config_cases("puns", "providers/together/api_key_env", "sk-abc def", ("providers.together", "api_key_env"))
config_cases("puns", "providers/together/max_concurrency", 0, ("providers.together", "max_concurrency"))
for v in (0.0, NAN, -1.0):
    config_cases("puns", "providers/together/timeout_s", v, ("providers.together", "timeout_s"))
config_cases("puns", "providers/together/max_retries", -1, ("providers.together", "max_retries"))
for v in (0.0, -5.0, NAN, INF):
    config_cases("puns", "providers/together/requests_per_minute", v, ("providers.together", "requests_per_minute"))
config_cases("puns", "providers/together/tokens_per_minute", 0.0, ("providers.together", "tokens_per_minute"))
for v in (-1.0, NAN, INF):
    config_cases(
        "puns", "providers/together/models/3b/input_usd_per_mtok", v, ("providers.together", "input_usd_per_mtok")
    )
config_cases("puns", "providers/together/models/3b/id", "", ("providers.together", "models.3b.id"))
config_cases("puns", "providers/together/kind", "other", ("providers.together", "kind"))
config_cases("puns", "providers/together/mode", "batched", ("providers.together", "mode"))
# [puns]
for v in (0, -4):
    config_cases("puns", "puns/collect/samples", v, "puns.collect")
config_cases("puns", "puns/collect/models", [], "puns.collect")
config_cases("puns", "puns/collect/provider", "missing", "puns.collect.provider")
config_cases("puns", "puns/classify/batch_size", 0, "puns.classify")
for v in (0, -1):
    config_cases("puns", "puns/cloze/pairs", v, "puns.cloze")
config_cases("puns", "puns/evaluate/models", [], "puns.evaluate")
config_cases("puns", "puns/collect/mode", "batched", "puns.collect.mode")
config_cases("puns", "puns/classify/mode", 1, "puns.classify.mode")
config_cases("puns", "puns/jokes", "/nonexistent/jokes.json", "/nonexistent/jokes.json")
# [simulator]
for v in (2.0, NAN, -0.1):
    config_cases("puns", "simulator/error_503_rate", v, "simulator.error_503_rate")
config_cases("puns", "simulator/latency_ms_min", -1.0, "simulator.latency_ms_min")
config_cases("puns", "simulator/latency_ms_max", 1.0, "simulator.latency_ms_max")  # below min (5)
# humor and curate configs
config_cases("humor", "humor/models", [], "humor.models")
config_cases("humor", "humor/k_shot", -1, "humor.k_shot")
config_cases("humor", "humor/max_tokens", 0, "humor.max_tokens")
config_cases("humor", "humor/judge/provider", "nobody", "humor.judge.provider")
config_cases("humor", "humor/mode", "offline", "humor.mode")
config_cases("humor", "humor/judge/mode", "later", "humor.judge.mode")
config_cases("humor", "humor/preset", "lm-eval", "humor.preset")
config_cases("curate", "curate/raters", {}, "curate.raters")
config_cases("curate", "curate/repair_below", 11.0, "curate.repair_below")
config_cases("curate", "curate/tie_break", "nobody", "curate.tie_break")
config_cases("curate", "curate/consensus", ["gemini", "nobody"], "curate.consensus")
config_cases("curate", "curate/top", 0, "curate.top")


# every stage's settings against its inputs and its provider's models (the whole-run preflight)
for path, value in [
    ("puns/collect/models", ["3b", "nope"]),
    ("puns/evaluate/models", ["nope"]),
]:
    config_cases("puns", path, value, ("nope", "providers.together.models"))
config_cases("puns", "puns/classify/model", "nope", ("nope", "providers.anthropic.models"))
config_cases("puns", "providers/anthropic/models", {}, ("providers.anthropic.models", "none configured"))
config_cases("puns", "puns/lists_at_classification", "/nonexistent/classified.json", "/nonexistent/classified.json")
config_cases("puns", "puns/evaluate/score_against", "/nonexistent/lists.json", "/nonexistent/lists.json")
config_cases("humor", "humor/models", ["nope"], ("nope", "providers.together.models"))
config_cases("humor", "humor/judge/model", "nope", "nope")
config_cases("curate", "curate/raters/gemini/model", "nope", "nope")
config_cases("prompts", "prompts/models", ["8b", "nope"], "nope")


def _few_jokes(ws: Workspace, n: int) -> Path:
    return ws.json_edit(ws.puns, "few_jokes.json", lambda d: d[:n])


for command in ("run", "plan"):

    @case(f"{command} puns 10 jokes for 15 cloze pairs", ("puns.cloze.pairs", "few_jokes.json"))
    def _(ws: Workspace, command: str = command) -> list[str]:
        cfg = ws.config("puns", setter("puns/jokes", str(_few_jokes(ws, 10))))
        return [command, str(cfg)] + (["--runs-dir", str(ws.runs), *RUN] if command == "run" else [])

    @case(f"{command} puns empty jokes list", "few_jokes.json")
    def _(ws: Workspace, command: str = command) -> list[str]:
        cfg = ws.config("puns", setter("puns/jokes", str(_few_jokes(ws, 0))))
        return [command, str(cfg)] + (["--runs-dir", str(ws.runs), *RUN] if command == "run" else [])

    @case(f"{command} humor empty data", ("empty.json", "data"))
    def _(ws: Workspace, command: str = command) -> list[str]:
        data = ws.json_edit(ws.humor, "empty.json", lambda d: d.update(data=[]))
        cfg = ws.config("humor", setter("humor/data", str(data)))
        return [command, str(cfg)] + (["--runs-dir", str(ws.runs), *RUN] if command == "run" else [])

    @case(f"{command} prompts no rows", ("empty.jsonl", "no rows"))
    def _(ws: Workspace, command: str = command) -> list[str]:
        cfg = ws.config("prompts", setter("prompts/data", str(ws.write("empty.jsonl", ""))))
        return [command, str(cfg)] + (["--runs-dir", str(ws.runs), *RUN] if command == "run" else [])

    @case(f"{command} curate no candidates", "empty.json")
    def _(ws: Workspace, command: str = command) -> list[str]:
        cfg = ws.config("curate", setter("curate/jokes", str(ws.write("empty.json", "[]"))))
        return [command, str(cfg)] + (["--runs-dir", str(ws.runs), *RUN] if command == "run" else [])


config_cases("puns", "providers/together/base_url", "http://[::1/v1", ("providers.together", "base_url"))


# run flags and environment that would have started services before failing (issue 22)
def _run_flag_case(label: str, tail: list[str], expect: str, env: dict[str, str] | None = None) -> None:
    def run(ws: Workspace) -> list[str]:
        return ["run", str(ws.config("puns")), "--runs-dir", str(ws.runs), *RUN, *tail]

    case(f"run {label}", expect, env)(run)


_run_flag_case("--max-workers 10**12", ["--max-workers", str(10**12)], "--max-workers")
_run_flag_case("--max-workers -1", ["--max-workers", "-1"], "--max-workers")
_run_flag_case("PUNCHLINE_MAX_WORKERS=many", [], "PUNCHLINE_MAX_WORKERS", {"PUNCHLINE_MAX_WORKERS": "many"})
_run_flag_case("PUNCHLINE_MAX_WORKERS=-3", [], "PUNCHLINE_MAX_WORKERS", {"PUNCHLINE_MAX_WORKERS": "-3"})
_run_flag_case("--ray-address where nothing listens", ["--ray-address", "127.0.0.1:9"], "--ray-address")
_run_flag_case("--ray-address not HOST:PORT", ["--ray-address", "somewhere"], "--ray-address")
_run_flag_case(
    "PUNCHLINE_REDIS_URL with a newline", [], "PUNCHLINE_REDIS_URL", {"PUNCHLINE_REDIS_URL": "redis://127.0.0.1/0\n"}
)
for var, value in [("PUNCHLINE_REDIS_URL", "redis://:hunter2@127.0.0.1/0\n"), ("PUNCHLINE_STORE", "s3://b/x\t")]:

    def _plan_env(ws: Workspace) -> list[str]:
        return ["plan", str(ws.config("puns"))]

    case(f"plan {var} with a control character", (var, "control character"), {var: value})(_plan_env)
for url in ["http://127.0.0.1:1/v1\n", "https://api.example.com/v1\t", "https://api.example.com/\x00v1"]:
    config_cases("puns", "providers/together/base_url", url, ("providers.together", "base_url", "not an http(s) URL"))


@case("run empty --runs-dir", "--runs-dir")
def _(ws: Workspace) -> list[str]:
    return ["run", str(ws.config("puns")), "--runs-dir", "", *RUN]


@case("run --store is a file", ("--store", "afile"))
def _(ws: Workspace) -> list[str]:
    return ["run", str(ws.config("puns")), "--runs-dir", str(ws.runs), "--store", str(ws.write("afile", "x")), *RUN]


# issue 34: nothing the run writes or reads back in the runs folder is a link (each is refused before anything
# starts, the file it points at untouched: the workspace snapshot says so)
for planted in ["good/log.jsonl", "good/run.json", "good/spool", "good/spool/0123.msgpack", "_ledger", "_ray",
                "_ledger/redis.log", "_ledger/appendonlydir/appendonly.aof.1.incr.aof",
                "_ledger/appendonlydir/appendonly.aof.manifest"]:  # fmt: skip

    def _linked(ws: Workspace, planted: str = planted) -> list[str]:
        link = ws.runs / planted
        victim = ws.write("victim.txt", link.read_text() if link.is_file() else "precious\n")
        link.unlink(missing_ok=True)  # the run's own record, moved away and linked to
        link.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        link.symlink_to(victim if "." in link.name else victim.parent)
        return ["run", str(ws.config("puns")), "--runs-dir", str(ws.runs), "--run-id", "good", *RUN]

    case(f"run with a link planted at runs/{planted}", (planted.split("/")[-1], "symbolic link"))(_linked)


@case("run empty api_key_file", ("providers.together", "api_key_file", "empty"))
def _(ws: Workspace) -> list[str]:
    key = ws.write("key.txt", "\n")

    def edit(doc: dict[str, Any]) -> None:
        together = doc["providers"]["together"]
        together.update(base_url="http://127.0.0.1:9/v1", api_key_file=str(key))
        together.pop("api_key_env", None)

    return ["run", str(ws.config("puns", edit)), "--runs-dir", str(ws.runs), *RUN]


# the environment behind the flags, read before anything starts
for name, value in [
    ("PUNCHLINE_MAX_WORKERS", "many"),
    ("PUNCHLINE_MAX_WORKERS", "-1"),
    ("PUNCHLINE_MAX_WORKERS", str(10**12)),
    ("PUNCHLINE_RAY_NUM_CPUS", "zero"),
    ("PUNCHLINE_RATE_RECOVER_WINDOW_S", "soon"),
    ("PUNCHLINE_RUNS_DIR", ""),
]:
    expect = "PUNCHLINE_RATE_" if name.startswith("PUNCHLINE_RATE_") else name

    def _env(ws: Workspace) -> list[str]:
        return ["run", str(ws.config("puns")), *RUN]

    case(f"run {name}={value!r}", expect, env={name: value})(_env)
    if name != "PUNCHLINE_RUNS_DIR":

        def _plan_env(ws: Workspace) -> list[str]:
            return ["plan", str(ws.config("puns"))]

        case(f"plan {name}={value!r}", expect, env={name: value})(_plan_env)


for value in ("-1", "nan", "inf", "0"):

    def _watch(ws: Workspace, value: str = value) -> list[str]:
        return ["status", "good", "--runs-dir", str(ws.runs), "--watch", value]

    case(f"status --watch {value}", "--watch")(_watch)

for command in ("runs", "status good", "retry-failed good"):

    def _empty_runs_dir(ws: Workspace, command: str = command) -> list[str]:
        return [*command.split(), "--runs-dir", ""]

    case(f"{command} empty --runs-dir", "--runs-dir")(_empty_runs_dir)


@case("puns cloze --out is a device", ("--out", "/dev/null", "regular file"))
def _(ws: Workspace) -> list[str]:
    return ["puns", "cloze", "--puns", str(ws.puns), "--out", "/dev/null"]


# configs that are not TOML, or not there
@case("run malformed TOML", "malformed TOML")
def _(ws: Workspace) -> list[str]:
    return ["run", str(ws.write("bad.toml", "[run\npipeline = 'puns'\n")), "--runs-dir", str(ws.runs), *RUN]


@case("plan malformed TOML", "bad.toml")
def _(ws: Workspace) -> list[str]:
    return ["plan", str(ws.write("bad.toml", "x = = 1\n"))]


@case("run missing config", "nothere.toml")
def _(ws: Workspace) -> list[str]:
    return ["run", str(ws.root / "nothere.toml"), "--runs-dir", str(ws.runs), *RUN]


@case("run config is a folder", "cannot read config")
def _(ws: Workspace) -> list[str]:
    (ws.root / "folder.toml").mkdir()
    return ["run", str(ws.root / "folder.toml"), "--runs-dir", str(ws.runs), *RUN]


@case("run no [puns] table", "[puns]")
def _(ws: Workspace) -> list[str]:
    return ["run", str(ws.config("puns", setter("puns", _DELETE))), "--runs-dir", str(ws.runs), *RUN]


@case("humor run on a puns config", "run.pipeline")
def _(ws: Workspace) -> list[str]:
    return ["humor", "run", str(ws.config("puns")), "--runs-dir", str(ws.runs), *RUN]


# input files named by a config, read before anything starts
def _jokes_case(id: str, edit: Callable[[Any], Any], expect: tuple[str, ...]) -> None:
    @case(f"run puns file {id}", expect)
    def _(ws: Workspace) -> list[str]:
        bad = ws.json_edit(ws.puns, "bad_jokes.json", edit)
        return ["run", str(ws.config("puns", setter("puns/jokes", str(bad)))), "--runs-dir", str(ws.runs), *RUN]


_jokes_case("no blank", lambda d: d[0].update(sentence="no blank here"), ("bad_jokes.json", "sentence"))
_jokes_case("empty punny", lambda d: d[1].update(punny=[]), ("bad_jokes.json", "punny"))
_jokes_case("duplicate index", lambda d: d[2].update(index=d[1]["index"]), ("bad_jokes.json", "index"))


@case("run humor data with duplicate ids", ("bad_humor.json", "meta.id"))
def _(ws: Workspace) -> list[str]:
    def dup(d: Any) -> None:
        d["data"][3]["meta"]["id"] = d["data"][2]["meta"]["id"]

    bad = ws.json_edit(ws.humor, "bad_humor.json", dup)
    return ["run", str(ws.config("humor", setter("humor/data", str(bad)))), "--runs-dir", str(ws.runs), *RUN]


@case("run candidates malformed", "bad_cands.json")
def _(ws: Workspace) -> list[str]:
    bad = ws.write("bad_cands.json", "[{")
    return ["run", str(ws.config("curate", setter("curate/jokes", str(bad)))), "--runs-dir", str(ws.runs), *RUN]


# flags of `run`
for flag, value, expect in [
    ("--max-cost-usd", "nan", "--max-cost-usd"),
    ("--max-cost-usd", "-1", "--max-cost-usd"),
    ("--max-cost-usd", "inf", "--max-cost-usd"),
    ("--run-id", "a/b/c", "--run-id"),
    ("--run-id", "x" * 300, "--run-id"),
    ("--run-id", "../escape", "--run-id"),
    ("--run-id", ".hidden", "--run-id"),
    ("--run-id", "", "--run-id"),
    ("--run-id", "_ledger", "--run-id"),
    ("--redis-url", "http://x:6379/0", "--redis-url"),
    ("--redis-url", "redis://h:99999/0", "--redis-url"),
    ("--redis-url", "redis://:hunter2@[::1/0", "--redis-url"),
    ("--store", "ftp://host/x", "--store"),
    ("--store", "s3://BAD_bucket/x", "--store"),
    # issue 34: a control character in a URL (urlsplit would drop a newline or a tab and use another URL)
    ("--redis-url", "redis://127.0.0.1:6379/0\n", "--redis-url"),
    ("--redis-url", "redis://:hunter2@127.0.0.1\t:6379/0", "--redis-url"),
    ("--redis-url", "unix:///tmp/x.sock\r", "--redis-url"),
    ("--store", "s3://bucket/x\n", "--store"),
]:

    def _flag(ws: Workspace, flag: str = flag, value: str = value) -> list[str]:
        return ["run", str(ws.config("puns")), "--runs-dir", str(ws.runs), flag, value, *RUN]

    case(f"run {flag}={value[:20]!r}", expect)(_flag)


@case("run --run-id names a file", "--run-id")
def _(ws: Workspace) -> list[str]:
    ws.write("runs/taken", "x")
    return ["run", str(ws.config("puns")), "--runs-dir", str(ws.runs), "--run-id", "taken", *RUN]


@case("run duplicate TOML key", "malformed TOML")
def _(ws: Workspace) -> list[str]:
    cfg = ws.config("puns")
    cfg.write_text(cfg.read_text().replace('name = "demo"', 'name = "demo"\nname = "again"', 1))
    return ["run", str(cfg), "--runs-dir", str(ws.runs), *RUN]


@case("run --runs-dir is a file", "--runs-dir")
def _(ws: Workspace) -> list[str]:
    return ["run", str(ws.config("puns")), "--runs-dir", str(ws.write("afile", "x")), *RUN]


# status, runs, retry-failed
for cmd in ("status", "retry-failed"):
    for run_id, expect in [("../x", "run_id"), ("a/b", "run_id"), ("nosuchrun", "nosuchrun"), ("-", "run_id")]:

        def _id(ws: Workspace, cmd: str = cmd, run_id: str = run_id) -> list[str]:
            return [cmd, "--runs-dir", str(ws.runs), "--", run_id]

        case(f"{cmd} {run_id!r}", expect)(_id)

    for label, text in [
        ("truncated", '{"run_id": "bad", "pipe'),
        ("not an object", "[1, 2, 3]"),
        ("wrong type", json.dumps({**_record("bad"), "created_at": "yesterday"})),
        ("missing field", json.dumps({k: v for k, v in _record("bad").items() if k != "services"})),
        ("duplicate key", json.dumps(_record("bad"))[:-1] + ', "state": "running"}'),
        ("empty", ""),
    ]:

        def _corrupt(ws: Workspace, cmd: str = cmd, text: str = text) -> list[str]:
            ws.write("runs/bad/run.json", text)
            return [cmd, "bad", "--runs-dir", str(ws.runs)]

        case(f"{cmd} corrupt run.json ({label})", ("run.json",))(_corrupt)

    def _runs_file(ws: Workspace, cmd: str = cmd) -> list[str]:
        return [cmd, "good", "--runs-dir", str(ws.write("afile", "x"))]

    case(f"{cmd} --runs-dir is a file", "--runs-dir")(_runs_file)


@case("status run.json is a folder", "run.json")
def _(ws: Workspace) -> list[str]:
    (ws.runs / "dir" / "run.json").mkdir(parents=True)
    return ["status", "dir", "--runs-dir", str(ws.runs)]


@case("runs --runs-dir is a file", "--runs-dir")
def _(ws: Workspace) -> list[str]:
    return ["runs", "--runs-dir", str(ws.write("afile", "x"))]


# puns tools
def _puns_file_case(label: str, edit: Callable[[Any], Any], expect: tuple[str, ...]) -> None:
    @case(f"puns validate {label}", expect)
    def _(ws: Workspace) -> list[str]:
        return ["puns", "validate", str(ws.json_edit(ws.puns, "p.json", edit))]

    @case(f"puns cloze {label}", expect)
    def _(ws: Workspace) -> list[str]:
        return ["puns", "cloze", "--puns", str(ws.json_edit(ws.puns, "p.json", edit)), "--out", str(ws.root / "o.json")]


_puns_file_case("no blank", lambda d: d[0].update(sentence="nothing"), ("p.json", "sentence"))
_puns_file_case("two blanks", lambda d: d[0].update(sentence="a ___ b ___"), ("p.json", "sentence"))
_puns_file_case("empty straight", lambda d: d[0].update(straight=[]), ("p.json", "straight"))
_puns_file_case("duplicate index", lambda d: d[1].update(index=d[0]["index"]), ("p.json", "index"))
_puns_file_case("unknown tier", lambda d: d[0].update(cloze_tier="hilarious"), ("p.json", "cloze_tier"))
_puns_file_case("index is text", lambda d: d[0].update(index="zero"), ("p.json", "index"))
_puns_file_case("not a list", lambda d: {"jokes": d}, ("p.json",))


@case("puns validate duplicate key", ("p.json", "sentence"))
def _(ws: Workspace) -> list[str]:
    text = ws.puns.read_text().replace('"sentence":', '"sentence": "x ___", "sentence":', 1)
    return ["puns", "validate", str(ws.write("p.json", text))]


@case("puns validate malformed JSON", ("p.json", "malformed JSON"))
def _(ws: Workspace) -> list[str]:
    return ["puns", "validate", str(ws.write("p.json", ws.puns.read_text()[:500]))]


@case("puns validate missing file", "nothere.json")
def _(ws: Workspace) -> list[str]:
    return ["puns", "validate", str(ws.root / "nothere.json")]


for flag, value in [("--pairs", "0"), ("--pairs", "-3"), ("--seed", "-1")]:

    def _cloze_flag(ws: Workspace, flag: str = flag, value: str = value) -> list[str]:
        return ["puns", "cloze", "--puns", str(ws.puns), "--out", str(ws.root / "o.json"), flag, value]

    case(f"puns cloze {flag} {value}", flag)(_cloze_flag)


def _out_cases(label: str, argv: Callable[[Workspace, str], list[str]], kind: str) -> None:
    @case(f"{label} --out under a file", "afile")
    def _(ws: Workspace) -> list[str]:
        ws.write("afile", "x")
        return argv(ws, str(ws.root / "afile" / "out"))

    if kind == "file":

        @case(f"{label} --out is a folder", "--out")
        def _(ws: Workspace) -> list[str]:
            (ws.root / "outdir").mkdir()
            return argv(ws, str(ws.root / "outdir"))

        @case(f"{label} --out is a pipe", ("--out", "not a regular file"))
        def _(ws: Workspace) -> list[str]:
            os.mkfifo(ws.root / "fifo")  # like a device node: writing must never replace it by a file
            return argv(ws, str(ws.root / "fifo"))

    else:

        @case(f"{label} --out is a file", "--out")
        def _(ws: Workspace) -> list[str]:
            return argv(ws, str(ws.write("outfile", "x")))


_out_cases("puns cloze", lambda ws, o: ["puns", "cloze", "--puns", str(ws.puns), "--out", o], "file")
_out_cases(
    "puns rank",
    lambda ws, o: ["puns", "rank", "--puns", str(ws.puns), "--classified", str(ws.puns), "--out", o],
    "file",
)
_out_cases(
    "puns cloze-report",
    lambda ws, o: ["puns", "cloze-report", "--responses", "r", "--tests", "t", "--puns", str(ws.puns), "--out", o],
    "dir",
)
_out_cases(
    "humor score",
    lambda ws, o: ["humor", "score", "--data", str(ws.humor), "--predictions", "p", "--out", o],
    "dir",
)


@case("puns rank --plot under a file", "afile")
def _(ws: Workspace) -> list[str]:
    ws.write("afile", "x")
    return ["puns", "rank", "--puns", str(ws.puns), "--classified", "c", "--out", "o.json", "--plot", "afile/x.png"]


@case("puns rank classified malformed", "cl.json")
def _(ws: Workspace) -> list[str]:
    cl = ws.write("cl.json", "{")
    return ["puns", "rank", "--puns", str(ws.puns), "--classified", str(cl), "--out", str(ws.root / "o.json")]


@case("puns rank classified wrong shape", ("cl.json",))
def _(ws: Workspace) -> list[str]:
    cl = ws.write("cl.json", json.dumps({"0": {"sentence": 3}}))
    return ["puns", "rank", "--puns", str(ws.puns), "--classified", str(cl), "--out", str(ws.root / "o.json")]


@case("puns cloze-report responses malformed", "resp.json")
def _(ws: Workspace) -> list[str]:
    resp = ws.write("resp.json", "[")
    tests = ws.write("tests.json", "[]")
    return ["puns", "cloze-report", "--responses", str(resp), "--tests", str(tests), "--puns", str(ws.puns),
            "--out", str(ws.root / "rep")]  # fmt: skip


@case("puns cloze-report tests malformed", "tests.json")
def _(ws: Workspace) -> list[str]:
    tests = ws.write("tests.json", '[{"pair_id": "x"}]')
    return ["puns", "cloze-report", "--responses", str(tests), "--tests", str(tests), "--puns", str(ws.puns),
            "--out", str(ws.root / "rep")]  # fmt: skip


# humor tools
def _humor_data_case(label: str, edit: Callable[[Any], Any], expect: tuple[str, ...]) -> None:
    @case(f"humor validate {label}", expect)
    def _(ws: Workspace) -> list[str]:
        return ["humor", "validate", str(ws.json_edit(ws.humor, "h.json", edit))]

    @case(f"humor score data {label}", expect)
    def _(ws: Workspace) -> list[str]:
        preds = ws.write("preds.jsonl", "")
        data = ws.json_edit(ws.humor, "h.json", edit)
        return ["humor", "score", "--data", str(data), "--predictions", str(preds), "--out", str(ws.root / "out")]


_humor_data_case("data not a list", lambda d: d.update(data={"x": 1}), ("h.json", "data"))
_humor_data_case("id is text", lambda d: d["data"][0]["meta"].update(id="one"), ("h.json", "meta.id"))
_humor_data_case("no inputs", lambda d: d["data"][1].pop("inputs") and None, ("h.json", "inputs"))
_humor_data_case("not an object", lambda d: [1, 2], ("h.json",))


@case("humor validate duplicate key", ("h.json", "instruction"))
def _(ws: Workspace) -> list[str]:
    text = ws.humor.read_text().replace('"instruction":', '"instruction": "x", "instruction":', 1)
    return ["humor", "validate", str(ws.write("h.json", text))]


@case("humor validate malformed JSON", ("h.json", "malformed JSON"))
def _(ws: Workspace) -> list[str]:
    return ["humor", "validate", str(ws.write("h.json", "{"))]


@case("humor validate missing file", "nothere.json")
def _(ws: Workspace) -> list[str]:
    return ["humor", "validate", str(ws.root / "nothere.json")]


@case("humor validate parquet that is not", "h.parquet")
def _(ws: Workspace) -> list[str]:
    return ["humor", "validate", str(ws.write("h.parquet", "not parquet"))]


@case("humor score duplicate ids", ("dup.json", "meta.id"))
def _(ws: Workspace) -> list[str]:
    def dup(d: Any) -> None:
        d["data"][5]["meta"]["id"] = d["data"][4]["meta"]["id"]

    data = ws.json_edit(ws.humor, "dup.json", dup)
    return ["humor", "score", "--data", str(data), "--predictions", str(ws.write("p.jsonl", "")), "--out", "out"]


for flag, value in [
    ("--bootstrap", "0"),
    ("--bootstrap", "-5"),
    ("--bootstrap", "10000000000"),
    ("--judge-threshold", "nan"),
    ("--judge-threshold", "2"),
    ("--judge-threshold", "-0.5"),
    ("--seed", "-1"),
]:

    def _score_flag(ws: Workspace, flag: str = flag, value: str = value) -> list[str]:
        preds = ws.write("p.jsonl", "")
        return ["humor", "score", "--data", str(ws.humor), "--predictions", str(preds), "--out", "out", flag, value]

    case(f"humor score {flag} {value}", flag)(_score_flag)

for label, lines, expect in [
    ("malformed line", '{"id": 1, "text": "x"}\n{"id": 2,\n', ("p.jsonl", "line 2")),
    ("repeated id", '{"id": 1, "text": "x"}\n{"id": 1, "text": "y"}\n', ("p.jsonl", "line 2", "id")),
    ("duplicate key", '{"id": 1, "text": "x", "text": "y"}\n', ("p.jsonl", "line 1", "text")),
    ("id is text", '{"id": "one", "text": "x"}\n', ("p.jsonl", "line 1")),
]:

    def _preds(ws: Workspace, lines: str = lines) -> list[str]:
        preds = ws.write("p.jsonl", lines)
        return ["humor", "score", "--data", str(ws.humor), "--predictions", str(preds), "--out", "out"]

    case(f"humor score predictions {label}", expect)(_preds)

for label, lines, expect in [
    ("score out of scale", '{"id": 1, "score": 7}\n', ("j.jsonl", "line 1")),
    ("score nan", '{"id": 1, "score": NaN}\n', ("j.jsonl", "line 1")),
    ("repeated id", '{"id": 1, "score": 1}\n{"id": 1, "score": 0}\n', ("j.jsonl", "line 2")),
    ("duplicate key", '{"id": 1, "score": 1, "score": 0}\n', ("j.jsonl", "line 1", "score")),
]:

    def _judge(ws: Workspace, lines: str = lines) -> list[str]:
        preds, judge = ws.write("p.jsonl", ""), ws.write("j.jsonl", lines)
        return ["humor", "score", "--data", str(ws.humor), "--predictions", str(preds), "--out", "out",
                "--judge-scores", str(judge)]  # fmt: skip

    case(f"humor score judge {label}", expect)(_judge)


# import-legacy
@case("import-legacy raw missing", "nothere.json")
def _(ws: Workspace) -> list[str]:
    return ["import-legacy", "--raw", str(ws.root / "nothere.json"), "--store", str(ws.root / "store")]


@case("import-legacy raw malformed", "raw.json")
def _(ws: Workspace) -> list[str]:
    return ["import-legacy", "--raw", str(ws.write("raw.json", "{")), "--store", str(ws.root / "store")]


@case("import-legacy raw wrong shape", "raw.json")
def _(ws: Workspace) -> list[str]:
    raw = ws.write("raw.json", json.dumps({"0": {"sentence": 5}}))
    return ["import-legacy", "--raw", str(raw), "--store", str(ws.root / "store")]


@case("import-legacy store not a store URL", "--store")
def _(ws: Workspace) -> list[str]:
    return ["import-legacy", "--raw", str(ws.write("raw.json", "{}")), "--store", "ftp://x/y"]


@case("import-legacy store is a file", "--store")
def _(ws: Workspace) -> list[str]:
    return ["import-legacy", "--raw", str(ws.write("raw.json", "{}")), "--store", str(ws.write("afile", "x"))]


@case("import-legacy bad config", "puns.collect")
def _(ws: Workspace) -> list[str]:
    cfg = ws.config("puns", setter("puns/collect/samples", 0))
    return ["import-legacy", "--raw", str(ws.write("raw.json", "{}")), "--store", "st", "--config", str(cfg)]


# fake-provider (a valid one would serve forever: every case must be refused before it listens)
for argv_tail, expect in [
    (["--port", "70000"], "--port"),
    (["--port", "-1"], "--port"),
    (["--host", "not-an-ip"], "--host"),
    (["--answer-key", "puns=/nonexistent/p.json"], "/nonexistent/p.json"),
    (["--answer-key", "humor"], "PIPELINE=FILE"),
]:

    def _fake(ws: Workspace, tail: list[str] = argv_tail) -> list[str]:
        return ["fake-provider", *tail]

    case(f"fake-provider {' '.join(argv_tail)}", expect)(_fake)


def _fake_unknown_pipeline(ws: Workspace) -> list[str]:
    return ["fake-provider", "--answer-key", f"nope={ws.write('key.json', '[]')}"]


case("fake-provider --answer-key of no pipeline", "pipeline_knobs.nope")(_fake_unknown_pipeline)

for label, text, expect in [
    ("malformed", "error_503_rate = = 1", ("knobs.toml", "malformed TOML")),
    ("rate above 1", "error_503_rate = 2.0", ("knobs.toml", "error_503_rate")),
    ("rate nan", "hang_rate = nan", ("knobs.toml", "hang_rate")),
    ("unknown knob", "colour = 1", ("knobs.toml", "colour")),
    ("wrong type", 'seed = "x"', ("knobs.toml", "seed")),
    ("negative latency", "latency_ms_min = -5.0", ("knobs.toml", "latency_ms_min")),
]:

    def _knobs(ws: Workspace, text: str = text) -> list[str]:
        return ["fake-provider", "--config", str(ws.write("knobs.toml", text))]

    case(f"fake-provider --config {label}", expect)(_knobs)


def test_the_corpus_is_large() -> None:
    assert len(CASES) >= 150, len(CASES)
    assert len({c.id for c in CASES}) == len(CASES), "case ids must be unique"
    commands = {c.id.split()[0] for c in CASES}
    assert commands >= {"run", "plan", "status", "runs", "retry-failed", "puns", "humor", "import-legacy",
                        "fake-provider"}  # fmt: skip


@pytest.mark.timeout(120)  # a hang guard, generous for a loaded machine
@pytest.mark.parametrize("bad", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_and_exit_2(
    bad: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = Workspace(tmp_path)
    monkeypatch.chdir(tmp_path)  # relative defaults (runs/, out/) land in the workspace, where we look
    monkeypatch.delenv("PUNCHLINE_DEBUG", raising=False)
    for name in ("PUNCHLINE_REDIS_URL", "PUNCHLINE_STORE", "PUNCHLINE_RAY_ADDRESS", "PUNCHLINE_RUNS_DIR"):
        monkeypatch.delenv(name, raising=False)
    for name, value in bad.env:
        monkeypatch.setenv(name, value)
    argv = bad.argv(ws)
    before = snapshot(tmp_path)
    code = main(argv)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2, f"exit {code}; stderr: {err[-2000:]}"
    assert out == ""
    assert len(lines) == 1, err
    assert "Traceback" not in err and lines[0].startswith("punchline: error: ")
    assert "hunter2" not in err  # a password in a bad URL is never echoed
    for needle in bad.expect:
        assert needle in lines[0], f"{needle!r} not named in: {lines[0]}"
    assert snapshot(tmp_path) == before, "something was written"
