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
    response = exchange(
        server, b"GET /openapi.json HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    assert status_of(response) == 200
    schema = body_of(response)
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics"} <= set(
        schema["paths"]
    )
    chat = schema["components"]["schemas"]["ChatCompletionRequest"]
    assert chat["required"] == ["messages"]
    assert chat["properties"]["temperature"]["anyOf"][0] == {
        "type": "number",
        "maximum": 2.0,
        "minimum": 0.0,
    }


def http_request(
    server,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    host: str | None = None,
) -> bytes:
    """One request over a raw socket, written out by hand; ``Connection: close``."""
    lines = [
        f"{method} {path} HTTP/1.1",
        f"Host: {host or f'127.0.0.1:{server.port}'}",
        "Connection: close",
    ]
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return exchange(server, ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b""))


def header(response: bytes, name: str) -> str | None:
    for line in response.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
        key, _, value = line.decode("latin-1").partition(":")
        if key.strip().lower() == name.lower():
            return value.strip()
    return None


CHAT = json.dumps(
    {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}
).encode()
JSON = {"Content-Type": "application/json"}


# ------------------------------------------------------------------ issue 14.3: web pages
@pytest.mark.faults
def test_a_cross_site_text_plain_post_is_refused(server):
    # what a <form> or fetch(..., {mode: "no-cors"}) on any page can send without a preflight
    response = http_request(
        server,
        "POST",
        "/v1/chat/completions",
        CHAT,
        {"Content-Type": "text/plain", "Origin": "http://evil.example"},
    )
    assert status_of(response) == 403 and body_of(response)["error"]["code"] == "origin_not_allowed"
    response = http_request(
        server, "POST", "/v1/chat/completions", CHAT, {"Content-Type": "text/plain"}
    )
    assert (
        status_of(response) == 415
        and body_of(response)["error"]["code"] == "unsupported_media_type"
    )
    assert status_of(http_request(server, "POST", "/v1/chat/completions", CHAT, JSON)) == 200


@pytest.mark.parametrize("headers", [{}, {"Content-Type": "application/x-www-form-urlencoded"}])
def test_curl_without_a_json_type_is_read_as_json(server, headers):
    """Issue 30.4: ``curl -d '{...}'`` sends no JSON type (curl's form type, or none): without
    a browser's Origin the body is read as JSON, as llama.cpp and mlx_lm.server do."""
    response = http_request(server, "POST", "/v1/chat/completions", CHAT, headers)
    assert status_of(response) == 200 and body_of(response)["choices"][0]["message"]


@pytest.mark.parametrize(
    "host",
    [
        "evil.example",
        "evil.example:{port}",
        "127.0.0.1.evil.example:{port}",
        "localhost:{port}@evil.example",
        "[::1]x",
    ],
)
@pytest.mark.faults
def test_a_dns_rebinding_host_is_refused(server, host):
    response = http_request(server, "GET", "/v1/models", host=host.format(port=server.port))
    assert status_of(response) == 403 and body_of(response)["error"]["code"] == "host_not_allowed"
    response = http_request(
        server, "POST", "/v1/chat/completions", CHAT, JSON, host=host.format(port=server.port)
    )
    assert status_of(response) == 403


@pytest.mark.faults
@pytest.mark.parametrize(
    "host", ["127.0.0.1:{port}", "localhost:{port}", "LOCALHOST", "[::1]:{port}", "127.0.0.1"]
)
def test_the_names_of_loopback_are_accepted(server, host):
    assert (
        status_of(http_request(server, "GET", "/v1/models", host=host.format(port=server.port)))
        == 200
    )


