"""Constrained decoding on a tiny generated model: schema checks, masks, JSON output that
validates, forced tool calls, and batched rows with and without constraints."""

from __future__ import annotations

import json

import jsonschema
import mlx.core as mx
import pytest

from core.engine.config import EngineConfig
from core.engine.constrain import (
    Grammars,
    SchemaError,
    check_schema,
    check_tools,
    grammar_for,
    tool_name,
)
from core.engine.engine import Engine
from core.engine.types import (
    ChatMessage,
    DoneEvent,
    ErrorEvent,
    GenerationRequest,
    SamplingParams,
    TokenEvent,
    ToolCallEvent,
)
from core.errors import ErrorKind
from tests.core.engine.helpers import TIME, WEATHER, last_done, start_tools_engine

GREEDY = SamplingParams(temperature=0.0, max_tokens=120)
SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "color": {"enum": ["red", "green", "blue"]},
        "name": {"type": "string", "maxLength": 6},
    },
    "required": ["ok", "color", "name"],
    "additionalProperties": False,
}
TOOLS = (WEATHER, TIME)


@pytest.fixture(scope="module")
def engine(long_tiny_model, tmp_path_factory):
    eng = start_tools_engine(tmp_path_factory.mktemp("data"), long_tiny_model)
    yield eng
    eng.shutdown()


def ask(text: str, **kw) -> GenerationRequest:
    return GenerationRequest(
        messages=(ChatMessage("user", text),), sampling=kw.pop("sampling", GREEDY), **kw
    )


# ------------------------------------------------------------------ checks
def test_bad_schemas_name_their_field():
    with pytest.raises(SchemaError, match="not a valid JSON Schema") as err:
        check_schema({"type": "strin"}, "response_format.json_schema.schema")
    assert err.value.param == "response_format.json_schema.schema"
    with pytest.raises(SchemaError, match="unsupported schema feature.*look-around"):
        check_schema({"type": "string", "pattern": "(?=a)b"}, "x")
    check_schema(SCHEMA, "x")  # fine


def test_bad_tools_name_their_field():
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": 3}}}
    with pytest.raises(SchemaError) as err:
        check_tools((WEATHER, bad), "auto", None)
    assert err.value.param == "tools[1].function.parameters"
    with pytest.raises(SchemaError, match="not among the tools") as err:
        check_tools(TOOLS, "function", "get_wether")
    assert err.value.param == "tool_choice"
    check_tools(TOOLS, "function", "get_time")


def test_a_schema_the_grammar_cant_enforce_is_refused_only_where_it_constrains():
    lookaround = {
        "type": "function",
        "function": {
            "name": "grep",
            "parameters": {
                "type": "object",
                "properties": {"pattern": {"type": "string", "pattern": "(?=a)b"}},
            },
        },
    }
    check_tools((WEATHER, lookaround), "auto", None)  # the model only reads it
    check_tools((WEATHER, lookaround), "function", tool_name(WEATHER))  # only WEATHER constrains
    for choice, name in (("required", None), ("function", "grep")):
        with pytest.raises(SchemaError, match="unsupported schema feature") as err:
            check_tools((WEATHER, lookaround), choice, name)
        assert err.value.param == "tools[1].function.parameters"


