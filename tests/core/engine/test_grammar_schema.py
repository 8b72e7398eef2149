"""Schemas as libraries and clients write them, for the grammar (issues 42.3 and 43.3):
``$ref`` into ``$defs`` / ``definitions`` (pydantic's own output, recursion included)
hoisted under a call's ``$defs``, reference loops refused by name, extra properties off
where a schema does not say, and the tool lists of real MCP servers. Each grammar is run
through llguidance's matcher on a tiny model's tokenizer: what it takes and refuses."""

from __future__ import annotations

import json
import time

import llguidance
import llguidance.hf
import pytest
from transformers import AutoTokenizer

from core.engine import constrain, generic_tools, grammar_schema
from core.engine.constrain import SchemaError, ToolMarkup, check_schema, check_tools
from core.engine.types import ChatMessage, GenerationRequest
from tests.core.engine.library_schemas import (
    EXAMPLES,
    PYDANTIC,
    function_tool,
    mcp_tools,
    pydantic_tools,
)

HERMES = ToolMarkup("<tool_call>", "</tool_call>", generic_tools.parse, json_calls=True)
LOOP = {"$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}}, "$ref": "#/$defs/A"}
MISSING = {"type": "object", "properties": {"a": {"$ref": "#/$defs/Nope"}}}


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_model):
    return AutoTokenizer.from_pretrained(str(tiny_model))


@pytest.fixture(scope="module")
def llg(hf_tokenizer):
    return llguidance.hf.from_tokenizer(hf_tokenizer)


def accepts(llg, hf_tokenizer, grammar: str, text: str) -> bool:
    matcher = llguidance.LLMatcher(llg, grammar, log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    ids = hf_tokenizer.encode(text, add_special_tokens=False)
    return all(matcher.consume_token(t) for t in ids) and matcher.is_accepting()


def forced(tools, choice: str = "required", name: str | None = None, **kw) -> GenerationRequest:
    return GenerationRequest(
        messages=(ChatMessage("user", "go"),),
        tools=tuple(tools),
        tool_choice=choice,
        tool_name=name,
        **kw,
    )


def call(name: str, arguments: dict | str) -> str:
    body = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return generic_tools.call_text(name, body)


# ------------------------------------------------------------------ $ref and $defs
@pytest.mark.parametrize("markup", [HERMES, generic_tools.MARKUP], ids=["hermes", "generic"])
@pytest.mark.parametrize("name", list(PYDANTIC))
def test_pydantic_schemas_hold_a_forced_call(llg, hf_tokenizer, markup, name):
    """pydantic's own output (``$ref`` into ``$defs`` or ``definitions``, Optional, an enum,
    recursion): the call's grammar compiles (on main: "Pointer '/$defs/Loc' does not
    exist"), takes the model's own JSON, refuses what the model refuses."""
    tools = pydantic_tools()
    check_tools(tools, "function", name)
    grammar = generic_tools.grammar_for(forced(tools, "function", name), markup)
    example = json.loads(EXAMPLES[name].model_dump_json(exclude_defaults=True))
    assert accepts(llg, hf_tokenizer, grammar, call(name, example))
    assert not accepts(llg, hf_tokenizer, grammar, call(name, {**example, "extra": 1}))
    if "weather" in name:
        wrong_unit = {**example, "unit": "K"}
        nested_extra = {**example, "loc": {**example["loc"], "zip": "1"}}
        for bad in (wrong_unit, nested_extra):
            assert not accepts(llg, hf_tokenizer, grammar, call(name, bad))
    else:  # recursion: a node's children are nodes, at most 2 of them
        leaf = {"name": "x"}
        wide = {"name": "x", "children": [leaf, {"name": "y", "children": [leaf, leaf, leaf]}]}
        assert not accepts(
            llg, hf_tokenizer, grammar, call(name, wide if name == "node" else {"root": wide})
        )


def test_every_pydantic_tool_at_once_under_one_grammar(llg, hf_tokenizer):
    """Several tools with ``$defs`` of the same names (each tool's under its own key)."""
    grammar = generic_tools.grammar(pydantic_tools(), forced=False)
    for name, example in EXAMPLES.items():
        arguments = json.loads(example.model_dump_json(exclude_defaults=True))
        assert accepts(llg, hf_tokenizer, grammar, call(name, arguments))
    assert accepts(llg, hf_tokenizer, grammar, "just text")


def test_hoisting_rebases_references_but_never_data():
    schema = {
        "type": "object",
        "properties": {
            "loc": {"$ref": "#/$defs/Loc"},
            "self": {"$ref": "#"},
            "far": {"$ref": "https://example.com/s.json"},
            "data": {"const": {"$ref": "#/$defs/Loc"}, "default": {"$ref": "#"}},
            "$ref": {"type": "string"},  # a property named $ref
        },
        "$defs": {"Loc": {"type": "object", "properties": {"up": {"$ref": "#/$defs/Loc"}}}},
        "$schema": "http://json-schema.org/draft-07/schema#",
        "$id": "urn:tool",
    }
    out = grammar_schema.hoisted(schema, "/$defs/tool0")
    props = out["properties"]
    assert props["loc"] == {"$ref": "#/$defs/tool0/$defs/Loc"}
    assert props["self"] == {"$ref": "#/$defs/tool0"}
    assert props["far"] == {"$ref": "https://example.com/s.json"}  # not local: as written
    assert props["data"] == schema["properties"]["data"]
    assert props["$ref"] == {"type": "string"}
    assert out["$defs"]["Loc"]["properties"]["up"] == {"$ref": "#/$defs/tool0/$defs/Loc"}
    assert "$schema" not in out and "$id" not in out
    assert schema["properties"]["loc"] == {"$ref": "#/$defs/Loc"}  # the client's copy kept


# ------------------------------------------------------------------ cycles
def test_a_loop_of_references_alone_is_refused_by_name_where_a_call_is_forced():
    assert grammar_schema.reference_loop(LOOP) in ("#/$defs/A", "#/$defs/B")
    assert grammar_schema.reference_loop({"$ref": "#"}) == "#"
    for name, (schema, _) in PYDANTIC.items():  # recursion through items is no loop
        assert grammar_schema.reference_loop(schema) is None, name
    tools = [function_tool("loop", LOOP)]
    with pytest.raises(SchemaError, match="refers only to itself") as err:
        check_tools(tools, "required", None)
    assert err.value.param == "tools[0].function.parameters"
    check_tools(tools, "auto", None)  # the model only reads it


SELF_ALL_OF = {"allOf": [{"$ref": "#"}], "type": "object"}


@pytest.mark.parametrize("schema", [LOOP, MISSING, SELF_ALL_OF], ids=str)
def test_under_auto_a_schema_the_grammar_cant_compile_is_any_object(llg, hf_tokenizer, schema):
    """Never a refusal under ``auto`` (docs/api.md): the call is held to any JSON object,
    and the grammar is built at once (no cycle is followed)."""
    started = time.perf_counter()
    assert generic_tools.lenient_schema(schema) == generic_tools.ANY_OBJECT
    grammar = generic_tools.grammar_for(
        forced([function_tool("odd", schema)], "auto"), generic_tools.MARKUP
    )
    assert accepts(llg, hf_tokenizer, grammar, call("odd", {"anything": [1]}))
    assert time.perf_counter() - started < 5
    with pytest.raises(SchemaError):
        check_schema(schema, "x")  # enforced (a json_schema output, a forced call): refused


# ------------------------------------------------------------------ extra properties
def test_extra_properties_are_off_where_the_schema_does_not_say(llg, hf_tokenizer):
    """Missing ``additionalProperties`` is false for the grammar (as llama.cpp's); true or a
    schema is kept as written; an object without properties stays any object."""
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 6},
            "tags": {"type": "object", "properties": {"a": {"type": "integer"}}},
            "free": {"type": "object"},
            "open": {"type": "object", "properties": {}, "additionalProperties": True},
            "typed": {"type": "object", "additionalProperties": {"type": "integer"}},
        },
        "required": ["city"],
    }
    request = forced([function_tool("f", schema)], "function", "f")
    grammar = constrain.grammar_for(request, HERMES)
    good = {
        "city": "Oslo",
        "tags": {"a": 1},
        "free": {"x": [1]},
        "open": {"y": "z"},
        "typed": {"n": 2},
    }
    assert accepts(llg, hf_tokenizer, grammar, call("f", good))
    for bad in (
        {"city": "Oslo", "type": "string"},  # the padding issue 43 saw
        {"city": "Oslo", "tags": {"a": 1, "b": 2}},
        {"city": "Oslo", "typed": {"n": "two"}},
    ):
        assert not accepts(llg, hf_tokenizer, grammar, call("f", bad)), bad
    assert "additionalProperties" not in schema  # the client's schema as it came


