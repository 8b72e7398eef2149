"""What one request may bring (issue 26.2): a tool count and the bytes of its schemas, each
a one-line 400 naming the limit and the option that raises it; and the schema checks run
off the event loop, so a heavy body holds up no other client."""

from __future__ import annotations

import http.client
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest

from core.api.server import ApiServer

PATHS = ("/v1/chat/completions", "/v1/messages", "/v1/messages/count_tokens")


@pytest.fixture(scope="module")
def server(tiny_engine):
    with ApiServer(tiny_engine, "127.0.0.1", 0) as api:
        yield api


def post(server, path: str, body: dict, timeout: float = 60) -> tuple[int, dict]:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=timeout)
    try:
        conn.request("POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def get(server, path: str, timeout: float) -> int:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def openai_tool(name: str, parameters: dict | None = None) -> dict:
    return {
        "type": "function",
        "function": {"name": name, "parameters": parameters or {"type": "object"}},
    }


def body_with(path: str, tools: list) -> dict:
    """A body for ``path`` with ``tools`` (in that dialect's shape if they are dicts of ours)."""
    messages = [{"role": "user", "content": "hi"}]
    if path == "/v1/chat/completions":
        return {"messages": messages, "max_tokens": 2, "tools": tools}
    shaped = [
        {"name": t["function"]["name"], "input_schema": t["function"]["parameters"]}
        if isinstance(t, dict) and "function" in t
        else t
        for t in tools
    ]
    return {"model": "default", "max_tokens": 2, "messages": messages, "tools": shaped}


def error_of(body: dict) -> dict:
    return body["error"]


@pytest.mark.faults
@pytest.mark.parametrize("path", PATHS)
def test_thirty_thousand_tools_are_one_400_before_any_is_validated(server, path):
    """Issue 26.2: 30,000 tools (1.5 MB) were each validated and schema-checked on the event
    loop. Counted first now: items that are not even tools get the count's 400, not a
    validation error about the first of them."""
    from core.api.limits import MAX_TOOLS

    status, body = post(server, path, body_with(path, [{}] * 30_000))
    assert status == 400, body
    error = error_of(body)
    if path == "/v1/chat/completions":  # OpenAI's errors name the field and a code
        assert error["param"] == "tools" and error["code"] == "too_many_tools"
    assert "30,000 tools" in error["message"] and f"at most {MAX_TOOLS}" in error["message"]
    assert "--max-tools" in error["message"] and "\n" not in error["message"]


@pytest.mark.faults
@pytest.mark.parametrize("path", PATHS)
def test_the_limits_are_the_servers_own_and_name_their_option(tiny_engine, path):
    from core.api.limits import RequestLimits

    limits = RequestLimits(max_tools=2, max_schema_bytes=2_000)
    with ApiServer(tiny_engine, "127.0.0.1", 0, limits=limits) as api:
        status, body = post(api, path, body_with(path, [openai_tool(f"t{i}") for i in range(3)]))
        assert status == 400 and "3 tools" in error_of(body)["message"]
        big = openai_tool("big", {"type": "object", "description": "x" * 3_000})
        status, body = post(api, path, body_with(path, [big]))
        assert status == 400, body
        assert (
            "--max-schema-bytes" in error_of(body)["message"]
            and "at most 2,000" in error_of(body)["message"]
        )
        status, body = post(api, path, body_with(path, [openai_tool("small")]))
        # within the limits: whatever the tiny model's template says
        assert "max-" not in json.dumps(body)


@pytest.mark.faults
def test_a_response_schema_counts_toward_the_bytes(tiny_engine):
    from core.api.limits import RequestLimits

    with ApiServer(
        tiny_engine, "127.0.0.1", 0, limits=RequestLimits(max_schema_bytes=2_000)
    ) as api:
        schema = {"type": "object", "description": "y" * 3_000}
        fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
        status, body = post(
            api,
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "response_format": fmt},
        )
        assert status == 400 and error_of(body)["code"] == "schemas_too_large"


@pytest.mark.faults
def test_schemas_are_checked_off_the_event_loop(server, monkeypatch):
    """Issue 26.2: while one request's schema is being checked, the server answers others."""
    entered, release = threading.Event(), threading.Event()
    original = jsonschema.Draft202012Validator.check_schema.__func__

    def slow_check(cls, schema, *args, **kwargs):
        if schema.get("description") == "held":
            entered.set()
            release.wait(30)
        return original(cls, schema, *args, **kwargs)

    monkeypatch.setattr(jsonschema.Draft202012Validator, "check_schema", classmethod(slow_check))
    held = openai_tool("held", {"type": "object", "description": "held"})
    with ThreadPoolExecutor(1) as pool:
        heavy = pool.submit(
            post, server, "/v1/chat/completions", body_with("/v1/chat/completions", [held])
        )
        try:
            assert entered.wait(30), "the schema check never started"
            assert get(server, "/health", timeout=10) == 200  # the event loop is free
        finally:
            release.set()
        status, _ = heavy.result(timeout=60)
    assert status in (200, 400)  # checked; the tiny model's template decides the rest


@pytest.mark.faults
def test_each_clients_bodies_are_paced_past_a_burst():
    """Issue 26.2: JSON is parsed before a body can be refused (~0.2 s of the interpreter for
    4.7 MB); one client's bodies back to back held everyone else up between their steps."""
    from core.api.limits import ByteAllowance

    allowance = ByteAllowance(burst=1000, per_s=100)
    assert allowance.charge("key-a", 1000, now=100.0) == 0  # the burst: at once
    assert allowance.charge("key-b", 1000, now=100.0) == 0  # another client has its own
    assert allowance.charge("key-a", 50, now=100.0) == pytest.approx(0.5)  # past it: paced
    assert allowance.charge("key-a", 50, now=100.5) == pytest.approx(0.5)  # still behind
    assert allowance.charge("key-a", 1000, now=200.0) == 0  # long after: a whole burst again
