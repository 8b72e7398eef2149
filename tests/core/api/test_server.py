"""The OpenAI-compatible server, in-process on a tiny generated model, through the official
``openai`` client (and raw sockets where a client would not misbehave on purpose)."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from core.api.server import ApiServer, engine_error
from core.cli.main import main as cli_main
from core.engine.config import EngineConfig
from core.engine.engine import Engine
from core.engine.types import ErrorEvent
from core.errors import ErrorKind, UserError
from core.models.tiny_model import TinyModelSpec, write_tiny_model
from tests.core.api.helpers import wait_for
from tests.kvcache.family_weights import write_family

MODEL = "tiny"  # the tiny model's folder name: the server's model id


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    root = tmp_path_factory.mktemp("server")
    model = write_tiny_model(root / MODEL, TinyModelSpec(num_layers=2))
    eng = Engine(root / "data", str(model), config=EngineConfig(pool_tokens=8192)).start()
    eng.wait_ready(timeout=60)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def server(engine):
    with ApiServer(engine, "127.0.0.1", 0) as api:
        yield api


@pytest.fixture
def client(server):
    with OpenAI(base_url=server.address + "/v1", api_key="unused", max_retries=0, timeout=30) as c:
        yield c


def chat(client, text: str, **kw):
    kw.setdefault("max_tokens", 12)
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": text}], **kw
    )


def raw(server, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    """(status, parsed JSON body) of one request through http.client."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    headers = dict(headers or {})
    if body is not None:  # the JSON endpoints take JSON only
        headers.setdefault("Content-Type", "application/json")
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        conn.close()


def scrape(server) -> dict[tuple[str, tuple], float]:
    """Every sample of /metrics, keyed by (name, sorted labels)."""
    with urllib.request.urlopen(server.address + "/metrics", timeout=10) as response:
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def finished(server, reason: str) -> float:
    return scrape(server).get(
        ("radixchat_finished_requests_total", (("finish_reason", reason),)), 0.0
    )


# ------------------------------------------------------------------ happy paths
def test_a_base_model_says_so_in_the_model_list_and_still_chats(engine, tmp_path):
    """A model without a chat template is listed as a base model (both shapes of /v1/models);
    chat completions on it still answer, through the fallback template. An instruct model
    is not marked."""
    with ApiServer(engine, "127.0.0.1", 0) as api:
        status, body = raw(api, "GET", "/v1/models")
        assert status == 200 and body["data"][0]["radixchat"]["base_model"] is False
        assert "note" not in body["data"][0]["radixchat"]
    folder = write_tiny_model(tmp_path / "tiny-base", TinyModelSpec(num_layers=2))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    base = Engine(tmp_path / "data", str(folder), config=EngineConfig(pool_tokens=2048)).start()
    try:
        base.wait_ready(timeout=60)
        with ApiServer(base, "127.0.0.1", 0) as api:
            status, body = raw(api, "GET", "/v1/models")
            listed = body["data"][0]["radixchat"]
            assert listed["base_model"] is True and listed["note"] == "base: completion only"
            _, body = raw(api, "GET", "/v1/models", headers={"anthropic-version": "2023-06-01"})
            assert body["data"][0]["display_name"] == "tiny-base (base: completion only)"
            status, body = raw(
                api,
                "POST",
                "/v1/chat/completions",
                json.dumps(
                    {
                        "model": "x",
                        "max_tokens": 4,
                        "temperature": 0,
                        "messages": [{"role": "user", "content": "hi"}],
                    }
                ).encode(),
            )
            assert status == 200 and body["usage"]["completion_tokens"] > 0
    finally:
        base.shutdown()


def test_any_model_name_is_the_loaded_model_and_aliases_are_listed(engine):
    """Issue 30.3: whatever name a client was set up with answers, naming the real model;
    ``--alias`` names are listed in /v1/models (both shapes) and found by retrieve."""
    with ApiServer(engine, "127.0.0.1", 0, aliases=["gpt-4o", "coder"]) as api:
        with OpenAI(base_url=api.address + "/v1", api_key="x", max_retries=0, timeout=30) as c:
            assert [m.id for m in c.models.list().data] == [MODEL, "gpt-4o", "coder"]
            assert c.models.retrieve("coder").id == "coder"
            assert c.models.retrieve("x").id == MODEL
            for name in ("gpt-4o", "x", "claude-opus-4-8"):
                reply = c.chat.completions.create(
                    model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=2
                )
                assert reply.model == MODEL
        status, body = raw(api, "GET", "/v1/models", headers={"anthropic-version": "2023-06-01"})
        assert [m["id"] for m in body["data"]] == [MODEL, "gpt-4o", "coder"]
        status, body = raw(
            api,
            "POST",
            "/v1/messages",
            json.dumps(
                {"model": "gpt-4o", "max_tokens": 2, "messages": [{"role": "user", "content": "a"}]}
            ).encode(),
        )
        assert status == 200 and body["model"] == MODEL


