"""``/v1/responses`` through the official ``openai`` package against a live server on a
tiny model: streaming and not (every event valid in the package's own types, in the
documented order), a tool round trip, JSON schema output, ``previous_response_id`` across
a restart (the continuation read from the disk cache), GET/DELETE, errors, and API keys."""

from __future__ import annotations

import http.client
import json

import jsonschema
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from core.api.server import ApiServer
from core.engine import namespaces
from core.engine.config import EngineConfig
from core.engine.engine import Engine
from tests.core.engine.helpers import WEATHER, start_tools_engine

EVENT = TypeAdapter(ResponseStreamEvent)
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "color": {"enum": ["red", "blue"]}},
    "required": ["ok", "color"],
    "additionalProperties": False,
}
JSON_TEXT = {"format": {"type": "json_schema", "name": "answer", "schema": SCHEMA}}
FUNCTION = {"type": "function", **WEATHER["function"]}
KEYS = ("alice-0123456789abcdef", "bob-fedcba9876543210")


@pytest.fixture(scope="module")
def server(tiny_engine):
    with ApiServer(tiny_engine, "127.0.0.1", 0) as api:
        yield api


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(
        base_url=server.address + "/v1", api_key="unused", max_retries=0, timeout=60
    ) as client:
        yield client


def stream_events(address: str, body: dict, key: str = "unused") -> list[dict]:
    """The raw events of a streamed response, each checked against the package's types."""
    host, port = address.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        connection.request(
            "POST",
            "/v1/responses",
            json.dumps({**body, "stream": True}),
            {"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
        )
        reply = connection.getresponse()
        assert reply.status == 200, reply.read()
        events, kind = [], None
        for raw in reply:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                kind = line.removeprefix("event: ")
            elif line.startswith("data: "):
                event = json.loads(line.removeprefix("data: "))
                assert event["type"] == kind
                EVENT.validate_python(event)
                events.append(event)
    finally:
        connection.close()
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def test_a_reply_is_a_valid_response_with_usage(client):
    first = client.responses.create(
        model="default", input="Hello there", instructions="Be kind.", max_output_tokens=6
    )
    Response.model_validate(first.model_dump())
    assert first.status == "incomplete" and first.incomplete_details.reason == "max_output_tokens"
    assert first.output[0].type == "message" and first.output_text
    assert first.usage.output_tokens == 6 and first.instructions == "Be kind."
    assert first.usage.total_tokens == first.usage.input_tokens + 6
    again = client.responses.create(
        model="default", input="Hello there", instructions="Be kind.", max_output_tokens=6
    )
    # the same prompt again: all of it but its last token from the cache
    assert again.usage.input_tokens_details.cached_tokens == first.usage.input_tokens - 1


def test_a_stream_is_the_documented_event_sequence(server, client):
    body = {"model": "default", "input": "Name a color.", "temperature": 0, "text": JSON_TEXT}
    events = stream_events(server.address, {**body, "max_output_tokens": 60})
    kinds = [e["type"] for e in events]
    deltas = kinds.count("response.output_text.delta")
    assert deltas >= 1
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    done = events[-1]["response"]
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    jsonschema.validate(json.loads(text), SCHEMA)
    assert done["output"][0]["content"][0]["text"] == text and done["status"] == "completed"
    # the package's own stream helper reads the same events to the same response
    with client.responses.stream(**body, max_output_tokens=60) as stream:
        final = stream.get_final_response()
    assert final.output_text == text and final.usage.input_tokens_details.cached_tokens > 0


@pytest.fixture(scope="module")
def tools_client(long_tiny_model, tmp_path_factory):
    engine = start_tools_engine(
        tmp_path_factory.mktemp("responses-tools") / "data", long_tiny_model
    )
    try:
        with (
            ApiServer(engine, "127.0.0.1", 0) as server,
            openai.OpenAI(
                base_url=server.address + "/v1", api_key="unused", max_retries=0, timeout=60
            ) as client,
        ):
            yield server, client
    finally:
        engine.shutdown()


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_round_trip(tools_client, stream):
    server, client = tools_client
    body = {
        "model": "default",
        "input": "What is the weather in Paris?",
        "tools": [{"type": "web_search"}, FUNCTION],
        "tool_choice": "required",
        "temperature": 0,
        "max_output_tokens": 200,
    }
    if stream:
        events = stream_events(server.address, body)
        kinds = [e["type"] for e in events]
        assert kinds[2:] == [
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
        first = Response.model_validate(events[-1]["response"])
    else:
        first = client.responses.create(**body)
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER["function"]["parameters"])
    assert first.tools[0].type == "web_search"  # echoed as sent, though not run
    answer = client.responses.create(
        model="default",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"}],
        tools=[FUNCTION],
        temperature=0,
        max_output_tokens=8,
    )
    assert answer.previous_response_id == first.id and answer.output
    assert answer.usage.input_tokens_details.cached_tokens > first.usage.input_tokens // 2


def continue_after_restart(model, data, body: dict) -> tuple:
    """A stored response on one server, its continuation on a new engine and server on the
    same data folder."""
    for round in (1, 2):
        engine = Engine(data, str(model), config=EngineConfig(pool_tokens=8192)).start()
        try:
            engine.wait_ready(timeout=120)
            with (
                ApiServer(engine, "127.0.0.1", 0) as server,
                openai.OpenAI(
                    base_url=server.address + "/v1", api_key="unused", max_retries=0, timeout=60
                ) as client,
            ):
                if round == 1:
                    first = client.responses.create(**body)
                else:
                    second = client.responses.create(
                        model="default",
                        previous_response_id=first.id,
                        input="And then?",
                        temperature=0,
                        max_output_tokens=4,
                    )
                    return first, second, client.responses.retrieve(first.id)
        finally:
            engine.shutdown()
    raise AssertionError("unreachable")


def test_previous_response_id_survives_a_restart_and_is_a_cache_hit(long_tiny_model, tmp_path):
    body = {
        "model": "default",
        "input": "Tell me about Lyon. " * 20,  # past the disk cache's shortest write
        "temperature": 0,
        "max_output_tokens": 4,
    }
    first, second, retrieved = continue_after_restart(long_tiny_model, tmp_path / "data", body)
    assert retrieved.model_dump() == first.model_dump()
    extra = second.usage.model_extra["radixchat"]
    # the first prompt and its reply, but for the reply's last token, read from disk
    assert extra["disk_tokens"] >= first.usage.total_tokens - 1
    assert second.usage.input_tokens_details.cached_tokens == extra["disk_tokens"]


def test_get_and_delete_a_stored_response(client):
    kept = client.responses.create(model="default", input="Keep me", max_output_tokens=2)
    assert client.responses.retrieve(kept.id).output_text == kept.output_text
    client.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(kept.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(kept.id)
    unkept = client.responses.create(
        model="default", input="Forget me", max_output_tokens=2, store=False
    )
    assert unkept.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unkept.id)
    with pytest.raises(openai.NotFoundError, match="previous_response_not_found|no stored"):
        client.responses.create(
            model="default", previous_response_id=unkept.id, input="more", max_output_tokens=2
        )


@pytest.mark.parametrize(
    "body, param",
    [
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0]",
        ),
        (
            {"input": "hi", "text": {"format": {"type": "json_schema", "name": "s"}}},
            "text.format.schema",
        ),
        (
            {"input": [{"type": "function_call_output", "call_id": "x", "output": "y"}]},
            "input[0].call_id",
        ),
    ],
)
def test_a_bad_body_is_a_400_naming_the_field(client, body, param):
    with pytest.raises(openai.BadRequestError) as error:
        client.responses.create(model="default", **body)
    assert error.value.body["param"] == param


