"""The pipeline registry: built-ins, ``package.module:Name``, entry points, and the one-line failures;
and the engine (driver, config loader, planner, coordinator, CLI, run/status/plan commands) never
names a pipeline."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import punchline
from punchline.cluster import registry
from punchline.cluster.cli import starter
from punchline.cluster.cli.main import main
from punchline.cluster.config import load_config
from punchline.cluster.pipeline import StageContext
from punchline.cluster.run.planner import plan_run
from punchline.data.errors import ConfigError
from punchline.data.stores.local import LocalStore

ROOT = Path(punchline.__file__).parent

# The engine's modules (every one: ``engine_modules()`` below) learn everything about a workload from its Pipeline
# object, so none names a built-in: in code, strings, docstrings or comments (an example there uses a placeholder,
# ``[<pipeline>.<stage>]``). Two honest exceptions, each by what it is:
# - ``prompts`` is also a word of the engine's: the generic generate/judge stages (cluster/stages/) decode a
#   ``[prompts]``-shaped table, and ``punchline.prompts`` is the notebook API over them. That no engine module
#   imports the prompts *pipeline* (``punchline.pipelines.prompts``) is test_no_engine_module_imports_a_pipeline's.
# - ``punchline init`` writes the demo configs and samples, named after what they demo (``humor_demo.toml``): a
#   file's name, taken out of the line (starter.CONFIGS and SAMPLES) before it is searched.
WORDS = {"prompts"}
NAMES = re.compile("|".join(sorted(set(registry.shipped()) - WORDS)), re.IGNORECASE)
DEMO_FILES = re.compile("|".join(re.escape(name) for name in (*starter.CONFIGS, *starter.SAMPLES)))


def test_the_engine_never_names_a_pipeline() -> None:
    assert {"puns", "humor", "curate", "prompts"} <= set(registry.shipped())
    engine = engine_modules()
    assert {"workers/fake/answers.py", "viewer/artifacts.py", "data/units.py", "api.py"} <= set(engine)
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert NAMES.search(pyproject), "the pattern finds the names where they are (punchline's own entry points)"
    assert NAMES.search("Humor's report") and not NAMES.search(DEMO_FILES.sub("", "configs/humor_demo.toml"))
    found = []
    for rel in engine:
        for n, line in enumerate((ROOT / rel).read_text().splitlines(), 1):
            if NAMES.search(DEMO_FILES.sub("", line)):
                found.append(f"{rel}:{n}: {line.strip()}")
    assert found == [], "pipeline names in the engine:\n" + "\n".join(found)


# A built-in's own modules: its folder under pipelines/, its data code (``data/``) included.
PIPELINE_MODULE = re.compile(r"punchline\.pipelines\.\w")  # the bare name is also the entry-point group
# Engine modules that still import a built-in's module, each with why; the list may only shrink.
KNOWN: dict[str, str] = {}


def engine_modules() -> list[str]:
    """Every engine module: every .py of the package but the built-in pipelines' folder (``pipelines/``)."""
    return sorted(
        path.relative_to(ROOT).as_posix()
        for top in ("cluster", "workers", "schedulers", "data", "services", "viewer", "plugin")
        for path in (ROOT / top).rglob("*.py")
    ) + sorted(p.name for p in ROOT.glob("*.py"))


def pipeline_imports(source: str) -> list[str]:
    """The built-ins' modules a module imports: by ``import`` / ``from`` anywhere in it (a lazy import too), or
    named in a string (``importlib.import_module("punchline.pipelines...")``); a docstring or a comment may say
    where a built-in's code lives."""
    tree = ast.parse(source)
    docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if id(node) in docs:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value]
        found += [name for name in names if PIPELINE_MODULE.search(name)]
    return found


def test_no_engine_module_imports_a_pipeline() -> None:
    modules = engine_modules()
    assert "workers/fake/server.py" in modules and "cluster/config.py" in modules and "data/units.py" in modules
    assert "cluster/stages/generate.py" in modules and "notebook.py" in modules
    assert not any(m.startswith("pipelines/") for m in modules)
    importing = {rel: pipeline_imports((ROOT / rel).read_text()) for rel in modules}
    importing = {rel: names for rel, names in importing.items() if names}
    unexpected = {rel: names for rel, names in importing.items() if rel not in KNOWN}
    assert unexpected == {}, "engine modules that import a pipeline's own modules"
    assert set(importing) == set(KNOWN), "a module of KNOWN imports no pipeline any more: drop it from the list"


def test_the_check_finds_an_import_of_a_pipeline() -> None:
    assert pipeline_imports("from punchline.pipelines.humor.data.judge import JUDGE_MARKER\n") != []
    assert pipeline_imports("def f():\n    import punchline.pipelines.puns.pipeline\n") != []
    assert pipeline_imports("x = importlib.import_module('punchline.pipelines.prompts.pipeline')\n") != []
    assert pipeline_imports("from punchline.cluster.stages.rows import load_rows\n") == []  # the engine's stages
    assert pipeline_imports("from punchline.data.simulator import SimRequest\nimport punchline.data.punsy\n") == []