def test_health_and_models(server, client, engine):
    status, body = raw(server, "GET", "/health")
    assert status == 200 and body == {"status": "ok", "model": MODEL}
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert models[0].to_dict()["radixchat"]["fingerprint"] == engine.model_info.fingerprint
    assert client.models.retrieve("default").id == MODEL
    cache = client.models.retrieve("default").to_dict()["radixchat"]["cache"]  # how it is cached
    assert (
        cache["cached_as"] == "pages"
        and "2 full" in cache["layout"]
        and "cached as pages" in cache["layout"]
    )
    assert cache["kv_format"] == {"full": "float32"}  # the KV format per layer kind


def test_chat_non_streaming_and_streaming_agree(client):
    reply = chat(client, "hello there", max_tokens=10)
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason == "length"
    usage = reply.usage
    assert usage.completion_tokens == 10
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert reply.model == MODEL and reply.object == "chat.completion"

    chunks = list(
        chat(
            client,
            "hello there",
            max_tokens=10,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    assert chunks[-1].usage.prompt_tokens == usage.prompt_tokens


def test_completions(client):
    reply = client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=0
    )
    assert reply.object == "text_completion" and reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 8 and reply.choices[0].text
    streamed = client.completions.create(
        model="default", prompt="Once upon a time", max_tokens=8, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == reply.choices[0].text


def test_shared_prefix_reports_cached_tokens(client, engine):
    question = "Tell me about radix trees and paged key value caches, at length. " * 2
    first = chat(client, question, max_tokens=6, extra_body={"session": "prefix-test"})
    follow_up = client.chat.completions.create(
        model=MODEL,
        temperature=0,
        max_tokens=6,
        messages=[
            {"role": "user", "content": question},
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "And then?"},
        ],
        extra_headers={"X-RadixChat-Session": "prefix-test"},
    )
    cached = follow_up.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens - 1 > first.usage.prompt_tokens_details.cached_tokens
    assert engine.stats().cache.sessions >= 1


def test_concurrent_greedy_requests_match_their_solo_replies(client):
    prompts = ["the first question", "a second, different one", "and a third"]
    alone = [chat(client, p, max_tokens=24).choices[0].message.content for p in prompts]
    with ThreadPoolExecutor(3) as pool:
        together = list(
            pool.map(lambda p: chat(client, p, max_tokens=24).choices[0].message.content, prompts)
        )
    assert together == alone


def test_stop_strings(client):
    full = chat(client, "count for me", max_tokens=30).choices[0].message.content
    stop = full[6:9]
    cut = chat(client, "count for me", max_tokens=30, stop=[stop, "never-seen"]).choices[0]
    assert cut.message.content == full[: full.index(stop)] and cut.finish_reason == "stop"
    text = client.completions.create(
        model=MODEL, prompt="count for me", max_tokens=30, temperature=0, stop=stop, stream=True
    )
    assert stop not in "".join(c.choices[0].text for c in text)


def test_seeded_sampling_repeats(client):
    kw = dict(
        max_tokens=12,
        temperature=1.0,
        top_p=0.9,
        seed=7,
        extra_body={"top_k": 20, "min_p": 0.01, "repetition_penalty": 1.1},
    )
    assert (
        chat(client, "roll the dice", **kw).choices[0].message.content
        == chat(client, "roll the dice", **kw).choices[0].message.content
    )


# ------------------------------------------------------------------ refusals
@pytest.mark.parametrize(
    "change, status, code",
    [
        ({"n": 2}, 400, "invalid_value"),
        ({"max_tokens": 0}, 400, "invalid_value"),
        ({"max_tokens": -5}, 400, "invalid_value"),
        ({"max_tokens": 10**9}, 400, "invalid_value"),
        ({"max_completion_tokens": 10**9}, 400, "invalid_value"),
        ({"temperature": "hot"}, 400, "invalid_type"),
        ({"top_p": 0}, 400, "invalid_value"),
        ({"stop": [1, 2]}, 400, "invalid_type"),
        ({"messages": "hello"}, 400, "invalid_type"),
        ({"messages": []}, 400, "invalid_value"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, 400, "invalid_value"),
        ({"messages": [{"role": "user", "content": 5}]}, 400, "invalid_type"),
        ({"messages": [{"role": "user", "content": "x" * 600}]}, 400, "context_length_exceeded"),
        (
            {"messages": [{"role": "user", "content": "x" * 600}], "stream": True},
            400,
            "context_length_exceeded",
        ),
        (
            {"temperature": float("nan")},
            400,
            "invalid_json",
        ),  # json.dumps writes NaN; JSON has none
        ({"top_p": float("inf")}, 400, "invalid_json"),
        ({"seed": -1}, 400, "invalid_value"),
        ({"seed": 2**64}, 400, "invalid_value"),
    ],
)
def test_bad_chat_requests_get_openai_errors(server, change, status, code):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        **change,
    }
    got, reply = raw(
        server,
        "POST",
        "/v1/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    assert got == status, reply
    assert set(reply["error"]) == {"message", "type", "param", "code"}
    assert reply["error"]["code"] == code and "\n" not in reply["error"]["message"]


@pytest.mark.parametrize("prompt", ["", ["one", "two"], [[1, 2], [3]], {"text": "hi"}])
def test_bad_completion_prompts(server, prompt):
    status, reply = raw(server, "POST", "/v1/completions", json.dumps({"prompt": prompt}).encode())
    assert status == 400 and reply["error"]["param"] == "prompt"


def test_hostile_bodies_are_400s_and_the_server_keeps_serving(server, client):
    from core.models.tiny_model import VOCAB_SIZE

    for ids in ([VOCAB_SIZE], [1, 2**40], [2**63]):  # MLX does not bounds-check an embedding
        status, reply = raw(
            server, "POST", "/v1/completions", json.dumps({"prompt": ids, "max_tokens": 2}).encode()
        )
        assert status == 400 and "vocabulary" in reply["error"]["message"], reply
    nested = b"[" * 100_000 + b"]" * 100_000
    assert raw(server, "POST", "/v1/chat/completions", nested)[0] == 400
    reply = chat(client, "still here?", temperature=1.0, extra_body={"top_k": 10**6})
    assert reply.choices[0].finish_reason in ("stop", "length")


def test_a_port_out_of_range_is_one_line(engine):
    with pytest.raises(UserError, match="0 to 65535"):
        ApiServer(engine, "127.0.0.1", 70000).start()
    with pytest.raises(SystemExit):
        cli_main(["serve", "--port", "70000"])


def test_openai_client_raises_on_refusals(client):
    with pytest.raises(openai.BadRequestError):
        chat(client, "hi", n=2)
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt="y" * 600, max_tokens=4, stream=True)
    assert caught.value.code == "context_length_exceeded"


