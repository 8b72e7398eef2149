"""The HTTP layer of the API on a live server: the schema it serves, and what hostile or
broken requests get (raw sockets, where a client library would not misbehave on purpose)."""

from __future__ import annotations

import json
import socket

import pytest

from core.api.server import ApiServer


@pytest.fixture(scope="module")
def server(tiny_engine):
    with ApiServer(tiny_engine, "127.0.0.1", 0) as api:
        yield api


def exchange(server, request: bytes, timeout: float = 10.0) -> bytes:
    """Send raw bytes, read until the server closes or goes quiet; the bytes it answered."""
    with socket.create_connection((server.host, server.port), timeout=timeout) as sock:
        sock.sendall(request)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except TimeoutError:
            pass
    return received


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def body_of(response: bytes) -> dict:
    return json.loads(response.split(b"\r\n\r\n", 1)[1])


def test_the_schema_is_served(server):
    response = exchange(server, b"GET /openapi.json HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    assert status_of(response) == 200
    schema = body_of(response)
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics"} <= set(schema["paths"])
    chat = schema["components"]["schemas"]["ChatCompletionRequest"]
    assert chat["required"] == ["messages"]
    assert chat["properties"]["temperature"]["anyOf"][0] == {"type": "number", "maximum": 2.0, "minimum": 0.0}
