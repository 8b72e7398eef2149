"""``/v1/messages`` and ``/v1/messages/count_tokens`` through the official ``anthropic`` client,
against a live server on a tiny generated model."""

from __future__ import annotations

import http.client
import json
import socket
import time

import anthropic
import pytest

from core.api.server import ApiServer

MODEL = "claude-sonnet-4-5"  # any claude-... name is served by the loaded model


@pytest.fixture(scope="module")
def server(tiny_engine):
    with ApiServer(tiny_engine, "127.0.0.1", 0) as api:
        yield api


def post(server, path: str, body: dict | bytes) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one JSON POST through http.client."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    try:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


@pytest.fixture
def client(server):
    with anthropic.Anthropic(
        base_url=server.address, api_key="unused", max_retries=0, timeout=30
    ) as c:
        yield c


def ask(client, text: str = "hello there", temperature: float = 0, **kw):
    """One message; the sampling fields go in ``extra_body`` (this client version has no
    parameters for them, the wire format still takes them)."""
    kw.setdefault("max_tokens", 12)
    extra = {"temperature": temperature, **{k: kw.pop(k) for k in ("top_p", "top_k") if k in kw}}
    return client.messages.create(
        model=MODEL, messages=[{"role": "user", "content": text}], extra_body=extra, **kw
    )


def test_a_message_and_its_stream_agree(client):
    message = ask(client, max_tokens=10)
    assert message.type == "message" and message.role == "assistant" and message.model == "tiny"
    assert message.id.startswith("msg_") and message.stop_reason == "max_tokens"
    assert [block.type for block in message.content] == ["text"] and message.content[0].text
    assert message.usage.output_tokens == 10 and message.usage.input_tokens > 0

    with client.messages.stream(
        model=MODEL,
        max_tokens=10,
        extra_body={"temperature": 0},
        messages=[{"role": "user", "content": "hello there"}],
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert {"message_start", "content_block_delta", "message_stop"} <= set(kinds)
    assert final.content[0].text == message.content[0].text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 10
    cached = final.usage.cache_read_input_tokens
    assert (
        final.usage.input_tokens + cached
        == message.usage.input_tokens + message.usage.cache_read_input_tokens
    )


def test_the_stream_is_anthropics_event_sequence(server):
    body = {
        "model": MODEL,
        "max_tokens": 6,
        "temperature": 0,
        "stream": True,
        "messages": [{"role": "user", "content": "stream me"}],
    }
    status, headers, raw = post(server, "/v1/messages", body)
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    lines = [line for line in raw.decode().splitlines() if line]
    names = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    data = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: ")]
    assert [d["type"] for d in data] == names  # every event says its type twice, the same
    deltas = names.count("content_block_delta")
    assert (
        names
        == [
            "message_start",
            "ping",
            "content_block_start",
            *["content_block_delta"] * deltas,
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
        and deltas >= 1
    )
    start, delta = data[0]["message"], data[-2]
    assert (
        start["content"] == []
        and start["stop_reason"] is None
        and start["usage"]["output_tokens"] == 0
    )
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 6
    assert all(
        d["delta"]["type"] == "text_delta" for d in data if d["type"] == "content_block_delta"
    )


def test_stop_sequences(client):
    full = ask(client, "count for me", max_tokens=30).content[0].text
    stop = full[6:9]
    cut = ask(client, "count for me", max_tokens=30, stop_sequences=[stop, "never-seen"])
    assert cut.content[0].text == full[: full.index(stop)]
    assert (cut.stop_reason, cut.stop_sequence) == ("stop_sequence", stop)
    with client.messages.stream(
        model=MODEL,
        max_tokens=30,
        extra_body={"temperature": 0},
        stop_sequences=[stop],
        messages=[{"role": "user", "content": "count for me"}],
    ) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", stop)
    assert final.content[0].text == cut.content[0].text


def test_system_as_a_string_or_blocks_and_sampling_fields(client):
    as_text = ask(client, system="You are terse.")
    as_blocks = ask(
        client,
        system=[{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
    )
    assert as_text.content[0].text == as_blocks.content[0].text
    assert (
        as_text.usage.input_tokens + as_text.usage.cache_read_input_tokens
        > ask(client).usage.input_tokens + ask(client).usage.cache_read_input_tokens
    )
    sampled = ask(client, temperature=0.7, top_p=0.9, top_k=20, metadata={"user_id": "u-1"})
    assert sampled.stop_reason in ("end_turn", "max_tokens")


def test_cache_reads_and_count_tokens(client):
    history = [
        {"role": "user", "content": [{"type": "text", "text": "Tell me about radix trees. " * 6}]}
    ]
    count = client.messages.count_tokens(
        model=MODEL, messages=history, system="Be brief."
    ).input_tokens
    first = client.messages.create(
        model=MODEL,
        max_tokens=4,
        extra_body={"temperature": 0},
        system="Be brief.",
        messages=history,
    )
    assert first.usage.input_tokens + first.usage.cache_read_input_tokens == count
    history += [
        {"role": "assistant", "content": first.content[0].text},
        {"role": "user", "content": "And then?"},
    ]
    second = client.messages.create(
        model=MODEL,
        max_tokens=4,
        extra_body={"temperature": 0},
        system="Be brief.",
        messages=history,
    )
    # the first turn's prompt, from the cache
    assert second.usage.cache_read_input_tokens >= count - 1
    assert second.usage.cache_creation_input_tokens == 0


def test_errors_are_anthropic_shaped(client, server):
    with pytest.raises(anthropic.BadRequestError) as caught:
        ask(client, temperature=1.5)
    assert (
        caught.value.body["error"]["type"] == "invalid_request_error"
        and "temperature" in caught.value.message
    )
    with pytest.raises(anthropic.BadRequestError, match="context"):
        ask(client, "x" * 600)
    status, _, raw = post(server, "/v1/messages", {"model": MODEL, "messages": []})
    assert status == 400
    body = json.loads(raw)
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "messages" in body["error"]["message"] and set(body["error"]) == {"type", "message"}


@pytest.mark.parametrize(
    "change, where",
    [
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "4"}],
                    }
                ]
            },
            "messages[0].content[0].tool_use_id",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            "messages[0].content[0]",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
            "messages[0].content[0].text",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "Sure,"},
                ]
            },
            "messages[1]",
        ),
        ({"stop_sequences": [""]}, "stop_sequences"),
        ({"max_tokens": 0}, "max_tokens"),
    ],
)
def test_what_is_not_supported_is_a_400_naming_the_field(server, change, where):
    body = {
        "model": MODEL,
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "hi"}],
        **change,
    }
    # 10**400: json writes it
    status, _, raw = post(server, "/v1/messages", json.dumps(body).encode())
    assert status == 400, raw
    message = json.loads(raw)["error"]["message"]
    assert f"'{where}'" in message or message.startswith(where), message