def nested(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def branches(count: int) -> dict:
    """An anyOf of ``count`` one-key objects: every check up front passes; llguidance's
    parser overflows its row (2,000 items) once the output reaches ``{"``."""
    return {
        "anyOf": [
            {
                "type": "object",
                "properties": {f"k{i}": {"const": i}},
                "required": [f"k{i}"],
                "additionalProperties": False,
            }
            for i in range(count)
        ]
    }


@pytest.mark.faults
def test_a_schema_nested_100_levels_is_a_schema_error_not_a_recursion_error():
    """Issue 26.5: 100 levels raised RecursionError inside jsonschema (a 500)."""
    for check in (
        lambda s: check_schema(s, "response_format.json_schema.schema"),
        lambda s: check_tools(
            ({"type": "function", "function": {"name": "f", "parameters": s}},), "auto", None
        ),
    ):
        with pytest.raises(SchemaError, match="nested too deeply"):
            check(nested(100))
    check_schema(nested(20), "x")  # deep enough for any real tool


@pytest.mark.faults
def test_a_grammar_that_fails_at_run_time_ends_the_request_with_an_error(engine):
    """Issue 26.5: an anyOf of 2,100 branches passes the checks, then its grammar fails after
    ``{"``: the request ends with an error, never that text as a finished reply."""
    check_schema(branches(2100), "x")  # nothing up front can tell
    events = list(engine.stream(ask("json please", json_schema=branches(2100))))
    assert not [e for e in events if isinstance(e, DoneEvent)], events[-1]
    error = events[-1]
    assert isinstance(error, ErrorEvent) and error.kind is ErrorKind.BAD_REQUEST
    assert "output constraint failed" in error.message and "max is 2000" in error.message
    assert len(error.message) < 400  # one line, not the whole grammar llguidance repeats
    # fine, as before
    reply = last_done(list(engine.stream(ask("json please", json_schema=branches(50)))))
    assert reply.stats.finish_reason in ("stop", "length")


def test_mask_follows_the_grammar(engine):
    tokenizer = engine._loaded.tokenizer  # the engine thread is idle between requests
    grammars = Grammars(tokenizer, 259)
    processor = grammars.processor(grammar_for(ask("x", json_schema={"type": "boolean"}), None), 0)

    def allowed(tokens: list[int]) -> set[int]:
        out = processor(mx.array(tokens, dtype=mx.int32), mx.zeros((1, 259)))
        return {i for i, v in enumerate(out[0].tolist()) if v == 0}

    assert allowed([]) == {ord("t"), ord("f")}
    assert allowed([ord("t")]) == {ord("r")}
    assert allowed([ord(c) for c in "true"]) == set(tokenizer.eos_token_ids)  # done: only EOS


# ------------------------------------------------------------------ requests
def test_json_schema_output_parses_and_validates(engine):
    done = last_done(list(engine.stream(ask("describe it", json_schema=SCHEMA))))
    jsonschema.validate(json.loads(done.text), SCHEMA)
    assert done.stats.finish_reason == "stop" and done.stats.constraint_cpu_s > 0
    assert last_done(list(engine.stream(ask("describe it")))).stats.constraint_cpu_s == 0


@pytest.mark.parametrize("choice, name", [("required", None), ("function", "get_time")])
def test_forced_tool_calls_are_valid_and_stream_without_markup(engine, choice, name):
    events = list(
        engine.stream(ask("what time is it", tools=TOOLS, tool_choice=choice, tool_name=name))
    )
    done = last_done(events)
    text = "".join(e.text for e in events if isinstance(e, TokenEvent))
    assert "<tool_call>" not in text and text == done.text
    calls = [e.call for e in events if isinstance(e, ToolCallEvent)]
    assert calls == list(done.tool_calls) and len(calls) == 1
    assert done.stats.finish_reason == "tool_calls"
    tool = {t["function"]["name"]: t for t in TOOLS}[calls[0].name]
    jsonschema.validate(json.loads(calls[0].arguments), tool["function"]["parameters"])
    if name is not None:
        assert calls[0].name == name


def test_tool_choice_none_hides_the_tools(engine):
    plain = last_done(list(engine.stream(ask("hello"))))
    none = last_done(list(engine.stream(ask("hello", tools=TOOLS, tool_choice="none"))))
    assert none.text == plain.text and none.tool_calls == ()


def test_batched_rows_each_with_their_own_constraint_or_none(engine):
    requests = [
        ask("plain one"),
        ask("json", json_schema=SCHEMA),
        ask("call", tools=TOOLS, tool_choice="required"),
        ask("plain two"),
    ]
    solo = [last_done(list(engine.stream(r))) for r in requests]
    handles = [engine.submit(r) for r in requests]  # admitted one by one, decoded together
    together = [last_done(list(h.events(timeout=120))) for h in handles]
    assert [d.text for d in together] == [d.text for d in solo]  # greedy: same replies batched
    assert [d.tool_calls[0].arguments for d in together[2:3]] == [solo[2].tool_calls[0].arguments]
    jsonschema.validate(json.loads(together[1].text), SCHEMA)


def test_a_template_without_tools_gets_the_generic_format(long_tiny_model, tmp_path):
    """The tiny model's ChatML template takes no tools: the call comes in the generic format,
    parsed into a ToolCall, its markup never in the text (issue 30.2)."""
    eng = Engine(
        tmp_path, str(long_tiny_model), config=EngineConfig(pool_tokens=16384, disk_cache=False)
    ).start()
    try:
        eng.wait_ready(timeout=60)
        events = list(eng.stream(ask("hi", tools=TOOLS, tool_choice="required")))
        done = last_done(events)
        assert done.stats.finish_reason == "tool_calls" and len(done.tool_calls) == 1
        call = done.tool_calls[0]
        schema = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}[call.name]
        jsonschema.validate(json.loads(call.arguments), schema)
        shown = "".join(e.text for e in events if isinstance(e, TokenEvent))
        assert "<tool_call>" not in shown and "<tool_call>" not in done.text
        auto = last_done(list(eng.stream(ask("hi", tools=TOOLS))))  # text, or a valid call
        assert "<tool_call>" not in auto.text
        for made in auto.tool_calls:
            assert made.name in schema
            jsonschema.validate(json.loads(made.arguments), schema[made.name])
    finally:
        eng.shutdown()


def test_a_forced_call_starts_with_the_models_special_tool_call_token():
    # Qwen2.5's <tool_call> is one special token (151657): the grammar must name that token;
    # its text alone made llguidance refuse the token the model writes ("token [151657]
    # doesn't satisfy the grammar"), so every forced call on Qwen failed after 2 tokens
    import llguidance
    import llguidance.hf
    from mlx_lm.tokenizer_utils import TokenizerWrapper
    from transformers import PreTrainedTokenizerFast

    from core.engine.constrain import ToolMarkup, special_token_id
    from core.models.tiny_model import build_tokenizer

    hf = PreTrainedTokenizerFast(tokenizer_object=build_tokenizer())
    hf.add_special_tokens({"additional_special_tokens": ["<tool_call>", "</tool_call>"]})
    wrapped = TokenizerWrapper(hf)  # as the engine holds it
    start, end = special_token_id(wrapped, "<tool_call>"), special_token_id(wrapped, "</tool_call>")
    assert (start, end) == (len(hf) - 2, len(hf) - 1)
    assert special_token_id(wrapped, "<x>") is None and special_token_id(wrapped, "a") is None
    request = ask("x", tools=(WEATHER,), tool_choice="required")
    llg = llguidance.hf.from_tokenizer(hf, n_vocab=len(hf), eos_token=[hf.eos_token_id or 258])

    def consumed(markup: ToolMarkup) -> bool:
        matcher = llguidance.LLMatcher(llg, grammar_for(request, markup), log_level=0)
        call = '\n{"name":"get_weather","arguments":{"city":"Lyon","unit":"C"}}\n'
        tokens = [start, *hf.encode(call, add_special_tokens=False), end]
        return all(matcher.consume_token(t) for t in tokens) and matcher.is_accepting()

    named = ToolMarkup("<tool_call>", "</tool_call>", None, True, start_id=start, end_id=end)
    assert consumed(named)
    assert not consumed(ToolMarkup("<tool_call>", "</tool_call>", None, True))  # the old way