@pytest.mark.faults
def test_origins_are_refused_unless_allowed_and_allowed_ones_get_cors_answers(tiny_engine):
    allowed = "http://localhost:3000"
    with ApiServer(tiny_engine, "127.0.0.1", 0, api_key="k", allow_origins=[allowed + "/"]) as api:
        preflight = {
            "Origin": allowed,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type, authorization",
        }
        response = http_request(api, "OPTIONS", "/v1/chat/completions", headers=preflight)
        assert status_of(response) == 200  # no key needed: browsers send none with a preflight
        assert header(response, "Access-Control-Allow-Origin") == allowed
        assert "POST" in header(response, "Access-Control-Allow-Methods")
        assert "authorization" in header(response, "Access-Control-Allow-Headers").lower()

        authorized = {**JSON, "Origin": allowed, "Authorization": "Bearer k"}
        response = http_request(api, "POST", "/v1/chat/completions", CHAT, authorized)
        assert (
            status_of(response) == 200
            and header(response, "Access-Control-Allow-Origin") == allowed
        )
        response = http_request(
            api, "POST", "/v1/chat/completions", CHAT, {**JSON, "Origin": allowed}
        )
        assert status_of(response) == 401  # the key is still needed, and the page may read why
        # from a page, even an allowed one, the body must say it is JSON (issue 30.4)
        for kind in ({}, {"Content-Type": "application/x-www-form-urlencoded"}):
            plain = {"Origin": allowed, "Authorization": "Bearer k", **kind}
            response = http_request(api, "POST", "/v1/chat/completions", CHAT, plain)
            assert body_of(response)["error"]["code"] == "unsupported_media_type"
        assert header(response, "Access-Control-Allow-Origin") == allowed

        for origin in ("http://localhost:3001", "null", "https://localhost:3000"):
            response = http_request(
                api, "OPTIONS", "/v1/chat/completions", headers={**preflight, "Origin": origin}
            )
            assert (
                status_of(response) == 403
                and header(response, "Access-Control-Allow-Origin") is None
            )
            response = http_request(
                api, "POST", "/v1/chat/completions", CHAT, {**authorized, "Origin": origin}
            )
            assert (
                status_of(response) == 403
                and header(response, "Access-Control-Allow-Origin") is None
            )


@pytest.mark.faults
def test_a_bad_allowed_origin_is_one_line(tiny_engine):
    from core.errors import UserError

    with pytest.raises(UserError, match="scheme://host"):
        ApiServer(tiny_engine, "127.0.0.1", 0, allow_origins=["localhost:3000/app"])


# ------------------------------------------------------------------ issue 14.5: 500s that are 400s
@pytest.mark.parametrize(
    "field",
    [
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "repetition_penalty",
        "seed",
        "max_tokens",
        "max_completion_tokens",
        "presence_penalty",
    ],
)
@pytest.mark.faults
@pytest.mark.parametrize("number", ["1" + "0" * 400, "1e400", "-1e400"])
def test_huge_sampling_values_are_400s_naming_the_field(server, caplog, field, number):
    body = CHAT[:-1] + f', "{field}": {number}}}'.encode()
    response = http_request(server, "POST", "/v1/chat/completions", body, JSON)
    assert status_of(response) == 400, response
    assert body_of(response)["error"]["param"] == field
    assert not [r for r in caplog.records if r.levelno >= 40 or r.exc_info]


@pytest.mark.parametrize(
    "path, body, param",
    [
        (
            "/v1/chat/completions",
            '{"messages": [{"role": "user", "content": "a\\ud800"}]}',
            "messages[0].content",
        ),
        (
            "/v1/chat/completions",
            '{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udfff"}]}]}',
            "messages[0].content[0].text",
        ),
        (
            "/v1/chat/completions",
            '{"messages": [{"role": "user", "content": "hi"}], "session": "s\\ud800"}',
            "session",
        ),
        (
            "/v1/chat/completions",
            '{"messages": [{"role": "user", "content": "hi"}], "stop": ["\\ud83d"]}',
            "stop[0]",
        ),
        ("/v1/completions", '{"prompt": "\\ud800"}', "prompt"),
        ("/v1/completions", '{"prompt": "x", "model": "\\ud800"}', "model"),
    ],
)
@pytest.mark.faults
def test_lone_surrogates_are_400s_naming_the_field(server, caplog, path, body, param):
    response = http_request(server, "POST", path, body.encode(), JSON)
    assert status_of(response) == 400, response
    error = body_of(response)["error"]
    assert error["param"] == param and "surrogate" in error["message"]
    assert not [r for r in caplog.records if r.levelno >= 40 or r.exc_info]