def test_protocol_errors_and_the_server_keeps_serving(server, client):
    assert raw(server, "POST", "/v1/chat/completions", b"{not json")[0] == 400
    assert raw(server, "POST", "/v1/completions", b"[1, 2]")[0] == 400
    assert raw(server, "GET", "/v1/nowhere")[0] == 404
    assert raw(server, "GET", "/v1/chat/completions")[0] == 405
    assert raw(server, "DELETE", "/v1/models")[0] == 405
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    try:  # a refused body is not taken for the next request on the connection
        conn.request("POST", "/v1/models", body=b'{"x": 1}')
        response = conn.getresponse()
        assert (response.status, response.getheader("Allow")) == (405, "GET")
        response.read()
        conn.request("GET", "/health")
        assert conn.getresponse().status == 200
    finally:
        conn.close()

    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    try:  # a huge declared body: refused before it is read
        conn.putrequest("POST", "/v1/chat/completions")
        conn.putheader("Content-Length", str(9 * 1024 * 1024))
        conn.endheaders()
        response = conn.getresponse()
        assert (
            response.status == 413
            and json.loads(response.read())["error"]["code"] == "request_too_large"
        )
    finally:
        conn.close()
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    try:  # no Content-Length at all
        conn.putrequest("POST", "/v1/completions")
        conn.endheaders()
        response = conn.getresponse()
        assert response.status == 411
        response.read()
    finally:
        conn.close()
    assert chat(client, "still there?", max_tokens=3).usage.completion_tokens == 3


