"""A unit names its pipeline's own response validator by module path; the engine knows none of them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from punchline.data.errors import RetryableProviderError
from punchline.data.requests import ProviderResponse
from punchline.workers.calls.validators import validator

PLUGIN = """
def must_say(word, response):
    if word not in response.texts[0]:
        raise ValueError(f"no {word!r} in the answer")


def json_object(response):
    import json
    if not isinstance(json.loads(response.texts[0]), dict):
        raise ValueError("not an object")
"""


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "my_checks.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_checks"
    sys.modules.pop("my_checks", None)


def test_a_plugins_validator_is_found_by_its_module_path(plugin: str) -> None:
    validator(f"{plugin}:json_object")(ProviderResponse(texts=['{"a": 1}']))
    with pytest.raises(RetryableProviderError, match=f"fails {plugin}:json_object: not an object"):
        validator(f"{plugin}:json_object")(ProviderResponse(texts=["[1]"]))
    with pytest.raises(RetryableProviderError):  # not JSON at all: also a malformed answer, retried
        validator(f"{plugin}:json_object")(ProviderResponse(texts=["nope"]))


def test_an_argument_after_the_function_is_passed_first(plugin: str) -> None:
    validator(f"{plugin}:must_say:yes")(ProviderResponse(texts=["yes indeed"]))
    with pytest.raises(RetryableProviderError, match="no 'yes'"):
        validator(f"{plugin}:must_say:yes")(ProviderResponse(texts=["no"]))


def test_every_validator_first_asks_for_an_answer(plugin: str) -> None:
    for name in ("", f"{plugin}:json_object"):
        with pytest.raises(RetryableProviderError, match="no choices"):
            validator(name)(ProviderResponse(texts=[]))


@pytest.mark.parametrize("name", ["classify_json", "no_such_module_xyz:f", "punchline.data.units:no_such_function"])
def test_a_validator_that_cannot_be_loaded_is_named(name: str) -> None:
    with pytest.raises(KeyError, match=name.partition(":")[0]):
        validator(name)


def test_the_builtins_validators_live_with_their_pipelines() -> None:
    validator("punchline.pipelines.humor.data.judge:check_score")(ProviderResponse(texts=["Reasoning.\nSCORE: 1"]))
    with pytest.raises(RetryableProviderError, match="no valid score"):
        validator("punchline.pipelines.humor.data.judge:check_score")(ProviderResponse(texts=["no number here"]))
