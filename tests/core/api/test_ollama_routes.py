"""Ollama's API through the official ``ollama`` package against a live server on a tiny model
(the shipped tool-capable template): chat streamed and not, with a tool and with a JSON
schema, generate with ``context``, list, show, ps, version, ``GET``/``HEAD /``, the same
auth, web-page defences, request log and metrics as the other dialects, the Ollama port,
and Ollama-shaped refusals. Pull and delete are in test_ollama_pull.py."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import ollama
import pytest

from core.api.server import ApiServer
from core.models.load.chat_template import shipped_template
from core.models.local import folder_size
from tests.core.engine.helpers import start_tools_engine

TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a zone",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "color": {"enum": ["red", "blue"]}},
    "required": ["ok", "color"],
    "additionalProperties": False,
}
GREEDY = {"temperature": 0, "num_predict": 8}
CONTINUE_PARAMETER = r'^(\S+)\s+((?:".*")|\S+)$'  # Continue's reading of /api/show's parameters
NANOSECONDS = ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration")


@pytest.fixture(scope="module")
def engine(long_tiny_model, tmp_path_factory):
    engine = start_tools_engine(tmp_path_factory.mktemp("ollama-api") / "data", long_tiny_model)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def server(engine):
    with ApiServer(engine, "127.0.0.1", 0, ollama_port=0) as api:
        yield api


@pytest.fixture
def client(server):
    with ollama.Client(host=server.ollama_address) as client:
        yield client


def post(server, path: str, body: dict, **kw) -> httpx.Response:
    return httpx.post(server.address + path, json=body, timeout=120, **kw)


def test_root_answers_as_ollama_does_on_both_ports(server):
    for address in (server.address, server.ollama_address):
        got = httpx.get(address + "/")
        assert got.status_code == 200 and got.text == "Ollama is running"
        head = httpx.head(address + "/")
        assert head.status_code == 200 and head.content == b""
    version = httpx.get(server.ollama_address + "/api/version").json()
    assert re.fullmatch(r"\d+\.\d+\.\d+", version["version"])


def test_list_show_and_ps_describe_the_loaded_model(client, engine, long_tiny_model):
    listed = client.list().models
    assert [m.model for m in listed][:1] == ["tiny-4k:latest"]  # the loaded model first
    model = listed[0]
    # its files' bytes on disk, as Ollama lists a model (not the weights' bytes in memory:
    # the default model's 98 MB GGUF was listed at 538 MB, dequantized)
    assert model.size == folder_size(long_tiny_model) and re.fullmatch(
        r"[0-9a-f]{64}", model.digest
    )
    assert model.details.format == "safetensors" and model.details.family == "llama"
    assert model.modified_at is not None and model.details.parameter_size.endswith("K")

    shown = client.show("tiny-4k")
    assert shown.template == shipped_template("smollm2_tools.jinja")  # as it is rendered
    assert shown.capabilities == ["completion", "tools"]  # the template takes tools
    context = engine.model_info.context_length
    # read as Continue reads it: every line `key value`, strings in JSON quotes
    lines = [re.match(CONTINUE_PARAMETER, line) for line in shown.parameters.split("\n")]
    assert all(lines) and ("num_ctx", str(context)) in [m.groups() for m in lines]
    assert [json.loads(m[2]) for m in lines if m[1] == "stop"] == ["<|endoftext|>", "<|im_end|>"]
    assert shown.modelinfo["general.architecture"] == "llama"
    assert shown.modelinfo["llama.context_length"] == context
    assert shown.details.family == "llama"

    running = client.ps().models
    assert [m.name for m in running] == ["tiny-4k:latest"]
    assert running[0].context_length == context and running[0].size >= model.size
    assert running[0].expires_at is not None and running[0].digest == model.digest


def test_any_name_is_served_by_the_loaded_model(client):
    reply = client.chat(
        model="llama3.2:latest", messages=[{"role": "user", "content": "hi"}], options=GREEDY
    )
    assert reply.model == "llama3.2:latest" and reply.message.content  # named as asked
    assert client.show("llama3.2").capabilities == ["completion", "tools"]  # the loaded model


def test_chat_whole_and_streamed_with_ollama_figures(client, server):
    ask = [{"role": "system", "content": "Be brief. " * 8}, {"role": "user", "content": "hi"}]
    whole = client.chat(model="tiny", messages=ask, options=GREEDY, stream=False)
    assert whole.done and whole.done_reason == "length" and whole.eval_count == 8
    assert whole.message.role == "assistant" and whole.message.content
    assert all(isinstance(whole[key], int) and whole[key] >= 0 for key in NANOSECONDS)
    assert whole.total_duration >= whole.prompt_eval_duration > 0

    parts = list(client.chat(model="tiny", messages=ask, options=GREEDY, stream=True))
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(p.message.content for p in parts) == whole.message.content  # greedy
    last = parts[-1]
    assert last.done_reason == "length" and last.eval_count == 8
    # the same prompt again: the cache served it, so the model evaluated less of it
    assert last.prompt_eval_count < whole.prompt_eval_count
    raw = post(
        server, "/api/chat", {"model": "x", "messages": ask, "options": GREEDY, "stream": False}
    )
    figures = raw.json()["radixchat"]
    assert figures["prompt_tokens"] == figures["cached_tokens"] + raw.json()["prompt_eval_count"]
    assert figures["cached_tokens"] > 0 and raw.headers["content-type"] == "application/json"
    streamed = httpx.post(
        server.address + "/api/chat", json={"model": "x", "messages": ask, "options": GREEDY}
    )
    assert streamed.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in streamed.text.splitlines()]
    assert lines[-1]["done"] and all(not line["done"] for line in lines[:-1])


def test_chat_with_a_tool_and_its_result(client, server):
    def get_time(zone: str) -> str:
        """The time in a zone.

        Args:
          zone: UTC or CET
        """
        return "12:00"

    ask = [{"role": "user", "content": "What time is it in UTC?"}]
    # the package's own tool (a Python function): the request is taken, the reply parses
    auto = client.chat(model="tiny", messages=ask, tools=[get_time], options=GREEDY)
    assert auto.done and auto.message.role == "assistant"
    # a forced call (RadixChat's tool_choice: Ollama has none), read in the package's types
    body = {"model": "tiny", "messages": ask, "tools": [TIME_TOOL], "tool_choice": "required"}
    options = {"temperature": 0, "num_predict": 120}
    forced = ollama.ChatResponse(
        **post(server, "/api/chat", {**body, "options": options, "stream": False}).json()
    )
    (call,) = forced.message.tool_calls
    assert call.function.name == "get_time"
    jsonschema.validate(dict(call.function.arguments), TIME_TOOL["function"]["parameters"])
    assert forced.done_reason == "stop" and forced.message.content == ""
    lines = post(server, "/api/chat", {**body, "options": options}).text.splitlines()
    streamed = [ollama.ChatResponse(**json.loads(line)) for line in lines]
    calls = [c for part in streamed for c in part.message.tool_calls or ()]
    assert [c.function.name for c in calls] == ["get_time"]
    assert dict(calls[0].function.arguments) == dict(call.function.arguments)  # greedy

    # the result goes back as the package sends it (by tool name, no call id)
    history = [
        *ask,
        {"role": "assistant", "content": "", "tool_calls": [call.model_dump()]},
        {"role": "tool", "content": "12:00", "tool_name": "get_time"},
    ]
    answer = client.chat(model="tiny", messages=history, tools=[get_time], options=GREEDY)
    assert answer.done and answer.prompt_eval_count > 0
    # the package itself, its tool (a dict; the package drops additionalProperties: the
    # server's default is no extra keys) forced with the header, as a client that cannot
    # send tool_choice does
    with ollama.Client(
        host=server.ollama_address, headers={"X-RadixChat-Tool-Choice": "required"}
    ) as forcing:
        sent = forcing.chat(model="tiny", messages=ask, tools=[TIME_TOOL], options=options)
        assert [c.function.name for c in sent.message.tool_calls] == ["get_time"]
        assert dict(sent.message.tool_calls[0].function.arguments) == dict(call.function.arguments)
        parts = list(
            forcing.chat(
                model="tiny", messages=ask, tools=[TIME_TOOL], options=options, stream=True
            )
        )
        assert [c.function.name for p in parts for c in p.message.tool_calls or ()] == ["get_time"]
        plain = forcing.chat(model="tiny", messages=ask, options=GREEDY)  # no tools: no call
        assert not plain.message.tool_calls


def test_chat_with_a_json_schema_and_json_mode(client):
    ask = [{"role": "user", "content": "Answer in JSON."}]
    reply = client.chat(
        model="tiny", messages=ask, format=SCHEMA, options={"temperature": 0, "num_predict": 60}
    )
    assert reply.done_reason == "stop"
    jsonschema.validate(json.loads(reply.message.content), SCHEMA)
    mode = client.chat(
        model="tiny", messages=ask, format="json", options={"temperature": 0, "num_predict": 120}
    )
    if mode.done_reason == "stop":  # within the limit: a whole object
        assert isinstance(json.loads(mode.message.content), dict)
    assert mode.message.content.lstrip().startswith("{")


def test_generate_with_context_system_template_and_raw(client, server):
    first = client.generate(model="tiny", prompt="Once upon a time", options=GREEDY)
    assert first.done and first.response and first.context
    again = client.generate(model="tiny", prompt="and then", context=first.context, options=GREEDY)
    assert again.context[: len(first.context)] == list(first.context)  # the history, extended
    assert again.prompt_eval_count < len(again.context) - again.eval_count  # the cache served
    streamed = list(
        client.generate(model="tiny", prompt="Once upon a time", options=GREEDY, stream=True)
    )
    assert "".join(p.response for p in streamed) == first.response
    assert streamed[-1].context == first.context

    raw = client.generate(model="tiny", prompt="abc", raw=True, options=GREEDY)
    assert raw.done and raw.context is None  # raw mode returns no context, as Ollama's
    template = "{{ if .System }}[{{ .System }}]{{ end }}<{{ .Prompt }}>{{ .Response }}</s>"
    templated = generated(server, prompt="abc", system="sys", template=template)
    assert templated["radixchat"]["prompt_tokens"] == len("[sys]<abc>")  # bytes, no chat template
    # the system prompt goes into the chat template's system turn (one token a byte)
    short, long = (
        generated(server, prompt="abc", system=system)["radixchat"]["prompt_tokens"]
        for system in ("be kind", "be kind!!")
    )
    assert long - short == 2


def generated(server, **body) -> dict:
    body = {"model": "m", "options": GREEDY, "stream": False, **body}
    return post(server, "/api/generate", body).json()


def test_an_empty_request_loads_or_unloads(client):
    loaded = client.chat(model="tiny", messages=[])
    assert loaded.done and loaded.done_reason == "load" and loaded.message.content == ""
    unloaded = client.generate(model="tiny", prompt="", keep_alive=0)
    assert unloaded.done_reason == "unload" and unloaded.response == ""
    kept = client.chat(
        model="tiny", messages=[{"role": "user", "content": "hi"}], keep_alive="5m", options=GREEDY
    )
    assert kept.done


@pytest.mark.parametrize(
    ("path", "body", "said"),
    [
        ("/api/chat", {"messages": [{"role": "user", "content": "x"}]}, "model is required"),
        (
            "/api/chat",
            {"model": "m", "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]},
            "cannot read images",
        ),
        ("/api/generate", {"model": "m", "prompt": "x", "images": ["aGk="]}, "cannot read images"),
        (
            "/api/chat",
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "think": True},
            "does not support thinking",
        ),
        ("/api/generate", {"model": "m", "prompt": "x", "suffix": "y"}, "does not support insert"),
        (
            "/api/generate",
            {"model": "m", "prompt": "x", "template": "{{ range .Messages }}{{ end }}"},
            "range .Messages",
        ),
        (
            "/api/generate",
            {"model": "m", "prompt": "x", "options": {"temperature": -1}},
            "options.temperature",
        ),
        ("/api/generate", {"model": "m", "prompt": "x", "format": {"type": "nonsense"}}, "format"),
        ("/api/generate", {"model": "m", "prompt": "x", "logprobs": True}, "logprobs"),
        ("/api/generate", {"model": "m", "context": [10**9], "prompt": "x"}, "vocabulary"),
        ("/api/show", {}, "model is required"),
    ],
)
def test_refusals_are_ollama_shaped(server, path, body, said):
    got = post(server, path, {**body, "stream": False})
    assert got.status_code == 400, got.text
    assert list(got.json()) == ["error"] and said in got.json()["error"]
    with pytest.raises(ollama.ResponseError) as raised, ollama.Client(host=server.address) as c:
        c._request_raw("POST", path, json=body)  # what the package raises for it
    assert raised.value.status_code == 400 and said in raised.value.error


def test_same_keys_origins_log_and_metrics_as_the_other_dialects(engine, server):
    with ApiServer(engine, "127.0.0.1", 0, api_key=["sk-a", "sk-b"]) as keyed:
        assert httpx.get(keyed.address + "/").status_code == 200  # open, as /health
        refused = httpx.get(keyed.address + "/api/tags")
        assert refused.status_code == 401 and "API key" in refused.json()["error"]
        with ollama.Client(host=keyed.address, headers={"Authorization": "Bearer sk-b"}) as c:
            assert c.list().models
            reply = c.chat(model="m", messages=[{"role": "user", "content": "k"}], options=GREEDY)
            assert reply.done
        answered = httpx.post(
            keyed.address + "/api/chat",
            json={
                "model": "m",
                "messages": [{"role": "user", "content": "k"}],
                "options": GREEDY,
                "stream": False,
            },
            headers={"x-api-key": "sk-a"},
        )
        assert answered.headers["X-RadixChat-Cache-Namespace"].startswith("key-")
    page = httpx.get(server.address + "/api/tags", headers={"Origin": "http://evil.example"})
    assert page.status_code == 403 and "allow-origin" in page.json()["error"]
    rebound = httpx.get(server.address + "/api/tags", headers={"Host": "evil.example"})
    assert rebound.status_code == 403
    typed = httpx.post(
        server.address + "/api/chat",
        content=b'{"model": "m"}',
        headers={"Origin": "http://evil.example", "Content-Type": "text/plain"},
    )
    assert typed.status_code == 403
    logged = [e for e in server.request_log.recent() if e.dialect == "ollama"]
    assert logged and logged[-1].path.startswith("/api/")
    metrics = httpx.get(server.address + "/metrics").text
    assert 'endpoint="/api/chat"' in metrics and 'endpoint="/api/tags"' in metrics


def test_priority_and_session_headers_are_taken(server):
    body = {"model": "m", "messages": [{"role": "user", "content": "p"}], "options": GREEDY}
    got = post(server, "/api/chat", {**body, "stream": False, "priority": 3, "session": "o1"})
    assert got.status_code == 200
    bad = post(
        server, "/api/chat", {**body, "stream": False}, headers={"X-RadixChat-Priority": "-1"}
    )
    assert bad.status_code == 400 and "X-RadixChat-Priority" in bad.json()["error"]


def test_embed_and_the_older_embeddings(client, server, engine):
    texts = ["The cat sat on the mat.", "A cat was sitting on the mat.", "Stock prices fell."]
    reply = client.embed(model="nomic-embed-text", input=texts)
    assert reply.model == "nomic-embed-text" and len(reply.embeddings) == 3
    for vector in reply.embeddings:
        assert abs(sum(x * x for x in vector) - 1) < 1e-4  # unit length, as Ollama's
    assert reply.prompt_eval_count > 0 and reply.total_duration > 0
    one = client.embed(model="m", input=texts[0])
    assert one.embeddings[0] == pytest.approx(reply.embeddings[0], abs=1e-5)
    short = client.embed(model="m", input=texts[0], dimensions=8).embeddings[0]
    assert len(short) == 8 and abs(sum(x * x for x in short) - 1) < 1e-4
    older = client.embeddings(model="m", prompt=texts[0]).embedding
    assert list(older) == pytest.approx(reply.embeddings[0], abs=1e-5)
    assert client.embeddings(model="m", prompt="").embedding == []  # loads only
    assert client.embed(model="m", input="").embeddings == []
    too_long = "word " * engine.model_info.context_length * 2
    assert len(client.embed(model="m", input=too_long).embeddings[0]) > 0  # cut to fit
    refused = post(server, "/api/embed", {"model": "m", "input": too_long, "truncate": False})
    assert refused.status_code == 400 and "context" in refused.json()["error"]
    assert [e.dialect for e in server.request_log.recent()][-1] == "ollama"
