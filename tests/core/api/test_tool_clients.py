"""Forced tool calls as two popular libraries make them, on the real default model
(SmolLM2-135M) at ``max_tokens=40`` (issue 43's "done means"):

- LangChain's ``ChatOpenAI(...).bind_tools([PydanticTool], tool_choice=...)``, whole and
  streamed;
- litellm's ``completion(..., tools=[...], tool_choice="required")``, with the tool of
  litellm's own docs, whole and streamed.

Neither library writes ``"additionalProperties": false`` into the schema it sends. Before
extra properties were off where a schema does not say (core/engine/grammar_schema.py), the
model padded the call with invented keys until max_tokens cut it: no call and empty content
(litellm's tool with ``"additionalProperties": true`` written still does exactly that, and
gets the error with the call so far). Each test skips where its library is not installed.
"""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from core.api.server import ApiServer
from core.engine.config import EngineConfig
from core.engine.engine import Engine

MAX_TOKENS = 40
ASK = "What is the weather in Paris?"


class GetWeather(BaseModel):
    """Get the current weather in a given city."""

    city: str = Field(..., description="The city, e.g. Paris")


# litellm's docs' tool (docs.litellm.ai, "Function Calling"), as its users copy it
CURRENT_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_current_weather",
        "description": "Get the current weather in a given location",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {
                    "type": "string",
                    "description": "The city and state, e.g. San Francisco, CA",
                },
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["location"],
        },
    },
}


@pytest.fixture(scope="module")
def address(default_model_file, tmp_path_factory):
    """The OpenAI base URL of a server on the default model (a tiny generated model never
    picks a tool's arguments the way a chat model does)."""
    data = tmp_path_factory.mktemp("tool-clients") / "data"
    engine = Engine(
        data, str(default_model_file), config=EngineConfig(pool_tokens=8192, disk_cache=False)
    ).start()
    try:
        engine.wait_ready(timeout=300)
        with ApiServer(engine, "127.0.0.1", 0) as server:
            yield server.address + "/v1"
    finally:
        engine.shutdown()


def transport(address: str) -> openai.OpenAI:
    """The client litellm sends through (its ``client``; the request it builds is the one it
    sends with ``api_base``), closed by the test: litellm keeps the clients it makes for
    itself, their connections open, until the interpreter exits."""
    return openai.OpenAI(base_url=address, api_key="unused", max_retries=0, timeout=300)


def closed(schema: dict) -> dict:
    """``schema`` with no room for keys it does not list: what a clean call validates
    against."""
    return {**schema, "additionalProperties": False}


# LangChain and litellm warn about their own pydantic models on import (filterwarnings =
# error would fail them); the call is cached after the first of each test's cases
@pytest.mark.real_model
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(("tool_choice", "stream"), [("GetWeather", False), ("any", True)])
def test_langchain_bind_tools_gives_a_clean_call(address, tool_choice, stream):
    langchain_openai = pytest.importorskip("langchain_openai")
    from langchain_core.utils.function_calling import convert_to_openai_tool

    with httpx.Client(timeout=300) as http:  # closed here, not left to the collector
        llm = langchain_openai.ChatOpenAI(
            model="default",
            base_url=address,
            api_key="unused",
            max_tokens=MAX_TOKENS,
            temperature=0,
            max_retries=0,
            stream_usage=True,
            http_client=http,
        )
        bound = llm.bind_tools([GetWeather], tool_choice=tool_choice)
        if stream:
            message = None
            for chunk in bound.stream(ASK):
                message = chunk if message is None else message + chunk
        else:
            message = bound.invoke(ASK)
    assert message.invalid_tool_calls == [] and len(message.tool_calls) == 1, message
    call = message.tool_calls[0]
    assert call["name"] == "GetWeather" and "Paris" in call["args"]["city"]
    GetWeather.model_validate(call["args"])  # the user's own model takes it
    sent = convert_to_openai_tool(GetWeather)["function"]["parameters"]
    assert "additionalProperties" not in sent  # LangChain leaves it out: the server closes it
    jsonschema.validate(call["args"], closed(sent))
    assert message.response_metadata["finish_reason"] == "tool_calls"
    assert message.usage_metadata["output_tokens"] <= MAX_TOKENS


@pytest.mark.real_model
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_litellm_tool_choice_required_gives_a_clean_call(address, litellm, stream):
    with transport(address) as client:
        reply = litellm.completion(
            model="openai/default",
            client=client,
            messages=[{"role": "user", "content": ASK}],
            tools=[CURRENT_WEATHER],
            tool_choice="required",
            max_tokens=MAX_TOKENS,
            temperature=0,
            stream=stream,
            stream_options={"include_usage": True} if stream else None,
        )
        if stream:
            reply = litellm.stream_chunk_builder(list(reply))
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0].function
    arguments = json.loads(call.arguments)
    assert call.name == "get_current_weather" and "Paris" in arguments["location"]
    jsonschema.validate(arguments, closed(CURRENT_WEATHER["function"]["parameters"]))
    assert reply.usage.completion_tokens <= MAX_TOKENS


@pytest.mark.real_model
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_litellm_sees_the_call_so_far_where_a_schema_asks_for_extra_keys(address, litellm):
    """Written ``"additionalProperties": true`` is honoured: the model pads the call, and
    max_tokens cuts it into an error naming the call so far, never an empty reply."""
    function = CURRENT_WEATHER["function"]
    tool = {
        "type": "function",
        "function": {
            **function,
            "parameters": {**function["parameters"], "additionalProperties": True},
        },
    }
    with transport(address) as client, pytest.raises(litellm.BadRequestError) as raised:
        litellm.completion(
            model="openai/default",
            client=client,
            messages=[{"role": "user", "content": ASK}],
            tools=[tool],
            tool_choice="required",
            max_tokens=MAX_TOKENS,
            temperature=0,
        )
    message = str(raised.value)
    assert "cut by max_tokens (40 tokens)" in message
    assert '{"name":"get_current_weather","arguments":{"location":' in message
