"""One reader for every plug-in group (data/plugins.py): installed targets read afresh, and a plug-in that cannot
be loaded is one line naming it."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from punchline.data.errors import ConfigError
from punchline.data.plugins import COMMANDS, PIPELINES, PROVIDER_KINDS, PluginGroup


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Path]:
    sys.path.insert(0, str(tmp_path))
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m.startswith("plugged_")]:
            del sys.modules[name]


def test_each_group_is_spelled_once_and_holds_punchlines_own() -> None:
    assert len({PIPELINES.name, PROVIDER_KINDS.name, COMMANDS.name}) == 3
    assert {"puns", "humor", "prompts"} <= set(PIPELINES.targets())
    assert {"openai", "anthropic"} <= set(PROVIDER_KINDS.targets())
    assert all(target.startswith("punchline.") for target in COMMANDS.targets().values())


def test_a_package_installed_since_is_seen_and_loaded(site: Path) -> None:
    group = PluginGroup("punchline.test-plugins", "test plug-in")
    assert group.targets() == {}
    (site / "plugged_thing.py").write_text("THING = 42\n")
    dist = site / "plugged_thing-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: plugged-thing\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{group.name}]\nthing = plugged_thing:THING\nwhole = plugged_thing\n")
    assert group.targets() == {"thing": "plugged_thing:THING", "whole": "plugged_thing"}
    assert group.load("thing", "plugged_thing:THING", field="kind") == 42
    whole = group.load("whole", "plugged_thing", field="kind")
    assert isinstance(whole, types.ModuleType) and whole.THING == 42


@pytest.mark.parametrize(
    ("target", "words"),
    [
        ("plugged_missing:X", ["test plug-in 'p' (plugged_missing:X) cannot be loaded", "ModuleNotFoundError"]),
        ("plugged_raises:X", ["cannot be loaded", "RuntimeError: its own bug"]),
        ("plugged_ok:NOPE", ["test plug-in 'p' (plugged_ok:NOPE): module 'plugged_ok' has no 'NOPE'"]),
    ],
)
def test_a_plugin_that_cannot_be_loaded_is_one_line_naming_it(site: Path, target: str, words: list[str]) -> None:
    (site / "plugged_raises.py").write_text("raise RuntimeError('its own bug')\n")
    (site / "plugged_ok.py").write_text("X = 1\n")
    group = PluginGroup("punchline.test-plugins", "test plug-in")
    with pytest.raises(ConfigError) as err:
        group.load("p", target, file="run.toml", record="providers.p", field="kind")
    text = str(err.value)
    assert all(w in text for w in words), text
    assert "\n" not in text and err.value.field == "kind" and err.value.record == "providers.p"