@pytest.mark.faults
def test_a_session_header_that_is_not_utf8_is_a_400(server):
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nX-RadixChat-Session: caf\xe9\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(CHAT), CHAT)
    )
    response = exchange(server, request)
    assert (
        status_of(response) == 400 and body_of(response)["error"]["param"] == "X-RadixChat-Session"
    )


# ------------------------------------------------------------------ issue 14.6: ambiguous framing
SMUGGLED = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


@pytest.mark.faults
def test_content_length_with_transfer_encoding_is_refused(server):
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(CHAT), CHAT)
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\n"
        b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n%s%s"
        % (len(chunked), chunked, SMUGGLED)
    )
    response = exchange(server, request)
    assert status_of(response) == 400 and body_of(response)["error"]["code"] == "ambiguous_framing"
    assert response.count(b"HTTP/1.1 ") == 1  # the connection is closed: nothing after it is served


@pytest.mark.faults
@pytest.mark.parametrize("lengths", [(len(CHAT), len(CHAT) + 5), (len(CHAT), 0)])
def test_two_different_content_lengths_are_refused(server, lengths):
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\n"
        b"Content-Length: %d\r\nContent-Length: %d\r\n\r\n%s%s" % (*lengths, CHAT, SMUGGLED)
    )
    response = exchange(server, request)
    assert status_of(response) == 400 and response.count(b"HTTP/1.1 ") == 1


@pytest.mark.faults
def test_a_chunked_body_alone_is_fine_and_held_to_the_limit(server, tiny_engine):
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(CHAT), CHAT)
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n%s" % chunked
    )
    assert status_of(exchange(server, request)) == 200
    with ApiServer(tiny_engine, "127.0.0.1", 0, max_body_bytes=len(CHAT) + 10) as small:
        assert status_of(exchange(small, request)) == 200
        piece = b"%x\r\n%s\r\n" % (len(CHAT), CHAT)  # no declared length: counted as it comes
        request = (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + piece * 2 + b"0\r\n\r\n"
        )
        response = exchange(small, request)
        assert (
            status_of(response) == 413 and body_of(response)["error"]["code"] == "request_too_large"
        )


def test_an_http_1_0_client_gets_its_stream_until_the_connection_closes(server):
    body = json.dumps(
        {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 3,
            "temperature": 0,
            "stream": True,
        }
    ).encode()
    request = (
        b"POST /v1/chat/completions HTTP/1.0\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    response = exchange(server, request)
    assert status_of(response) == 200 and header(response, "Transfer-Encoding") is None
    assert response.endswith(b"data: [DONE]\n\n")


@pytest.mark.parametrize(
    "path, body",
    [
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        ),
        (
            "/v1/messages",
            {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        ),
    ],
)
def test_the_priority_header_reaches_both_dialects(server, path, body):
    data = json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    ok = http_request(server, "POST", path, data, {**headers, "X-RadixChat-Priority": "3"})
    assert status_of(ok) == 200, ok
    bad = http_request(server, "POST", path, data, {**headers, "X-RadixChat-Priority": "-2"})
    assert status_of(bad) == 400 and "X-RadixChat-Priority" in json.dumps(body_of(bad))


@pytest.mark.faults
def test_a_body_that_never_ends_is_a_408(server, monkeypatch):
    """Issue 26.3: a body trickled in (or never sent) held its connection for good."""
    from core.api import guard

    monkeypatch.setattr(guard, "BODY_TIMEOUT_S", 0.5)
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(CHAT), CHAT[:10])
    )
    response = exchange(server, request)
    assert status_of(response) == 408 and body_of(response)["error"]["code"] == "request_timeout"