PLUGIN = """
from typing import Annotated

import msgspec

from punchline.data.requests import Message, ProviderRequest
from punchline.data.units import UnitSpec


class EchoSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    provider: str
    model: str
    count: Annotated[int, msgspec.Meta(ge=1, le=100)] = 3


class EchoStage:
    name = "echo"

    def plan(self, ctx):
        s = ctx.cfg.settings
        model = ctx.cfg.provider(s.provider).model_id(s.model)
        return [
            UnitSpec(
                unit_id=f"{i:03d}",
                request=ProviderRequest(provider=s.provider, model=model, messages=(Message("user", f"say {i}"),)),
            )
            for i in range(s.count)
        ]

    def reduce(self, ctx, results):
        ctx.write_artifact("echo.txt", b"ok")
        return ["echo.txt"]


class Echo:
    name = "echo"
    settings_type = EchoSettings

    def check_settings(self, settings, source):
        pass

    def provider_refs(self, settings):
        return [("echo.provider", settings.provider)]

    def stage_mode(self, settings, stage):
        return None

    def input_paths(self, settings):
        return []

    def check_inputs(self, cfg):
        pass

    def stages(self, cfg):
        return [EchoStage()]

    def estimate(self, cfg, stage):
        return []

    def headlines(self, ctx):
        return [f"echoed {ctx.cfg.settings.count}"]

    def simulator_knobs(self, cfg, sim):
        return sim


class OldEcho(Echo):
    def headlines(self, cfg, store, run_id):  # written before headlines took the stage context
        return [f"echoed {cfg.settings.count} of {run_id}"]


class Partial:
    name = "partial"
    settings_type = EchoSettings

    def stages(self, cfg):
        return []


NOT_A_PIPELINE = {"name": "echo"}
"""

CONFIG = """
[run]
pipeline = "{ref}"

[providers.sim]
kind = "openai"
base_url = "simulated"

[providers.sim.models]
m = {{ id = "model-m", input_usd_per_mtok = 0, output_usd_per_mtok = 0 }}

[echo]
provider = "sim"
model = "m"
count = {count}
"""


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's package on sys.path: ``echo_plugin`` (good, partial, not a pipeline) and ``broken_plugin``."""
    (tmp_path / "echo_plugin.py").write_text(PLUGIN)
    (tmp_path / "broken_plugin.py").write_text("import no_such_module_here\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def config(tmp_path: Path, ref: str, count: int = 4) -> Path:
    p = tmp_path / "run.toml"
    p.write_text(CONFIG.format(ref=ref, count=count))
    return p


@pytest.mark.parametrize("name", registry.shipped())
def test_a_builtin_is_found_by_name(name: str) -> None:
    pipeline = registry.resolve(name)
    assert pipeline.name == name and name in registry.available()


def test_a_module_name_reference_loads_the_users_pipeline(plugin: Path) -> None:
    cfg = load_config(config(plugin, "echo_plugin:Echo", count=4))
    pipeline = registry.pipeline_of(cfg)
    assert pipeline.name == "echo" and type(pipeline).__module__ == "echo_plugin"
    assert cfg.settings.count == 4 and type(cfg.settings).__name__ == "EchoSettings"
    (estimate,) = plan_run(cfg)  # the planner runs any pipeline's stages
    assert (estimate.stage, estimate.requests, estimate.exact) == ("echo", 4, True)
    assert pipeline.headlines(StageContext(cfg, "r1", LocalStore(str(plugin / "store")))) == ["echoed 4"]


def test_a_plugin_with_the_old_headlines_signature_still_says_its_headlines(plugin: Path) -> None:
    cfg = load_config(config(plugin, "echo_plugin:OldEcho", count=3))
    ctx = StageContext(cfg, "r2", LocalStore(str(plugin / "store")))
    assert registry.pipeline_of(cfg).headlines(ctx) == ["echoed 3 of r2"]  # (cfg, store, run_id) from the context


def test_the_users_table_is_checked_with_file_and_key_path(plugin: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(config(plugin, "echo_plugin:Echo", count=0))
    assert err.value.field == "echo.count" and str(plugin / "run.toml") in str(err.value)
    bad = config(plugin, "echo_plugin:Echo").read_text().replace('provider = "sim"\nmodel', 'provider = "x"\nmodel')
    (plugin / "run.toml").write_text(bad)
    with pytest.raises(ConfigError, match="unknown provider 'x'") as err:
        load_config(plugin / "run.toml")
    assert err.value.field == "echo.provider"


def test_an_entry_point_names_an_installed_pipeline(plugin: Path) -> None:
    dist = plugin / "echo_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: echo-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{registry.GROUP}]\nechoing = echo_plugin:Echo\n")
    assert "echoing" in registry.available()
    assert registry.resolve("echoing").name == "echo"
    cfg = load_config(config(plugin, "echoing"))
    assert cfg.settings.count == 4


@pytest.mark.parametrize(
    ("ref", "words"),
    [
        ("broken_plugin:Thing", ["'broken_plugin:Thing' cannot be imported", "no_such_module_here"]),
        ("echo_plugin:NOT_A_PIPELINE", ["'echo_plugin:NOT_A_PIPELINE' is not a Pipeline"]),
        ("echo_plugin:EchoStage", ["'echo_plugin:EchoStage' is not a Pipeline", "stages"]),  # a stage, no stages()
        ("echo_plugin:Missing", ["'echo_plugin:Missing'", "has no 'Missing'"]),
        ("nope", ["unknown pipeline 'nope'"]),
    ],
)
def test_a_bad_plugin_is_one_line_naming_it(
    plugin: Path, capsys: pytest.CaptureFixture[str], ref: str, words: list[str]
) -> None:
    assert main(["plan", str(config(plugin, ref))]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "run.pipeline" in err and str(plugin / "run.toml") in err
    for w in words:
        assert w in err
