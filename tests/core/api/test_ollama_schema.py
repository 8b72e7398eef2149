"""Ollama's bodies turned into engine requests (core/api/ollama_schema.py), no server: the
options with Ollama's defaults, ``format``, tools and their results, ``think``, generate's
``system``, ``template``, ``raw`` and ``context``, the requests that only load, and the
refusals (a 400 naming the field)."""

from __future__ import annotations

import json

import pytest

from core.api.errors import ApiError
from core.api.limits import RequestLimits
from core.api.ollama_schema import (
    OllamaChatRequest,
    OllamaGenerateRequest,
    to_call,
)
from core.api.wire import ModelCard
from core.engine.template_facts import TemplateFacts

CARD = ModelCard("tiny", "f" * 64, 1024, frozenset({"tiny"}), 0)
REASONS = TemplateFacts(
    template="{{ enable_thinking }}", think_start="<think>", think_end="</think>"
)
ASK = [{"role": "user", "content": "hi"}]


def chat(facts: TemplateFacts | None = None, header: str | None = None, **body):
    body = {"model": "m", "messages": ASK, **body}
    return to_call(OllamaChatRequest.model_validate(body), CARD, facts, tool_choice_header=header)


def generate(**body):
    return to_call(OllamaGenerateRequest.model_validate({"model": "m", **body}), CARD, None)


def refused(make, **body) -> ApiError:
    with pytest.raises(ApiError) as raised:
        make(**body)
    assert raised.value.status == 400
    return raised.value


def test_unset_options_sample_as_ollama_does():
    sampling = chat().request.sampling
    assert (sampling.temperature, sampling.top_k, sampling.top_p) == (0.8, 40, 0.9)
    assert sampling.repetition_penalty == 1.0 and sampling.min_p == 0.0 and sampling.seed is None
    assert sampling.max_tokens == RequestLimits().default_reply_tokens(CARD.context_length)


def test_options_are_mapped():
    options = {
        "temperature": 0,
        "top_p": 0.5,
        "top_k": 7,
        "min_p": 0.1,
        "repeat_penalty": 1.3,
        "seed": 42,
        "num_predict": 33,
        "stop": ["\n\n", "User:"],
        "num_gpu": 99,  # llama.cpp's knobs are accepted
        "mirostat": 2,
        "num_thread": 8,
    }
    s = chat(options=options).request.sampling
    assert (s.temperature, s.top_p, s.top_k, s.min_p) == (0.0, 0.5, 7, 0.1)
    assert (s.repetition_penalty, s.seed, s.max_tokens) == (1.3, 42, 33)
    assert s.stop == ("\n\n", "User:")
    assert chat(options={"stop": "END"}).request.sampling.stop == ("END",)  # Continue's string


@pytest.mark.parametrize(
    ("options", "limit"),
    [
        ({"num_predict": -1}, RequestLimits().default_reply_tokens(1024)),
        ({"num_predict": -2}, 1024),  # to the end of the context
        ({"num_predict": 5000}, 1024),  # a ceiling, as Ollama's
        ({"num_predict": 100, "num_ctx": 64}, 64),  # the reply stays within num_ctx
        ({"num_ctx": 100000}, RequestLimits().default_reply_tokens(1024)),
    ],
)
def test_the_reply_limit(options, limit):
    assert chat(options=options).request.sampling.max_tokens == limit


def test_a_negative_seed_is_a_random_one():
    assert chat(options={"seed": -1}).request.sampling.seed is None


@pytest.mark.parametrize(
    ("options", "param"),
    [
        ({"temperature": -0.5}, "options.temperature"),
        ({"top_p": 0}, "options.top_p"),
        ({"num_predict": 0}, "options.num_predict"),
        ({"num_predict": -3}, "options.num_predict"),
        ({"stop": ["x"] * 17}, "options.stop"),
        ({"temperature": "hot"}, "options.temperature"),
    ],
)
def test_bad_options_are_refused_naming_the_field(options, param):
    from pydantic import ValidationError

    from core.api.errors import validation_error

    try:
        error = refused(chat, options=options)
    except ValidationError as exc:  # pydantic's: FastAPI answers it as this 400
        error = validation_error(list(exc.errors()))
    assert error.param == param


def test_format_json_or_a_schema():
    assert chat(format="json").request.json_schema == {"type": "object"}
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert chat(format=schema).request.json_schema == schema
    assert chat(format="").request.json_schema is None
    assert refused(chat, format={"type": "nonsense"}).param.startswith("format")


