"""The generic tool-call format (issue 30.2): the prompt a template without tools gets, the
grammar that holds the reply to text or one valid call, lenient schemas, and the parser."""

from __future__ import annotations

import copy
import json

import llguidance
import llguidance.hf
import pytest
from transformers import AutoTokenizer

from core.engine import generic_tools
from core.engine.constrain import tool_name
from core.engine.prompt import render_prompt
from core.engine.types import ChatMessage, GenerationRequest, ToolCall
from core.models.load.loader import load_model
from tests.core.engine.helpers import TIME, WEATHER

# Claude Code's tool schemas use propertyNames, which the grammar library refuses
STRICT = {
    "type": "function",
    "function": {
        "name": "set_env",
        "description": "Set variables",
        "parameters": {
            "type": "object",
            "properties": {
                "vars": {
                    "type": "object",
                    "propertyNames": {"pattern": "^[A-Z_]+$"},
                    "additionalProperties": {"type": "string"},
                },
                "format": {"type": "string"},
            },
            "required": ["vars"],
        },
    },
}
CALL = ToolCall("call_1", "get_weather", '{"city":"Paris","unit":"C"}')
CHAT = (
    ChatMessage("system", "Be brief."),
    ChatMessage("user", "Weather in Paris?"),
    ChatMessage("assistant", "", tool_calls=(CALL,)),
    ChatMessage("tool", "18 degrees", tool_call_id="call_1", name="get_weather"),
    ChatMessage("user", "And now?"),
)


@pytest.fixture(scope="module")
def loaded(tiny_model, tmp_path_factory):
    return load_model(str(tiny_model), tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_model):
    return AutoTokenizer.from_pretrained(str(tiny_model))


@pytest.fixture(scope="module")
def llg(hf_tokenizer):
    return llguidance.hf.from_tokenizer(hf_tokenizer)


def accepts(llg, hf_tokenizer, grammar: str, text: str) -> bool:
    matcher = llguidance.LLMatcher(llg, grammar, log_level=0)
    ids = hf_tokenizer.encode(text, add_special_tokens=False)
    return all(matcher.consume_token(t) for t in ids) and matcher.is_accepting()


def test_turns_put_the_tools_in_the_system_part_and_results_in_a_user_turn():
    turns = generic_tools.turns(CHAT, [WEATHER, TIME])
    assert [t["role"] for t in turns] == ["system", "user", "assistant", "user"]
    system = turns[0]["content"]
    assert system.startswith("Be brief.\n\n") and "<tool_call>" in system
    for tool in (WEATHER, TIME):
        assert json.dumps(tool["function"]["parameters"], separators=(",", ":")) in system
    assert turns[2]["content"] == generic_tools.call_text(CALL.name, CALL.arguments)
    # the tool result and the next user message are one user turn (roles alternate)
    assert turns[3]["content"] == (
        '<tool_result name="get_weather" id="call_1">\n18 degrees\n</tool_result>\n\nAnd now?'
    )


def test_the_prompt_of_a_template_without_tools(loaded):
    tokenizer = loaded.tokenizer
    assert generic_tools.applies(tokenizer)
    request = GenerationRequest(messages=CHAT, tools=(WEATHER, TIME))
    text = tokenizer.decode(render_prompt(tokenizer, request))
    assert "get_time" in text and '<tool_result name="get_weather"' in text
    # the same conversation's first request is a prefix of the second: the cache serves it
    first = render_prompt(tokenizer, GenerationRequest(messages=CHAT[:2], tools=(WEATHER, TIME)))
    second = render_prompt(tokenizer, request)
    assert second[: len(first)] == first
    none = GenerationRequest(messages=CHAT[:2], tools=(WEATHER,), tool_choice="none")
    assert "get_weather" not in tokenizer.decode(render_prompt(tokenizer, none))


def test_a_template_that_refuses_a_system_turn_gets_the_tools_in_the_user_turn(hf_tokenizer):
    tokenizer = copy.copy(hf_tokenizer)
    tokenizer.has_chat_template = True
    refusing = (
        "{%- for m in messages %}{%- if m['role'] == 'system' %}"
        "{{ raise_exception('System role not supported') }}{%- endif %}"
        "{{ m['role'] + ': ' + m['content'] + '\\n' }}{%- endfor %}"
    )
    tokenizer.chat_template = refusing
    text = generic_tools.render(tokenizer, CHAT[1:2], [WEATHER])
    assert text.startswith("user: You can call these tools") and "Weather in Paris?" in text


@pytest.mark.parametrize("forced", [False, True])
def test_the_grammar_takes_text_or_one_valid_call(llg, hf_tokenizer, forced):
    grammar = generic_tools.grammar([WEATHER, TIME], forced)
    good = generic_tools.call_text("get_time", '{"zone":"UTC"}')
    assert accepts(llg, hf_tokenizer, grammar, good)
    assert not accepts(llg, hf_tokenizer, grammar, good.replace("get_time", "get_date"))
    assert not accepts(llg, hf_tokenizer, grammar, good.replace("UTC", "PST"))
    assert accepts(llg, hf_tokenizer, grammar, "Just text, <b>tags</b> too.") is not forced
    assert not accepts(llg, hf_tokenizer, grammar, "text then " + good)


def test_a_schema_the_grammar_refuses_is_made_lenient(llg, hf_tokenizer):
    lenient = generic_tools.lenient_schema(STRICT["function"]["parameters"])
    assert "propertyNames" not in json.dumps(lenient)
    assert "format" in lenient["properties"]  # a property's name is never dropped
    grammar = generic_tools.grammar([STRICT], forced=False)
    call = generic_tools.call_text("set_env", '{"vars":{"A":"1"}}')
    assert accepts(llg, hf_tokenizer, grammar, call)
    assert generic_tools.lenient_schema("not a schema") == generic_tools.ANY_OBJECT


def test_parse_reads_a_call_back():
    parsed = generic_tools.parse('\n{"name":"get_time","arguments":{"zone":"UTC"}}\n', [])
    assert parsed == {"name": "get_time", "arguments": {"zone": "UTC"}}
    for bad in ("[1]", '{"arguments":{}}', '{"name":"x","arguments":[1]}', "{"):
        with pytest.raises(ValueError):
            generic_tools.parse(bad, [])
    assert tool_name(WEATHER) in generic_tools.instructions([WEATHER])


def test_the_tools_text_keeps_the_schema_but_not_its_meta_keywords():
    """What the model reads of a tool's schema: its properties and constraints, not the
    ``$schema`` URL Claude Code's tools start with."""
    schema = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"path": {"type": "string", "description": "where"}},
        "required": ["path"],
        "additionalProperties": False,
    }
    tool = {"type": "function", "function": {"name": "Write", "parameters": schema}}
    line = generic_tools.instructions([tool]).splitlines()[1]
    rendered = json.loads(line)
    assert rendered["name"] == "Write"
    assert rendered["parameters"] == {k: v for k, v in schema.items() if k != "$schema"}
    assert "json-schema.org" not in generic_tools.instructions([tool])
