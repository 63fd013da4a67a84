"""Templates: Jinja2 in a sandbox; a missing field is one line naming the file, row and template."""

from __future__ import annotations

import pytest

from punchline.cluster.stages.compiled import CompiledPrompts
from punchline.cluster.stages.rows import Row
from punchline.cluster.stages.settings import MessageTemplate, ParseSettings, PromptsSettings
from punchline.cluster.stages.templates import ChatTemplate, NullField, Template
from punchline.data.errors import ConfigError, InputError


def _row(**fields: object) -> Row:
    return Row(id="1", where="line 4", fields=dict(fields))


def test_renders_fields_filters_and_loops() -> None:
    chat = ChatTemplate(
        prompt="Q: {{ question }}\nOptions: {{ options | join(' | ') }}\n{% for o in options %}- {{ o }}\n{% endfor %}",
        system="You are {{ persona | default('terse') }}.",
        messages=None,
        prefix="prompts",
    )
    msgs = chat.render({"question": "2+2?", "options": ["3", "4"]}, file="f", record="line 1")
    assert [(m.role, m.content) for m in msgs] == [
        ("system", "You are terse."),
        ("user", "Q: 2+2?\nOptions: 3 | 4\n- 3\n- 4\n"),
    ]


def test_chat_messages_with_roles() -> None:
    chat = ChatTemplate(
        prompt=None,
        system="sys",
        messages=[
            MessageTemplate(role="user", content="Translate {{ word }}"),
            MessageTemplate(role="assistant", content="Sure."),
            MessageTemplate(role="user", content="Now {{ word | upper }}"),
        ],
        prefix="prompts",
    )
    msgs = chat.render({"word": "cat"}, file="f", record="line 1")
    assert [m.role for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[-1].content == "Now CAT"


def test_a_missing_field_is_one_line_naming_file_row_and_template() -> None:
    t = Template("Q: {{ question }} ({{ topic }})", field="prompts.prompt")
    with pytest.raises(InputError) as err:
        t.render({"question": "x"}, file="rows.jsonl", record="line 4")
    msg = str(err.value)
    assert "\n" not in msg and "rows.jsonl" in msg and "line 4" in msg and "'topic' is undefined" in msg
    assert "prompts.prompt" in msg


def test_the_sandbox_refuses_python_internals() -> None:
    t = Template("{{ question.__class__.__mro__ }}", field="prompts.prompt")
    with pytest.raises(InputError):
        t.render({"question": "x"}, file="f", record="line 1")


def test_syntax_errors_are_config_errors_naming_the_key() -> None:
    with pytest.raises(ConfigError) as err:
        Template("{{ question ", field="prompts.system", file="c.toml")
    assert err.value.field == "prompts.system" and err.value.file == "c.toml"


def _settings(**kw: object) -> PromptsSettings:
    base: dict[str, object] = {"data": "rows.jsonl", "provider": "sim", "models": ["a", "b"], "prompt": "Q: {{ q }}"}
    base.update(kw)
    return PromptsSettings(**base)  # type: ignore[arg-type]


def test_prompt_or_messages_exactly_one() -> None:
    with pytest.raises(ConfigError, match="exactly one of prompt and messages"):
        CompiledPrompts(_settings(prompt=None))
    with pytest.raises(ConfigError, match="exactly one of prompt and messages"):
        CompiledPrompts(_settings(messages=[MessageTemplate(role="user", content="x")]))


def test_check_rows_finds_a_missing_field_in_any_row_before_any_call() -> None:
    compiled = CompiledPrompts(_settings())
    rows = [_row(q="fine"), Row(id="2", where="line 9", fields={"other": 1})]
    with pytest.raises(InputError) as err:
        compiled.check_rows(rows, "rows.jsonl")
    assert err.value.record == "line 9" and "'q' is undefined" in str(err.value)


def test_the_judge_template_is_checked_against_rows_and_parsed_fields() -> None:
    from punchline.cluster.stages.settings import JudgeSettings

    judge = JudgeSettings(model="b", prompt="{{ q }} / {{ response }} / {{ parsed.answer }} / {{ row.gold }}")
    compiled = CompiledPrompts(_settings(judge=judge, parse=ParseSettings(regex=r"A: (?P<answer>\w+)")))
    compiled.check_rows([_row(q="x", gold="y")], "rows.jsonl")
    with pytest.raises(InputError, match="gold"):
        compiled.check_rows([_row(q="x")], "rows.jsonl")
    # parsed.<field> the parser cannot give is caught too
    typo = JudgeSettings(model="b", prompt="{{ parsed.answr }}")
    compiled = CompiledPrompts(_settings(judge=typo, parse=ParseSettings(regex=r"A: (?P<answer>\w+)")))
    with pytest.raises(InputError, match="answr"):
        compiled.check_rows([_row(q="x")], "rows.jsonl")
    msgs = CompiledPrompts(_settings(judge=judge, parse=ParseSettings(regex=r"A: (?P<answer>\w+)"))).judge_messages(
        _row(q="x", gold="y"), "rows.jsonl", response="A: z", parsed={"answer": "z"}, model="a", sample=2
    )
    assert msgs[-1].content == "x / A: z / z / y"


def test_config_checks_models_and_sampling() -> None:
    from punchline.cluster.stages.settings import Sampling, sampling_for

    with pytest.raises(ConfigError, match="twice"):
        CompiledPrompts(_settings(models=["a", "a"]))
    with pytest.raises(ConfigError) as err:
        CompiledPrompts(_settings(sampling={"c": Sampling(temperature=0.1)}))
    assert err.value.field == "prompts.sampling.c"
    s = _settings(temperature=0.7, max_tokens=50, stop=["\n"], sampling={"b": Sampling(temperature=0.1, stop=[])})
    assert (sampling_for(s, "a").temperature, sampling_for(s, "a").stop) == (0.7, ("\n",))
    assert (sampling_for(s, "b").temperature, sampling_for(s, "b").stop, sampling_for(s, "b").max_tokens) == (
        0.1,
        (),
        50,
    )
    compiled = CompiledPrompts(_settings(models=["a", "other:big"]))
    assert compiled.models == [("a", "sim", "a"), ("other:big", "other", "big")]


def test_a_null_cell_is_refused_when_rendered_but_may_be_tested() -> None:
    row = {"q": NullField("q"), "row": {"q": NullField("q")}}
    for source in ("{{ q }}", "{{ row.q }}", "{{ q | upper }}", "x{{ q ~ '!' }}"):
        with pytest.raises(InputError) as err:
            Template(source, field="prompts.prompt").render(row, file="d.jsonl", record="line 3")
        assert err.value.field == "q" and err.value.record == "line 3" and 'null = "empty"' in str(err.value)
    tests = "{% if q %}set{% endif %}|{{ q or 'n/a' }}|{{ q is none }}|{{ row | tojson }}"
    assert Template(tests, field="p").render(row, file=None, record="r") == '|n/a|True|{"q": null}'
