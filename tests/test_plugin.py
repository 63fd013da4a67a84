"""The plug-in authors' API (``punchline.plugin``): a pipeline that gives only its name, settings and stages
gets every other member from its settings' field types; Generate and Judge compose into the multiple-choice
example in 60 lines or fewer, priced by ``plan`` and checked before any call; tables and plots are
byte-identical; a plug-in's own reduce failing names its own line."""

from __future__ import annotations

import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

import punchline.plugin as plugin
from punchline.cluster import pipeline_base, registry
from punchline.cluster.cli.main import main
from punchline.cluster.config import load_config
from punchline.cluster.registry import pipeline_of
from punchline.cluster.run.planner import plan_run
from punchline.data.errors import ConfigError, PluginError
from punchline.data.stores.local import LocalStore
from punchline.plugin.stages import StageArgumentError, _own_reduce
from punchline.plugin.testing import _content_id

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "multiple_choice"


class Stage(plugin.Settings):
    provider: plugin.Provider
    model: str
    mode: plugin.Mode | None = None


class Study(plugin.Settings):
    data: plugin.InputFile
    extra: plugin.InputFiles = []
    provider: plugin.Provider = "main"
    models: plugin.Models = msgspec.field(default_factory=lambda: ["small"])
    judge: plugin.Model | None = None
    label: Stage | None = None


class Minimal(plugin.Pipeline):
    name = "study"
    settings_type = Study

    def stages(self, cfg: Any) -> list[Any]:
        return []


def test_a_pipeline_gives_name_and_stages_and_the_rest_comes_from_its_settings_types() -> None:
    s = msgspec.convert(
        {
            "data": "rows.jsonl",
            "extra": ["more.csv"],
            "models": ["small", "other:big"],
            "judge": "j:judge",
            "label": {"provider": "lab", "model": "m", "mode": "batch"},
        },
        Study,
    )
    p = Minimal()
    assert p.provider_refs(s) == [
        ("study.provider", "main"),
        ("study.models[0]", "main"),  # a bare nick belongs to the settings' provider
        ("study.models[1]", "other"),
        ("study.judge", "j"),
        ("study.label.provider", "lab"),
    ]
    assert p.input_paths(s) == ["rows.jsonl", "more.csv"]
    assert (p.stage_mode(s, "label"), p.stage_mode(s, "judge"), p.stage_mode(s, "nope")) == ("batch", None, None)
    sim = plugin.simulated_providers(s)
    assert sorted(sim) == ["j", "lab", "main", "other"] and sorted(sim["main"]["models"]) == ["small"]
    assert sim["other"]["base_url"] == "simulated" and sorted(sim["other"]["models"]) == ["big"]

    class Bare(plugin.Pipeline):
        name = "bare"

    assert Bare.settings_type is plugin.NoSettings
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"typo": 1}, Bare.settings_type)  # an empty table, not a permissive one


def test_the_facade_exports_what_it_lists() -> None:
    assert sorted(plugin.__all__) == sorted(set(plugin.__all__))
    for name in plugin.__all__:
        assert getattr(plugin, name) is not None, name


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    proj = tmp_path / "mc"
    shutil.copytree(EXAMPLE, proj, ignore=shutil.ignore_patterns("__pycache__", "runs"))
    monkeypatch.setattr(sys, "path", list(sys.path))  # the loader appends the config's folder: undo it
    yield proj
    for name in [m for m in sys.modules if m.partition(".")[0] == "multiple_choice"]:
        del sys.modules[name]


def test_the_example_is_sixty_lines_or_fewer() -> None:
    lines = sum(len(p.read_text().splitlines()) for p in EXAMPLE.rglob("*.py"))
    assert 0 < lines <= 60, f"examples/multiple_choice is {lines} lines of Python"


def test_plan_prices_both_model_stages_of_the_example(project: Path) -> None:
    cfg = load_config(project / "mc.toml")
    pipeline = pipeline_of(cfg)
    assert pipeline.input_paths(cfg.settings) == ["data/questions.jsonl"]
    pipeline.check_inputs(cfg)  # every row renders, the judge's prompt too
    answer, grade = plan_run(cfg)
    assert (answer.stage, answer.requests, answer.exact) == ("answer", 8 * 2, True)  # rows x models (n in one)
    assert (grade.stage, grade.requests, grade.exact) == ("grade", 8 * 2 * 3, False)  # and x samples, a bound
    assert answer.cost_usd > 0 and grade.cost_usd > 0