def test_api_key(engine):
    with ApiServer(engine, "127.0.0.1", 0, api_key="s3cret") as api:
        assert raw(api, "GET", "/health")[0] == 200
        status, body = raw(api, "GET", "/v1/models")
        assert status == 401 and body["error"]["code"] == "invalid_api_key"
        assert raw(api, "GET", "/metrics", headers={"Authorization": "Bearer wrong"})[0] == 401
        with OpenAI(base_url=api.address + "/v1", api_key="wrong", max_retries=0) as bad:
            with pytest.raises(openai.AuthenticationError):
                bad.models.list()
        with OpenAI(base_url=api.address + "/v1", api_key="s3cret", max_retries=0) as good:
            assert good.models.list().data[0].id == MODEL


def test_binding_beyond_loopback_needs_an_api_key(engine, tmp_path, capsys):
    with pytest.raises(UserError, match="API key"):
        ApiServer(engine, "0.0.0.0", 0)
    assert cli_main(["serve", "--host", "0.0.0.0", "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("radixchat: error: refusing to serve on 0.0.0.0") and "\n" not in err


# ------------------------------------------------------------------ metrics
def test_metrics_count_requests_and_tokens(server, client):
    before = scrape(server)
    reply = chat(client, "measure me", max_tokens=5)
    after = scrape(server)

    def grew(name, labels=()):
        key = (name, tuple(sorted(labels)))
        return after.get(key, 0) - before.get(key, 0)

    assert (
        grew(
            "radixchat_http_requests_total",
            [("endpoint", "/v1/chat/completions"), ("status", "200")],
        )
        == 1
    )
    assert grew("radixchat_prompt_tokens_total") == reply.usage.prompt_tokens
    assert grew("radixchat_completion_tokens_total") == 5
    assert (
        grew("radixchat_cache_hit_tokens_total", [("source", "ram")])
        == reply.usage.prompt_tokens_details.cached_tokens
    )
    assert grew("radixchat_time_to_first_token_seconds_count") == 1
    assert (
        sum(
            grew("radixchat_prompt_tokens_by_tier_total", [("tier", tier)])
            for tier in ("ram", "disk", "computed")
        )
        == reply.usage.prompt_tokens
    )
    assert ("radixchat_disk_cache_written_total", (("unit", "bytes"),)) in after
    assert after[("radixchat_kv_pages", (("state", "total"),))] > 0
    assert ("radixchat_mlx_memory_bytes", (("kind", "active"),)) in after
    assert after[("radixchat_requests_in_flight", ())] == 0


# ------------------------------------------------------------------ disconnects and shutdown
def _post_and_hang_up(server, body: dict, read_until: bytes | None) -> None:
    data = json.dumps(body).encode()
    with socket.create_connection((server.host, server.port), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(data), data)
        )
        received = b""
        while read_until is not None and read_until not in received:
            received += sock.recv(256)


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_hangs_up_cancels_its_request(server, client, stream):
    cancelled = finished(server, "cancelled")
    body = {
        "model": MODEL,
        "prompt": "go on and on",
        "max_tokens": 480,
        "temperature": 0,
        "stream": stream,
    }
    _post_and_hang_up(server, body, b"data: " if stream else None)
    assert wait_for(lambda: finished(server, "cancelled") == cancelled + 1, timeout=10)
    assert chat(client, "next, please", max_tokens=3).usage.completion_tokens == 3


def test_a_retry_after_a_hang_up_reads_the_prompt_from_the_cache(server, client):
    """An agent that timed out sends the same long prompt again: the prompt the cancelled
    request prefilled is a cache hit."""
    prompt = "Fix the failing test in the repository, then run the suite again. " * 3
    cancelled = finished(server, "cancelled")
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 480, "temperature": 0, "stream": True}
    _post_and_hang_up(server, body, b"data: ")
    assert wait_for(lambda: finished(server, "cancelled") == cancelled + 1, timeout=10)
    again = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1


def test_stop_cancels_running_requests_and_closes_connections(engine):
    api = ApiServer(engine, "127.0.0.1", 0).start()
    with OpenAI(base_url=api.address + "/v1", api_key="x", max_retries=0) as c:
        c.models.list()  # leaves an idle keep-alive connection open
        stream = c.completions.create(
            model=MODEL, prompt="long", max_tokens=480, temperature=0, stream=True
        )
        next(iter(stream))
        started = time.monotonic()
        api.stop()
        assert time.monotonic() - started < 5
        with pytest.raises(openai.APIError, match="shutting down"):  # never a silent truncation
            for chunk in stream:
                assert chunk.choices[0].finish_reason is None
        stream.close()
    assert (
        api.metrics.registry.get_sample_value(
            "radixchat_finished_requests_total", {"finish_reason": "cancelled"}
        )
        == 1
    )


