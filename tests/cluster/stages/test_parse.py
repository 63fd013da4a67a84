"""The parse step: regex named groups, JSON answers checked against a schema, failures as a column value."""

from __future__ import annotations

import pytest

from punchline.cluster.stages.parse import Parser
from punchline.cluster.stages.settings import ParseSettings
from punchline.data.errors import ConfigError

SCHEMA = {
    "type": "object",
    "required": ["answer", "confidence"],
    "properties": {"answer": {"type": "string"}, "confidence": {"type": "number", "minimum": 0, "maximum": 1}},
}


def test_regex_named_groups_become_fields() -> None:
    p = Parser(ParseSettings(regex=r"Answer:\s*(?P<answer>\w+)(?:\s*\((?P<why>[^)]*)\))?", flags="i"), field="p")
    assert p.names == ("answer", "why")
    assert p.parse("Let me think.\nanswer: Paris (capital)").fields == {"answer": "Paris", "why": "capital"}
    assert p.parse("ANSWER: Rome").fields == {"answer": "Rome", "why": None}
    failed = p.parse("I do not know")
    assert failed.fields is None and failed.error == "no match for the regex"


def test_json_plain_fenced_and_embedded() -> None:
    p = Parser(ParseSettings(json_schema=SCHEMA), field="p")
    assert p.names == ("answer", "confidence")
    assert p.parse('{"answer": "a", "confidence": 0.5}').fields == {"answer": "a", "confidence": 0.5}
    fenced = 'Sure!\n```json\n{"answer": "b", "confidence": 1}\n```\nHope it helps.'
    assert p.parse(fenced).fields == {"answer": "b", "confidence": 1}
    assert p.parse('My answer is {"answer": "c", "confidence": 0} ok').fields == {"answer": "c", "confidence": 0}


def test_json_failures_say_why() -> None:
    p = Parser(ParseSettings(json_schema=SCHEMA), field="p")
    assert p.parse("no json here").error == "no JSON value in the answer"
    wrong = p.parse('{"answer": "a", "confidence": 3}')
    assert wrong.fields is None and wrong.error is not None and "confidence" in wrong.error
    missing = p.parse('{"answer": "a"}')
    assert missing.error is not None and "confidence" in missing.error


def test_a_non_object_json_answer_is_kept_as_value() -> None:
    p = Parser(ParseSettings(json_schema={"type": "array", "items": {"type": "integer"}}), field="p")
    assert p.parse("[1, 2, 3]").fields == {"value": [1, 2, 3]}
    assert p.parse('["x"]').error is not None


@pytest.mark.parametrize(
    "settings,field,message",
    [
        (ParseSettings(regex="(unclosed"), "prompts.parse.regex", "not a valid regex"),
        (ParseSettings(regex=r"Answer: (\w+)"), "prompts.parse.regex", "no named group"),
        (ParseSettings(json_schema={"type": "nonsense"}), "prompts.parse.json_schema", "not a valid JSON schema"),
        (ParseSettings(), "prompts.parse", "exactly one of regex and json_schema"),
        (ParseSettings(regex="(?P<a>x)", json_schema={}), "prompts.parse", "exactly one"),
    ],
)
def test_bad_parse_settings_are_config_errors_naming_the_key(settings: ParseSettings, field: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        Parser(settings, field="prompts.parse", file="c.toml")
    assert err.value.field == field and message in str(err.value) and "\n" not in str(err.value)