@pytest.mark.parametrize(
    ("old", "new", "words"),
    [  # a bad argument names the stage and the key; a bad row the file, the row and the column
        ('name="answer")', 'name="answer", top_p=7)', ["stage 'answer'", "Generate(top_p=7)", "<= 1.0"]),
        ('name="answer")', 'name="answer", mode="batch")', ["stage 'answer'", "mode=", "not an argument"]),
        ("(?P<verdict>\\w+)", "(?P<verdict>\\w+", ["stage 'grade'", "Judge() argument parse.regex", "not a valid"]),
        (
            "Reference: {{ answer }}",
            "Reference: {{ nope }}",
            ["questions.jsonl", "line 1", "'nope' is undefined", "grade.prompt"],
        ),
    ],
)
def test_a_bad_stage_argument_or_row_is_one_line_before_anything_starts(
    project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], old: str, new: str, words: list[str]
) -> None:
    code = project / "multiple_choice" / "__init__.py"
    assert old in code.read_text()
    code.write_text(code.read_text().replace(old, new, 1))
    assert main(["run", str(project / "mc.toml"), "--runs-dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "prompts" not in err, err  # the built-in the stages reuse is not the user's business
    for w in words:
        assert w in err, err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("old", "new", "words"),
    [  # a keyword or a value the stage's settings refuse: the plug-in's line that built it, not mc.toml
        ('name="answer")', 'name="answer", max_token=96)', ["'max_token'", "did you mean 'max_tokens'?"]),
        ('name="answer")', 'name="answer", max_tokens=-1)', ["Generate(max_tokens=-1)", ">= 1"]),
        ("n=s.n,", 'n="3",', ["Generate(n='3')", "Expected `int`, got `str`"]),
        ("(s.questions, ASK,", "(s.questions, prompt=ASK,", ["'prompt'", "did you mean 'template'?"]),
        ('name="grade",', 'name="grade", wher="x",', ["stage 'grade'", "did you mean 'where'?"]),
        ('name="grade",', 'name="grade", fraction=2,', ["stage 'grade'", "Judge(fraction=2)", "<= 1.0"]),
        ('name="grade",', 'name="grade", sampling={},', ["stage 'grade'", "unknown keyword 'sampling'"]),
    ],
)
def test_a_bad_stage_keyword_or_value_names_the_python_line_that_built_it(
    project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], old: str, new: str, words: list[str]
) -> None:
    code = project / "multiple_choice" / "__init__.py"
    text = code.read_text()
    assert old in text
    code.write_text(text.replace(old, new, 1))
    at = next(i for i, line in enumerate(code.read_text().splitlines(), 1) if new in line)
    for command in (["plan", str(project / "mc.toml")], ["run", str(project / "mc.toml")]):
        assert main([*command, "--runs-dir", str(tmp_path / "runs")]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert f"{code}:{at}: stage " in err and "mc.toml" not in err and "prompts" not in err, err
        for w in words:
            assert w in err, err
    assert not (tmp_path / "runs").exists()


def test_a_stage_is_checked_as_it_is_built() -> None:
    line = sys._getframe().f_lineno + 2
    with pytest.raises(StageArgumentError) as bad:
        plugin.Generate("rows.jsonl", "{{ q }}", models="m", temprature=0.5, name="ask")
    assert isinstance(bad.value, ConfigError) and bad.value.stage == "ask"
    assert str(bad.value) == (
        f"{bad.value.site}: stage 'ask': Generate() got an unknown keyword 'temprature' (did you mean 'temperature'?)"
    )
    assert bad.value.site.endswith(f"test_plugin.py:{line}")
    ask = plugin.Generate("rows.jsonl", "{{ q }}", models="m", temperature=0.5, stop=["\n"], name="ask")
    with pytest.raises(StageArgumentError, match=r"Judge\(max_tokens=0\)"):
        plugin.Judge(ask, "{{ response }}", model="j", max_tokens=0)
    with pytest.raises(StageArgumentError, match=r"Judge\(\) argument template: .*"):
        plugin.Judge(ask, "{{ response ", model="j")
    with pytest.raises(StageArgumentError, match=r"Generate\(\) argument sampling\.x: .*not one of"):
        plugin.Generate("rows.jsonl", "{{ q }}", models="m", sampling={"x": {"temperature": 1.0}})
    with pytest.raises(StageArgumentError, match=r"Judge\(of=\.\.\.\) is a str"):
        plugin.Judge("answer", "{{ response }}", model="j")  # type: ignore[arg-type]


def test_tables_and_plots_are_the_same_bytes_every_time(tmp_path: Path) -> None:
    ctx = plugin.StageContext(None, "r", LocalStore(str(tmp_path)))  # type: ignore[arg-type]
    rows = [{"model": "a", "acc": 0.5}, {"model": "b", "acc": 0.25, "n": 3}]
    assert plugin.write_csv(ctx, "t.csv", rows) == "t.csv"
    assert ctx.read_artifact("t.csv") == b"model,acc,n\na,0.5,\nb,0.25,3\n"
    grouped = {"exact": {"a": 0.5, "b": 0.25}, "judge": {"a": 0.4, "b": 0.3}}
    for name, magic in (("p.png", b"\x89PNG"), ("p.svg", b"<?xml")):
        plugin.bar_plot(ctx, name, grouped, title="accuracy", ylim=(0, 1))
        first = ctx.read_artifact(name)
        plugin.bar_plot(ctx, name, grouped, title="accuracy", ylim=(0, 1))
        assert first.startswith(magic) and ctx.read_artifact(name) == first
    plugin.bar_plot(ctx, "one.png", {"a": 1.0, "b": 2.0})
    with pytest.raises(ConfigError, match=r"\.png or \.svg"):
        plugin.bar_plot(ctx, "p.jpg", {"a": 1.0})


def _broken_reduce(ctx: Any, rows: Any) -> list[str]:
    return [rows[0]["no-such-column"]]


def test_a_plugins_own_reduce_failing_names_its_line(tmp_path: Path) -> None:
    class Run:
        pipeline = "mine:Study"

    cfg = msgspec.defstruct("Cfg", [("run", Any)])(run=Run())
    ctx = plugin.StageContext(cfg, "r", LocalStore(str(tmp_path)))  # type: ignore[arg-type]
    with pytest.raises(PluginError) as err:
        _own_reduce(_broken_reduce, ctx, "grade", [{"model": "a"}])
    line = _broken_reduce.__code__.co_firstlineno + 1
    assert err.value.where == f"{__file__}:{line}" and err.value.stage == "grade"
    assert "KeyError: 'no-such-column'" in str(err.value) and "mine:Study" in str(err.value)


ECHO = """
from punchline.plugin import Message, Model, Pipeline, ProviderRequest, Settings, UnitSpec, resolve_model


class EchoSettings(Settings):
    model: Model
    count: int = 3


class EchoStage:
    name = "echo"

    def plan(self, ctx):
        provider, model = resolve_model(ctx.cfg, ctx.cfg.settings.model)
        for i in range(ctx.cfg.settings.count):
            request = ProviderRequest(provider=provider, model=model, messages=(Message("user", f"say {i}"),))
            yield UnitSpec(unit_id=f"{i:06d}", request=request)

    def reduce(self, ctx, results):
        return []


class Echo(Pipeline):
    name = "echo"
    settings_type = EchoSettings

    def stages(self, cfg):
        return [EchoStage()]


class Duck:  # no base class: the registry gives it the defaults it lacks
    name = "echo"
    settings_type = EchoSettings

    def stages(self, cfg):
        return [EchoStage()]
"""

ECHO_CONFIG = """
[run]
pipeline = "echo_mod:Echo"

[providers.{provider}]
base_url = "simulated"
models = {{ big = {{ id = "sim-big", input_usd_per_mtok = 1.0, output_usd_per_mtok = 1.0 }} }}

[echo]
model = "{model}"
count = 4
"""


@pytest.mark.parametrize(
    ("ref", "provider", "model"),
    [("Echo", "sim", "big"), ("Echo", "sim", "sim:big"), ("Echo", "p", "p:big"), ("Duck", "p", "p:big")],
)
def test_a_stage_of_ones_own_resolves_its_models_by_the_documented_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ref: str, provider: str, model: str
) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "echo_mod", raising=False)
    (tmp_path / "echo_mod.py").write_text(ECHO)
    config = tmp_path / "echo.toml"
    text = ECHO_CONFIG.replace("echo_mod:Echo", f"echo_mod:{ref}")
    config.write_text(text.format(provider=provider, model=model))
    cfg = load_config(config)
    (estimate,) = plan_run(cfg)
    assert (estimate.stage, estimate.requests, estimate.exact) == ("echo", 4, True)
    assert estimate.cost_usd > 0  # the nick became the priced model id
    assert type(pipeline_of(cfg)).__name__ == ("WithDefaults" if ref == "Duck" else "Echo")
    refs = pipeline_of(cfg).provider_refs(cfg.settings)
    assert refs == ([] if ":" not in model else [("echo.model", provider)])
    ctx = plugin.StageContext(cfg, "r", LocalStore(str(tmp_path / "store")))
    assert pipeline_of(cfg).headlines(ctx) == []  # a default
    config.write_text(text.format(provider=provider, model="nope:big"))
    with pytest.raises(ConfigError, match="unknown provider 'nope'") as err:
        load_config(config)
    assert err.value.field == "echo.model"


