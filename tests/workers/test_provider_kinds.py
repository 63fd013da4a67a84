"""Provider kinds come from the ``punchline.providers`` entry points: the built-ins register there, a package
adds one with an entry point alone (no edit elsewhere), and a kind the install lacks, or ``mode = "batch"``
for a kind without a batch API, is one line naming the file, the table and the field, exit 2."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from punchline.cluster.cli.main import main
from punchline.cluster.config import load_config
from punchline.data.errors import ConfigError
from punchline.data.provider_settings import ProviderSettings
from punchline.pipelines.puns.data.completions import greedy_request
from punchline.workers.fake.kind_wires import wire_of
from punchline.workers.provider import KIND_GROUP
from punchline.workers.providers import installed_kinds, kind_of, make_batch_provider, make_provider

ROOT = Path(__file__).resolve().parents[2]


def _config(tmp: Path, provider_table: str) -> Path:
    rows = tmp / "rows.jsonl"
    rows.write_text(json.dumps({"id": "a", "q": "why?"}) + "\n")
    path = tmp / "run.toml"
    path.write_text(
        f"""
[run]
pipeline = "prompts"

[providers.p]
{provider_table}

[providers.p.models]
m = {{ id = "openai/sim/m", input_usd_per_mtok = 0, output_usd_per_mtok = 0 }}

[prompts]
data = "{rows}"
provider = "p"
models = ["m"]
prompt = "{{{{ q }}}}"
"""
    )
    return path


def test_the_built_in_kinds_are_entry_points() -> None:
    assert {"openai", "anthropic", "litellm"} <= set(installed_kinds())
    assert kind_of("openai").has_batches and kind_of("anthropic").has_batches and not kind_of("litellm").has_batches
    assert kind_of("anthropic").wire_calls(ProviderSettings(kind="anthropic"), 3) == 3  # the Messages API has no n
    assert kind_of("openai").wire_calls(ProviderSettings(kind="openai"), 3) == 1
    # each brings its offline twin, or reuses another kind's
    assert wire_of("openai").name == "openai" and wire_of("anthropic").name == "anthropic"
    assert wire_of("litellm") is wire_of("openai")


@pytest.mark.parametrize(
    ("table", "field", "words"),
    [
        ('kind = "gemini"', "kind", ["unknown provider kind 'gemini'", "'anthropic'", "'litellm'", "'openai'"]),
        ('kind = "litellm"\nmode = "batch"', "mode", ["kind 'litellm' has no batch API", 'mode = "batch"']),
    ],
)
def test_a_kind_the_install_lacks_or_cannot_batch_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], table: str, field: str, words: list[str]
) -> None:
    cfg = _config(tmp_path, table)
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    assert err.value.record == "providers.p" and err.value.field == field
    assert main(["plan", str(cfg)]) == 2
    line = capsys.readouterr().err
    assert line.count("\n") == 1 and "Traceback" not in line
    assert str(cfg) in line and "providers.p" in line
    for w in words:
        assert w in line
    # a stage's own mode may ask for batches where the table does not: the factory refuses in one line too
    with pytest.raises(ConfigError, match="no batch API"):
        make_batch_provider("p", ProviderSettings(kind="litellm"))


def test_a_stage_asking_batches_of_a_kind_without_is_one_line_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _config(tmp_path, 'kind = "litellm"')
    cfg.write_text(cfg.read_text().replace('prompt = "', 'mode = "batch"\nprompt = "'))  # [prompts] mode: the stage's
    load_config(cfg)  # the provider's own table says online
    assert main(["plan", str(cfg)]) == 2
    line = capsys.readouterr().err
    assert line.count("\n") == 1 and str(cfg) in line and "providers.p" in line
    assert "stage generate sends its p units in batches" in line and "kind 'litellm' has no batch API" in line


ECHO_KIND = """
from punchline.data.requests import ProviderResponse
from punchline.workers.provider import ProviderKind


class EchoProvider:
    def __init__(self, name, settings):
        self.name, self.settings = name, settings

    async def complete(self, request):
        return ProviderResponse(texts=[request.messages[-1].content] * request.n, input_tokens=1, output_tokens=1)

    async def aclose(self):
        return None


KIND = ProviderKind("echo", "echo_kind:EchoProvider", summary="says the prompt back")
"""


def test_a_package_adds_a_kind_with_an_entry_point_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "echo_kind.py").write_text(ECHO_KIND)
    dist = tmp_path / "echo_kind-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: echo-kind\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{KIND_GROUP}]\necho = echo_kind\n")  # a module: its KIND
    monkeypatch.syspath_prepend(str(tmp_path))
    assert kind_of("echo").summary == "says the prompt back"  # installed since the kinds were first read
    assert "echo" in installed_kinds()
    cfg = load_config(_config(tmp_path, 'kind = "echo"'))
    provider = make_provider("p", cfg.providers["p"])
    answer = asyncio.run(provider.complete(greedy_request("p", "m", "hello there")))
    assert answer.texts == ["hello there"]
    with pytest.raises(ConfigError, match="kind 'echo' has no batch API"):
        load_config(_config(tmp_path, 'kind = "echo"\nmode = "batch"'))


def test_reading_a_config_imports_no_provider_sdk(tmp_path: Path) -> None:
    """Kinds are looked up, never their SDKs imported, until a worker makes a provider (seconds each)."""
    cfg = _config(tmp_path, 'kind = "litellm"')
    code = (
        "import sys; from punchline.cluster.config import load_config; "
        f"load_config({str(cfg)!r}); print(sorted(m for m in ('litellm', 'openai', 'anthropic') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