@pytest.mark.parametrize(
    "kind, status, code",
    [
        (ErrorKind.CONTEXT_TOO_LONG, 400, "context_length_exceeded"),
        (ErrorKind.BAD_REQUEST, 400, None),
        (ErrorKind.MODEL_NOT_LOADED, 503, "model_not_loaded"),
        (ErrorKind.OUT_OF_MEMORY, 503, "out_of_memory"),
        (ErrorKind.INTERNAL, 500, "internal_error"),
    ],
)
def test_engine_errors_map_by_kind_not_wording(kind, status, code):
    # the same words under every kind: only the kind decides the answer
    error = engine_error(
        ErrorEvent("the prompt is 9 tokens but m has a context of 4", kind), chat=True
    )
    assert error.status == status
    assert error.body()["error"]["code"] == code


# ------------------------------------------------------------------ model families served
# A model of each way of caching, each once without a cache before this branch: a pure
# recurrent model (snapshots only; it never restored from disk), an MLA + linear-attention
# hybrid (pages of the latent's own shapes and state snapshots; its cache was off) and an
# MLA model (pages; its cache was off). tests/core/engine/test_model_matrix.py runs every
# model type through the engine; this is the same chat through the API as a client sees it.
SERVED_FAMILIES = {"mamba": "snapshots", "kimi_linear": "pages+snapshots", "deepseek_v3": "pages"}


@contextlib.contextmanager
def served(model, data, use_cache: bool = True):
    """The OpenAI client of a server on a new engine of ``model`` (``use_cache=False``: as
    ``radixchat serve --no-cache`` starts it)."""
    engine = Engine(
        data, str(model), config=EngineConfig(use_cache=use_cache, pool_tokens=4096)
    ).start()
    try:
        engine.wait_ready(timeout=120)
        with (
            ApiServer(engine, "127.0.0.1", 0) as api,
            OpenAI(
                base_url=api.address + "/v1", api_key="unused", max_retries=0, timeout=60
            ) as client,
        ):
            yield client
    finally:
        engine.shutdown()


def ask(client, messages: list[dict]):
    """A greedy reply in chat session "lyon" (a named session's turns go to disk however
    short; unnamed requests only from 256 tokens)."""
    return client.chat.completions.create(
        model="default",
        messages=messages,
        max_tokens=10,
        temperature=0,
        extra_body={"session": "lyon"},
    )


def reply_after(messages: list[dict], reply, text: str) -> list[dict]:
    """The conversation so far, the reply and the user's next message."""
    return [
        *messages,
        {"role": "assistant", "content": reply.choices[0].message.content},
        {"role": "user", "content": text},
    ]


@pytest.mark.model_matrix
@pytest.mark.parametrize("family", sorted(SERVED_FAMILIES))
def test_a_family_model_served_is_cached_restored_and_answers_as_uncached(family, tmp_path):
    model = write_family(tmp_path / family, family)
    data = tmp_path / "data"
    chats = [[{"role": "user", "content": "Plan a day in Lyon, with a museum and a long lunch."}]]
    with served(model, data) as client:
        cache = client.models.list().data[0].to_dict()["radixchat"]["cache"]
        assert cache["cached_as"] == SERVED_FAMILIES[family], cache
        assert cache["layout"].endswith(f"cached as {SERVED_FAMILIES[family]}")
        replies = [ask(client, chats[0])]
        chats.append(reply_after(chats[0], replies[0], "Why?"))
        replies.append(ask(client, chats[1]))  # turn 2: from RAM
    with served(model, data) as client:  # a restart: the disk holds the chat
        chats.append(reply_after(chats[1], replies[1], "More."))
        replies.append(ask(client, chats[2]))
    with served(model, data, use_cache=False) as client:
        cache = client.models.retrieve(family).to_dict()["radixchat"]["cache"]
        assert cache["cached_as"] == "off (disabled by the user (--no-cache))", cache
        uncached = [ask(client, messages) for messages in chats]
    texts = [r.choices[0].message.content for r in replies]
    assert texts == [r.choices[0].message.content for r in uncached] and all(texts)
    first, second, third = (r.model_dump()["usage"] for r in replies)
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    # a reply is cached but for its last token (sampled, never fed to the model)
    assert second["radixchat"]["ram_tokens"] >= first["total_tokens"] - 1
    assert second["radixchat"]["disk_tokens"] == 0
    assert third["radixchat"]["disk_tokens"] >= second["total_tokens"] - 1
    assert third["prompt_tokens_details"]["cached_tokens"] == third["radixchat"]["disk_tokens"]
    assert all(r.usage.prompt_tokens_details.cached_tokens == 0 for r in uncached)
