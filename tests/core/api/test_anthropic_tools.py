"""Tool use through ``/v1/messages`` with the official ``anthropic`` client: a tiny generated
model with a tool-capable chat template, its calls forced by ``tool_choice`` (constrained
decoding makes them valid against the tool's schema), then a tool result sent back."""

from __future__ import annotations

import json

import anthropic
import jsonschema
import pytest

from core.api.server import ApiServer
from tests.core.engine import helpers
from tests.core.engine.helpers import anthropic_tool, start_tools_engine

MODEL = "claude-haiku-4-5"
WEATHER, TIME = anthropic_tool(helpers.WEATHER), anthropic_tool(helpers.TIME)
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module", params=["tools", "generic"])
def server(long_tiny_model, tmp_path_factory, request):
    """The tool-capable template, or the model's own, which takes none (issue 30.2)."""
    engine = start_tools_engine(
        tmp_path_factory.mktemp("tools") / "data", long_tiny_model, request.param
    )
    with ApiServer(engine, "127.0.0.1", 0) as api:
        yield api
    engine.shutdown()


@pytest.fixture
def client(server):
    with anthropic.Anthropic(
        base_url=server.address, api_key="unused", max_retries=0, timeout=60
    ) as c:
        yield c


def call_tool(client, **kw):
    kw.setdefault("tools", [WEATHER, TIME])
    kw.setdefault("max_tokens", 120)
    return client.messages.create(
        model=MODEL, messages=kw.pop("messages", ASK), extra_body=GREEDY, **kw
    )


@pytest.mark.parametrize(
    "choice, names",
    [
        ({"type": "any"}, {"get_weather", "get_time"}),
        ({"type": "tool", "name": "get_time"}, {"get_time"}),
    ],
)
def test_a_forced_call_is_a_valid_tool_use_block(client, choice, names):
    message = call_tool(client, tool_choice=choice)
    assert message.stop_reason == "tool_use"
    uses = [block for block in message.content if block.type == "tool_use"]
    assert len(uses) >= 1 and uses[0].name in names and uses[0].id
    schema = {"get_weather": WEATHER, "get_time": TIME}[uses[0].name]["input_schema"]
    jsonschema.validate(uses[0].input, schema)


def test_a_streamed_call_and_its_events(client):
    with client.messages.stream(
        model=MODEL,
        max_tokens=120,
        messages=ASK,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
        extra_body=GREEDY,
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    starts = [e for e in events if e.type == "content_block_start"]
    assert (
        starts[-1].content_block.type == "tool_use"
        and starts[-1].content_block.name == "get_weather"
    )
    deltas = [
        e.delta
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    ]
    assert deltas and json.loads("".join(d.partial_json for d in deltas)) == final.content[-1].input
    assert final.stop_reason == "tool_use"
    jsonschema.validate(final.content[-1].input, WEATHER["input_schema"])
    unstreamed = call_tool(
        client, tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"}
    )
    assert unstreamed.content[-1].input == final.content[-1].input  # greedy: the same call


def test_a_tool_round_trip(client):
    first = call_tool(client, tool_choice={"type": "tool", "name": "get_weather"})
    use = first.content[-1]
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": [block.model_dump(exclude_none=True) for block in first.content],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": use.id, "content": "18 C, sunny"},
                {"type": "text", "text": "Say it in words."},
            ],
        },
    ]
    answer = call_tool(client, messages=history, max_tokens=8)
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert (
        answer.usage.cache_read_input_tokens
        >= first.usage.input_tokens + first.usage.cache_read_input_tokens - 1
    )
    counted = client.messages.count_tokens(
        model=MODEL, messages=history, tools=[WEATHER, TIME]
    ).input_tokens
    assert counted == answer.usage.input_tokens + answer.usage.cache_read_input_tokens
    without = client.messages.count_tokens(model=MODEL, messages=ASK).input_tokens
    assert (
        client.messages.count_tokens(model=MODEL, messages=ASK, tools=[WEATHER]).input_tokens
        > without
    )


@pytest.mark.parametrize(
    "change, where",
    [
        ({"tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice.name"),
        ({"tool_choice": {"type": "any"}, "tools": []}, "tool_choice"),
        (
            {
                "tools": [
                    {
                        **WEATHER,
                        "input_schema": {
                            "type": "object",
                            "properties": {"x": {"type": "nonsense"}},
                        },
                    }
                ]
            },
            "tools[0].input_schema",
        ),
        ({"tools": [{**WEATHER, "name": "has space"}]}, "tools[0].name"),
        (
            {
                "messages": [
                    *ASK,
                    {
                        "role": "assistant",
                        "content": [
                            {
                                "type": "tool_use",
                                "id": "t1",
                                "name": "get_time",
                                "input": {"zone": "UTC"},
                            }
                        ],
                    },
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": "t2", "content": "12:00"}
                        ],
                    },
                ]
            },
            "messages[2].content[0].tool_use_id",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_use", "id": "t1", "name": "get_time", "input": {}}
                        ],
                    }
                ]
            },
            "messages[0].content[0]",
        ),
    ],
)
def test_bad_tool_requests_are_400s_naming_the_field(client, change, where):
    with pytest.raises(anthropic.BadRequestError) as caught:
        call_tool(client, **change)
    message = caught.value.body["error"]["message"]
    assert message.startswith(where) or f"'{where}'" in message, message


@pytest.mark.faults
def test_an_input_schema_nested_100_levels_is_a_400(client):
    """Issue 26.5: was a 500 (RecursionError in jsonschema) with a traceback in the log."""
    schema: dict = {"type": "string"}
    for _ in range(100):
        schema = {"type": "object", "properties": {"a": schema}}
    with pytest.raises(anthropic.BadRequestError) as caught:
        call_tool(client, tools=[{**WEATHER, "input_schema": schema}])
    message = caught.value.body["error"]["message"]
    assert message.startswith("tools[0].input_schema") and "nested too deeply" in message
