"""Tool schemas as libraries and clients write them, through the ``openai`` and ``anthropic``
packages against a live server, in the three dialects (chat completions, messages,
responses), on a template with tools and on one without (the generic format):

- pydantic's ``model_json_schema()`` (``$ref`` into ``$defs``) and real MCP servers' tool
  lists: a forced call that validates (issue 42.3; on main a 400 "Pointer '/$defs/Loc'
  does not exist");
- under ``tool_choice`` auto a schema the grammar can't compile is never a 400;
- a forced call cut by ``max_tokens`` is an error carrying the call so far, streamed or
  not (issue 43.3; on main an empty reply with no call);
- extra properties off where the schema does not say (issue 43.3; on the real default
  model: ``test_openai_tools.test_a_full_tool_round_trip_on_the_default_model``).
"""

from __future__ import annotations

import json
import re

import anthropic
import jsonschema
import openai
import pytest

from core.api.server import ApiServer
from tests.core.engine.helpers import start_tools_engine
from tests.core.engine.library_schemas import PYDANTIC, function_tool, mcp_tools

ASK = "What is the weather in Paris?"
LOOP = {"$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}}, "$ref": "#/$defs/A"}
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
MISSING = {"type": "object", "properties": {"a": {"$ref": "#/$defs/Nope"}}}
# what a forced call is held to: a few of the filesystem server's tools (its whole list is
# more than the tiny model's byte-token context) and the fetch server's one
MCP = [
    t
    for t in mcp_tools("filesystem")
    if t["function"]["name"] in ("edit_file", "list_directory_with_sizes", "read_text_file")
] + mcp_tools("fetch")
DIALECTS = ["chat", "messages", "responses"]


class ResponseFailed(Exception):
    """A Responses stream that ended in ``response.failed`` (the client raises nothing)."""


@pytest.fixture(scope="module", params=["tools", "generic"])
def server(long_tiny_model, tmp_path_factory, request):
    engine = start_tools_engine(
        tmp_path_factory.mktemp("schemas") / "data", long_tiny_model, request.param
    )
    with ApiServer(engine, "127.0.0.1", 0) as api:
        yield api
    engine.shutdown()


@pytest.fixture
def clients(server):
    with (
        openai.OpenAI(base_url=server.address + "/v1", api_key="x", max_retries=0) as oa,
        anthropic.Anthropic(base_url=server.address, api_key="x", max_retries=0) as an,
    ):
        yield oa, an


def ask(clients, dialect: str, tools: list[dict], choice, max_tokens: int = 300, **kw):
    """One request in ``dialect`` with OpenAI-style ``tools`` and ``choice`` (``required``,
    ``auto`` or a tool's name); the calls it made as ``[(name, arguments)]``."""
    oa, an = clients
    if dialect == "chat":
        choice_ = choice if choice in ("auto", "required") else _named(choice)
        reply = oa.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": ASK}],
            tools=tools,
            tool_choice=choice_,
            max_tokens=max_tokens,
            temperature=0,
            **kw,
        )
        if kw.get("stream"):
            calls = [tc for c in reply if c.choices for tc in c.choices[0].delta.tool_calls or []]
        else:
            calls = reply.choices[0].message.tool_calls or []
        return [(c.function.name, json.loads(c.function.arguments)) for c in calls]
    if dialect == "messages":
        choice_ = {"auto": {"type": "auto"}, "required": {"type": "any"}}.get(
            choice, {"type": "tool", "name": choice}
        )
        body = dict(
            model="m",
            max_tokens=max_tokens,
            messages=[{"role": "user", "content": ASK}],
            tools=[
                {"name": t["function"]["name"], "input_schema": t["function"]["parameters"]}
                for t in tools
            ],
            tool_choice=choice_,
            extra_body={"temperature": 0},
        )
        if kw.get("stream"):
            with an.messages.stream(**body) as stream:
                message = stream.get_final_message()
        else:
            message = an.messages.create(**body)
        return [(b.name, b.input) for b in message.content if b.type == "tool_use"]
    choice_ = choice if choice in ("auto", "required") else {"type": "function", "name": choice}
    reply = oa.responses.create(
        model="m",
        input=ASK,
        tools=[{"type": "function", **t["function"]} for t in tools],
        tool_choice=choice_,
        max_output_tokens=max_tokens,
        temperature=0,
        **kw,
    )
    if kw.get("stream"):
        events = list(reply)
        failed = [e for e in events if e.type == "response.failed"]
        if failed:
            raise ResponseFailed(failed[0].response.error.message)
        reply = events[-1].response
    return [(o.name, json.loads(o.arguments)) for o in reply.output if o.type == "function_call"]


def _named(name: str) -> dict:
    return {"type": "function", "function": {"name": name}}


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("name", ["weather", "weather_draft7"])
def test_a_pydantic_schema_with_refs_holds_a_forced_call(clients, dialect, name):
    schema, model = PYDANTIC[name]
    calls = ask(clients, dialect, [function_tool(name, schema)], name, max_tokens=400)
    assert [n for n, _ in calls] == [name]
    model.model_validate(calls[0][1])  # the client's own model takes it
    jsonschema.validate(calls[0][1], schema)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_real_mcp_tools_hold_a_forced_call(clients, dialect):
    """The servers' own lists are served under ``required``: the call is a listed tool's,
    with its listed properties. (The tiny model writes a string without maxLength until
    max_tokens cuts it: then the error's call so far shows the same.)"""
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in MCP}
    try:
        calls = ask(clients, dialect, MCP, "required", max_tokens=400)
    except (openai.APIError, anthropic.APIError) as exc:
        so_far = re.search(r'The call so far: \{"name":"(\w+)","arguments":\{"(\w+)"', str(exc))
        assert so_far is not None, str(exc)
        assert so_far[2] in schemas[so_far[1]]["properties"]
    else:
        assert len(calls) == 1
        name, arguments = calls[0]
        jsonschema.validate(arguments, {**schemas[name], "additionalProperties": False})


@pytest.mark.parametrize("dialect", DIALECTS)
def test_under_auto_no_schema_is_refused_for_the_grammar(clients, dialect):
    """pydantic's ``$defs``, a reference loop and a dangling ``$ref``: under ``auto`` the
    request is served (a call, if one comes, held to any object where the schema can't
    compile), never a 400."""
    tools = [
        function_tool("weather", PYDANTIC["weather"][0]),
        function_tool("loop", LOOP),
        function_tool("dangling", MISSING),
    ]
    calls = ask(clients, dialect, tools, "auto", max_tokens=30)
    assert all(name in ("weather", "loop", "dangling") for name, _ in calls)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_forced_call_cut_by_max_tokens_is_an_error_with_the_call_so_far(clients, dialect, stream):
    tools = [function_tool("get_weather", CITY)]
    errors = (openai.APIError, anthropic.APIError, ResponseFailed)
    with pytest.raises(errors) as caught:
        ask(clients, dialect, tools, "required", max_tokens=45, stream=stream)
    message = str(caught.value)
    assert "cut by max_tokens" in message and '{"name":"get_weather"' in message, message