@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_past_the_context_is_a_400_about_the_input(client, stream):
    with pytest.raises(openai.BadRequestError) as error:
        client.responses.create(
            model="default", input="Lyon " * 200, max_output_tokens=4, stream=stream
        )
    assert error.value.body["param"] == "input"
    assert error.value.body["code"] == "context_length_exceeded"


def test_a_failure_after_the_stream_started_is_response_failed(server, client):
    # a grammar the model cannot finish within the tokens given is not a failure, so the
    # failure here is the server stopping mid-stream: its events end with response.failed
    with client.responses.create(
        model="default", input="Count to a thousand.", max_output_tokens=400, stream=True
    ) as stream:
        first = next(iter(stream))
        assert first.type == "response.created"
        handles = server.state.stop_accepting()
        for handle in handles:
            handle.cancel()
        events = list(stream)
    server.state.stopping = False
    assert events[-1].type == "response.failed"
    assert events[-1].response.status == "failed"
    assert events[-1].response.error.code == "server_error"


def test_stored_responses_belong_to_their_api_key(tiny_engine):
    def client(server, key: str) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=server.address + "/v1", api_key=key, max_retries=0, timeout=60
        )

    with (
        ApiServer(tiny_engine, "127.0.0.1", 0, api_key=list(KEYS)) as server,
        client(server, KEYS[0]) as alice,
        client(server, KEYS[1]) as bob,
        client(server, "nobody") as stranger,
    ):
        raw = alice.responses.with_raw_response.create(
            model="default", input="Alice's secret", max_output_tokens=2
        )
        kept = raw.parse()
        label = namespaces.label(namespaces.for_key(KEYS[0]))
        assert raw.headers["x-radixchat-cache-namespace"] == label
        assert kept.usage.model_extra["radixchat"]["cache_namespace"] == label
        for attempt in (
            lambda: bob.responses.retrieve(kept.id),
            lambda: bob.responses.delete(kept.id),
            lambda: bob.responses.create(
                model="default", previous_response_id=kept.id, input="x", max_output_tokens=2
            ),
        ):
            with pytest.raises(openai.NotFoundError):
                attempt()
        assert alice.responses.retrieve(kept.id).id == kept.id
        with pytest.raises(openai.AuthenticationError):
            stranger.responses.retrieve(kept.id)