def test_the_defaults_module_names_no_pipeline() -> None:
    names = re.compile("|".join(registry.shipped()), re.IGNORECASE)
    found = [line for line in Path(pipeline_base.__file__).read_text().splitlines() if names.search(line)]
    assert found == []


def test_run_simulated_names_a_run_by_its_settings_and_its_input_files_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("rows.jsonl").write_text('{"id": 1}\n')
    s = msgspec.convert({"data": "rows.jsonl"}, Study)
    providers = plugin.simulated_providers(s)
    first = _content_id("study", s, providers)
    assert first == _content_id("study", s, providers) and first.startswith("study-")
    Path("rows.jsonl").write_text('{"id": 2}\n')  # an edited input is another run, not the old one's results
    assert _content_id("study", s, providers) != first
    assert _content_id("study", msgspec.structs.replace(s, models=["other"]), providers) != first


class PingStage:
    name = "ping"

    def plan(self, ctx: plugin.StageContext) -> Iterator[plugin.UnitSpec]:
        provider, model = plugin.resolve_model(ctx.cfg, ctx.cfg.settings.model)
        for i in range(3):
            request = plugin.ProviderRequest(
                provider=provider, model=model, messages=(plugin.Message("user", f"ping {i}"),), n=2, temperature=1.0
            )
            yield plugin.UnitSpec(unit_id=f"{i:06d}", request=request)

    def reduce(self, ctx: plugin.StageContext, results: Any) -> list[str]:
        texts = [t for unit in sorted(results) for t in results[unit].response.texts]
        ctx.write_artifact("texts.json", msgspec.json.encode(texts))
        return ["texts.json"]


class PingSettings(plugin.Settings):
    model: plugin.Model = "sim-small"


class Ping(plugin.Pipeline):
    """A plug-in with simulated answers of its own, run as an object (not installed)."""

    name = "ping"
    settings_type = PingSettings

    def stages(self, cfg: plugin.RunConfig) -> list[plugin.Stage]:
        return [PingStage()]

    def simulate(self, request: plugin.SimRequest) -> str | None:
        if not request.user.startswith("ping "):
            return None
        return f"pong {request.user.removeprefix('ping ')}.{request.choice} {request.rng().randrange(10)}"


def test_a_plugins_simulate_hook_answers_its_own_requests_in_run_simulated(tmp_path: Path) -> None:
    run = plugin.run_simulated(Ping(), {}, tmp_dir=tmp_path)
    texts = msgspec.json.decode(run.artifact("texts.json"))
    expected = [f"pong {row}.{choice}" for row in range(3) for choice in range(2)]  # not a generic answer
    assert [t.rsplit(" ", 1)[0] for t in texts] == expected
    assert run.calls > 0