def test_a_json_schema_output_has_extra_properties_off_unless_it_says(llg, hf_tokenizer):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    grammar = constrain.grammar_for(forced([], "auto", json_schema=schema), None)
    assert accepts(llg, hf_tokenizer, grammar, '{"ok":true}')
    assert not accepts(llg, hf_tokenizer, grammar, '{"ok":true,"why":"x"}')
    opened = {**schema, "additionalProperties": True}
    grammar = constrain.grammar_for(forced([], "auto", json_schema=opened), None)
    assert accepts(llg, hf_tokenizer, grammar, '{"ok":true,"why":"x"}')
    any_object = constrain.grammar_for(forced([], "auto", json_schema={"type": "object"}), None)
    assert accepts(llg, hf_tokenizer, any_object, '{"why":"x"}')


def test_objects_combined_by_all_of_stay_open():
    """Each part of an ``allOf`` lists only some of the keys: closing one would refuse the
    others' keys (directly, or through a ``$ref``)."""
    schema = {
        "allOf": [
            {"properties": {"a": {"type": "string"}}},
            {"$ref": "#/$defs/B"},
        ],
        "$defs": {"B": {"properties": {"b": {"type": "string"}}}},
        "properties": {"c": {"type": "object", "properties": {"d": {"type": "string"}}}},
    }
    out = grammar_schema.closed(schema)
    assert "additionalProperties" not in out["allOf"][0]
    assert "additionalProperties" not in out["$defs"]["B"]
    assert "additionalProperties" not in out  # it has allOf beside its properties
    assert out["properties"]["c"]["additionalProperties"] is False


# ------------------------------------------------------------------ real MCP servers
@pytest.mark.parametrize("markup", [HERMES, generic_tools.MARKUP], ids=["hermes", "generic"])
@pytest.mark.parametrize("server", ["filesystem", "fetch"])
def test_real_mcp_tool_lists_hold_a_forced_call(llg, hf_tokenizer, markup, server):
    tools = mcp_tools(server)
    check_tools(tools, "required", None)
    grammar = generic_tools.grammar_for(forced(tools), markup)
    name, good = ("fetch", {"url": "https://a.b"}) if server == "fetch" else ("read_file", {})
    if server == "filesystem":
        good = {"path": "notes.txt", "head": 3}
    assert accepts(llg, hf_tokenizer, grammar, call(name, good))
    assert not accepts(llg, hf_tokenizer, grammar, call(name, {**good, "invented": "x"}))
    assert not accepts(llg, hf_tokenizer, grammar, call(name + "_x", good))