def test_tools_calls_and_results():
    tool = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
    messages = [
        *ASK,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"function": {"name": "get_time", "arguments": {"zone": "UTC"}}},
                {"function": {"name": "get_date", "arguments": {}}},
            ],
        },
        {"role": "tool", "content": "today", "tool_name": "get_date"},
        {"role": "tool", "content": "12:00"},  # no name: the oldest call unanswered
    ]
    request = chat(messages=messages, tools=[tool]).request
    assert request.tools == (tool,) and request.tool_choice == "auto"
    assistant, date, time = request.messages[1:]
    assert [(c.id, c.name, json.loads(c.arguments)) for c in assistant.tool_calls] == [
        ("call_1_0", "get_time", {"zone": "UTC"}),  # ids from the call's place: the same
        ("call_1_1", "get_date", {}),  # every time the conversation is sent
    ]
    assert (date.tool_call_id, date.name, date.content) == ("call_1_1", "get_date", "today")
    assert (time.tool_call_id, time.name) == ("call_1_0", "get_time")
    # Open WebUI's shape: ids on the calls, a tool message naming its call
    webui = [
        *ASK,
        {
            "role": "assistant",
            "tool_calls": [
                {"index": 0, "id": "c9", "function": {"name": "get_time", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "content": "ok", "tool_call_id": "c9"},
    ]
    first, answer = chat(messages=webui, tools=[tool]).request.messages[1:]
    assert first.tool_calls[0].id == "c9" and first.content == ""
    assert (answer.tool_call_id, answer.name) == ("c9", "get_time")


def test_tool_choice_from_the_body_or_the_header():
    tool = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
    assert chat(tools=[tool], tool_choice="required").request.tool_choice == "required"
    named = chat(tools=[tool], header="get_time").request
    assert (named.tool_choice, named.tool_name) == ("function", "get_time")
    assert chat(header="required").request.tool_choice == "auto"  # no tools: the header waits
    assert refused(chat, tools=[tool], header="nope").param == "tool_choice"


def test_think_switches_a_reasoning_models_template_and_is_refused_on_others():
    assert chat(REASONS).request.template_kwargs == {}  # the template's default
    on = chat(REASONS, think=True)
    assert on.request.template_kwargs == {"enable_thinking": True} and on.thinking
    off = chat(REASONS, think=False)
    assert off.request.template_kwargs == {"enable_thinking": False} and not off.thinking
    high = chat(REASONS, think="high").request.template_kwargs  # gpt-oss's levels
    assert high == {"enable_thinking": True, "reasoning_effort": "high"}
    assert chat(think=False).request.template_kwargs == {"enable_thinking": False}
    assert "does not support thinking" in refused(chat, think=True).message
    assert refused(chat, think="low").param == "think"


def test_an_earlier_replys_thinking_goes_to_the_template():
    messages = [*ASK, {"role": "assistant", "content": "Hi", "thinking": "greet"}, *ASK]
    assert chat(REASONS, messages=messages).request.messages[1].reasoning == "greet"


def test_images_are_refused():
    messages = [{"role": "user", "content": "what is this?", "images": ["aGk="]}]
    assert refused(chat, messages=messages).param == "messages[0].images"
    assert refused(generate, prompt="x", images=["aGk="]).param == "images"


def test_generate_prompt_system_template_raw_and_context():
    plain = generate(prompt="hello", system="be brief")
    assert [(m.role, m.content) for m in plain.request.messages] == [
        ("system", "be brief"),
        ("user", "hello"),
    ]
    assert plain.context and not plain.chat
    raw = generate(prompt="[INST] hi [/INST]", raw=True, system="ignored")
    assert raw.request.prompt_text == "[INST] hi [/INST]" and not raw.context
    templated = generate(prompt="hi", system="sys", template="{{ .System }}|{{ .Prompt }}")
    assert templated.request.prompt_text == "sys|hi"
    assert generate(prompt="more", context=[1, 2, 3]).request.context_tokens == (1, 2, 3)
    assert refused(generate, prompt="x", suffix="y").param == "suffix"
    assert refused(generate, prompt="x", template="{{ .Messages }}").param == "template"


def test_an_empty_request_only_loads():
    assert chat(messages=[]).loading == "load" and chat(messages=[]).request is None
    for keep_alive in (0, "0", "0s"):
        assert generate(prompt="", keep_alive=keep_alive).loading == "unload"
    assert generate(prompt="", keep_alive="5m").loading == "load"
    assert generate(prompt="", context=[5]).request is not None  # a context is a prompt


def test_stream_is_the_default_and_the_model_is_required():
    assert chat().stream and not chat(stream=False).stream
    assert "model is required" in refused(chat, model="").message
