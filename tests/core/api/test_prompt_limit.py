"""A prompt past the size limit is one 400 naming the field, in both dialects, and costs the
engine nothing: a message of several MB is refused on its length before it is tokenised,
while another client's stream goes on."""

from __future__ import annotations

import http.client
import json
import threading

import pytest

from core.api.server import ApiServer

MODEL = "tiny"
HUGE = 3_000_000  # characters (the body limit is 8 MiB)


@pytest.fixture(scope="module")
def server(tiny_engine):
    with ApiServer(tiny_engine, "127.0.0.1", 0) as api:
        yield api


def post(server, path: str, body: dict, headers: dict | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
    try:
        conn.request(
            "POST",
            path,
            body=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", **(headers or {})},
        )
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


@pytest.mark.parametrize(
    "path, body, param, unread",
    [
        ("/v1/chat/completions", {"messages": user("x" * HUGE)}, "messages", True),
        ("/v1/chat/completions", {"messages": user("x" * HUGE), "stream": True}, "messages", True),
        ("/v1/completions", {"prompt": "x" * HUGE}, "prompt", True),
        # tokenised, then counted
        ("/v1/chat/completions", {"messages": user("x" * 600)}, "messages", False),
    ],
)
def test_openai_a_prompt_past_the_limit_is_a_400_naming_the_field(
    server, path, body, param, unread
):
    status, raw = post(server, path, {"model": MODEL, "max_tokens": 4, **body})
    assert status == 400, raw[:300]
    error = json.loads(raw)["error"]
    assert error["param"] == param and error["code"] == "context_length_exceeded"
    assert "context of 512" in error["message"] and "\n" not in error["message"]
    assert ("characters, so at least" in error["message"]) == unread  # refused before tokenising


@pytest.mark.parametrize(
    "path, stream",
    [("/v1/messages", False), ("/v1/messages", True), ("/v1/messages/count_tokens", False)],
)
def test_anthropic_a_prompt_past_the_limit_is_a_400_naming_the_field(server, path, stream):
    body = {"model": MODEL, "messages": user("y" * HUGE)}
    if path == "/v1/messages":
        body.update(max_tokens=4, stream=stream)
    status, raw = post(server, path, body, {"anthropic-version": "2023-06-01"})
    assert status == 400, raw[:300]
    reply = json.loads(raw)
    assert reply["type"] == "error" and reply["error"]["type"] == "invalid_request_error"
    assert reply["error"]["message"].startswith("messages: the prompt is ")
    assert "characters, so at least" in reply["error"]["message"]


def test_a_huge_message_is_refused_while_another_client_streams(server):
    """The stream's reply is whole, the huge message gets its 400 (the engine-level test
    shows the stream's tokens keep coming meanwhile)."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
    try:
        conn.request(
            "POST",
            "/v1/chat/completions",
            headers={"Content-Type": "application/json"},
            body=json.dumps(
                {
                    "model": MODEL,
                    "messages": user("stream on"),
                    "stream": True,
                    "max_tokens": 200,
                    "temperature": 0,
                }
            ).encode(),
        )
        response = conn.getresponse()
        assert response.status == 200
        first = response.readline()
        assert first.startswith(b"data: ")
        refused: list[int] = []
        sender = threading.Thread(
            target=lambda: refused.append(
                post(
                    server, "/v1/chat/completions", {"model": MODEL, "messages": user("z" * HUGE)}
                )[0]
            )
        )
        sender.start()
        rest = response.read()
        sender.join(60)
    finally:
        conn.close()
    assert refused == [400]
    chunks = [
        json.loads(line[6:]) for line in (first + rest).splitlines() if line.startswith(b"data: {")
    ]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and rest.endswith(
        b"data: [DONE]\n\n"
    )