def test_the_api_key_as_x_api_key_or_bearer(tiny_engine):
    with ApiServer(tiny_engine, "127.0.0.1", 0, api_key="s3cret") as api:
        with anthropic.Anthropic(base_url=api.address, api_key="wrong", max_retries=0) as bad:
            with pytest.raises(anthropic.AuthenticationError) as caught:
                bad.messages.create(
                    model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "hi"}]
                )
            assert caught.value.body["error"]["type"] == "authentication_error"
        # x-api-key
        with anthropic.Anthropic(base_url=api.address, api_key="s3cret", max_retries=0) as good:
            assert (
                good.messages.create(
                    model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "hi"}]
                ).usage.output_tokens
                == 2
            )
        with anthropic.Anthropic(
            base_url=api.address, auth_token="s3cret", max_retries=0
        ) as bearer:
            assert bearer.messages.count_tokens(
                model=MODEL, messages=[{"role": "user", "content": "hi"}]
            ).input_tokens


def test_the_model_list_in_anthropics_shape(client, server):
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"] and models.data[0].type == "model"
    # any name is the loaded model, named by its own id (issue 30.3)
    assert client.models.retrieve(MODEL).id == client.models.retrieve("gpt-4o").id == "tiny"


def test_a_client_that_hangs_up_mid_stream_cancels_its_request(server, client):
    def cancelled() -> float:
        return (
            server.metrics.registry.get_sample_value(
                "radixchat_finished_requests_total", {"finish_reason": "cancelled"}
            )
            or 0.0
        )

    before = cancelled()
    data = json.dumps(
        {
            "model": MODEL,
            "max_tokens": 480,
            "stream": True,
            "temperature": 0,
            "messages": [{"role": "user", "content": "go on and on"}],
        }
    ).encode()
    with socket.create_connection((server.host, server.port), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(data), data)
        )
        received = b""
        while b"content_block_delta" not in received:
            received += sock.recv(4096)
    deadline = time.monotonic() + 10
    while cancelled() != before + 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cancelled() == before + 1
    assert ask(client, max_tokens=3).usage.output_tokens == 3


def test_max_tokens_past_the_context_is_a_ceiling(client):
    """Claude Code asks for max_tokens 64,000 whatever the model: past the context, the
    context is the ceiling (issue 30), not a 400."""
    for ceiling in (64000, 10**400):
        message = ask(client, max_tokens=ceiling, stop_sequences=["e"])
        assert message.type == "message" and message.usage.output_tokens <= 512
