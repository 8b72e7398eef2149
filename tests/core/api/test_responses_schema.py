"""The Responses API's bodies to engine requests, without a server: what each input item
and tool kind becomes, what is dropped, what is refused (a 400 naming the body's field)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from core.api.errors import ApiError, validation_error
from core.api.responses_schema import ResponsesRequest, to_call
from core.api.wire import ModelCard
from core.engine.types import ChatMessage, ToolCall

CARD = ModelCard("tiny", "f" * 64, 4096, frozenset({"tiny", "default"}), 0)
PARAMS = {
    "type": "object",
    "properties": {"cmd": {"type": "string"}},
    "required": ["cmd"],
    "additionalProperties": False,
}
SHELL = {"type": "function", "name": "shell", "description": "Run a command", "parameters": PARAMS}


def call(body: dict, history: tuple = (), **kw):
    return to_call(ResponsesRequest.model_validate(body), CARD, history=history, **kw)


def refused(body: dict, history: tuple = ()) -> ApiError:
    try:
        call(body, history)
    except ValidationError as exc:
        return validation_error(list(exc.errors()))
    except ApiError as exc:
        return exc
    raise AssertionError("the body was taken")


def test_a_string_input_is_one_user_turn_after_the_instructions():
    request = call({"model": "default", "input": "Hi", "instructions": "Be brief."}).request
    assert request.messages == (ChatMessage("system", "Be brief."), ChatMessage("user", "Hi"))
    assert request.sampling.temperature == 1.0 and request.sampling.max_tokens == 4096


def test_leading_developer_messages_join_the_instructions_and_user_turns_in_a_row_join():
    # Codex's shape: two developer messages, then two user messages in a row
    body = {
        "instructions": "Base.",
        "input": [
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "A"}],
            },
            {"role": "developer", "content": "B"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "env"}]},
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "task"}],
            },
        ],
    }
    assert call(body).request.messages == (
        ChatMessage("system", "Base.\n\nA\n\nB"),
        ChatMessage("user", "env\n\ntask"),
    )


def test_calls_and_their_outputs_become_an_assistant_turn_and_tool_turns():
    body = {
        "input": [
            {"role": "user", "content": "List files"},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Sure."}],
            },
            {
                "type": "function_call",
                "call_id": "c1",
                "name": "shell",
                "arguments": '{"cmd": "ls"}',
            },
            {"type": "custom_tool_call", "call_id": "c2", "name": "exec", "input": "text('x')"},
            {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
            {
                "type": "custom_tool_call_output",
                "call_id": "c2",
                "output": [{"type": "input_text", "text": "x"}],
            },
        ],
        "tools": [SHELL, {"type": "custom", "name": "exec", "format": {"type": "text"}}],
    }
    messages = call(body).request.messages
    assert messages == (
        ChatMessage("user", "List files"),
        ChatMessage(
            "assistant",
            "Sure.",
            (
                ToolCall("c1", "shell", '{"cmd": "ls"}'),
                ToolCall("c2", "exec", json.dumps({"input": "text('x')"})),
            ),
        ),
        ChatMessage("tool", "a.txt", tool_call_id="c1", name="shell"),
        ChatMessage("tool", "x", tool_call_id="c2", name="exec"),
    )


def test_function_custom_and_namespaced_tools_are_served_and_hosted_kinds_dropped():
    body = {
        "input": "hi",
        "tools": [
            {"type": "web_search", "external_web_access": False},
            SHELL,
            {"type": "local_shell"},
            {"type": "custom", "name": "exec", "format": {"type": "grammar", "syntax": "lark"}},
            {
                "type": "namespace",
                "name": "agents",
                "description": "Sub-agents",
                "tools": [{"type": "function", "name": "spawn", "parameters": PARAMS}],
            },
        ],
    }
    made = call(body)
    names = [t["function"]["name"] for t in made.request.tools]
    assert names == ["shell", "exec", "spawn"]
    custom = made.request.tools[1]["function"]["parameters"]
    assert custom["required"] == ["input"] and custom["properties"]["input"]["type"] == "string"
    assert made.tools.custom == {"exec"} and made.tools.namespaces == {"spawn": "agents"}


def test_a_tool_choice_names_a_served_tool_and_allowed_tools_narrow_the_list():
    body = {"input": "hi", "tools": [SHELL, {**SHELL, "name": "other"}]}
    named = call({**body, "tool_choice": {"type": "function", "name": "other"}}).request
    assert (named.tool_choice, named.tool_name) == ("function", "other")
    allowed = call(
        {
            **body,
            "tool_choice": {
                "type": "allowed_tools",
                "mode": "required",
                "tools": [{"type": "function", "name": "shell"}],
            },
        }
    ).request
    assert allowed.tool_choice == "required"
    assert [t["function"]["name"] for t in allowed.tools] == ["shell"]


def test_text_format_json_schema_goes_through_the_grammar_path():
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    body = {
        "input": "hi",
        "text": {"format": {"type": "json_schema", "name": "s", "schema": schema}},
    }
    assert call(body).request.json_schema == schema
    assert call({"input": "hi", "text": {"format": {"type": "json_object"}}}).request.json_schema
    assert call({"input": "hi", "text": {"format": {"type": "text"}}}).request.json_schema is None


def test_sampling_priority_salt_and_session_are_the_other_dialects():
    body = {
        "input": "hi",
        "temperature": 0,
        "top_p": 0.5,
        "max_output_tokens": 7,
        "priority": 3,
        "cache_salt": "s",
        "session": "work",
    }
    request = call(body, namespace="api").request
    assert (request.sampling.temperature, request.sampling.top_p) == (0, 0.5)
    assert request.sampling.max_tokens == 7 and request.priority == 3
    assert request.session == "work" and request.cache_namespace.startswith("api+salt-")
    header = call({"input": "hi"}, priority_header="9").request
    assert header.priority == 9


def test_a_continuation_is_the_stored_conversation_then_the_new_input():
    history = (
        {"type": "message", "role": "user", "content": "Q1"},
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "A1", "annotations": []}],
        },
    )
    made = call({"input": "Q2", "instructions": "Sys."}, history)
    assert made.request.messages == (
        ChatMessage("system", "Sys."),
        ChatMessage("user", "Q1"),
        ChatMessage("assistant", "A1"),
        ChatMessage("user", "Q2"),
    )
    assert made.input == ({"type": "message", "role": "user", "content": "Q2"},)


@pytest.mark.parametrize(
    "body, param",
    [
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0]",
        ),
        ({"input": [{"type": "file_search_call", "id": "x"}]}, "input[0]"),
        (
            {"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]},
            "input[0].call_id",
        ),
        ({"input": "hi", "background": True}, "background"),
        ({"input": "hi", "tool_choice": {"type": "web_search"}}, "tool_choice.type"),
        (
            {"input": "hi", "tools": [SHELL], "tool_choice": {"type": "function", "name": "x"}},
            "tool_choice.name",
        ),
        (
            {"input": "hi", "text": {"format": {"type": "json_schema", "name": "s"}}},
            "text.format.schema",
        ),
        ({"input": "hi", "max_output_tokens": 5000}, "max_output_tokens"),
        ({"input": []}, "input"),
        (
            {
                "input": "hi",
                "tool_choice": "required",
                "tools": [{"type": "web_search"}, {**SHELL, "parameters": {"type": "nonsense"}}],
            },
            "tools[1].parameters",
        ),
    ],
)
def test_what_cannot_be_served_is_a_400_naming_the_field(body, param):
    error = refused(body)
    assert error.status == 400 and error.param == param, error.message


def test_any_model_name_is_the_loaded_model():
    assert call({"input": "hi", "model": "gpt-9"}).request.messages  # issue 30.3: no 404
