"""McpHub against the test server (the SDK's MCPServer) over stdio: tools, results, errors,
cancel, timeouts, a crash and its restart, stopping without orphans, bad servers."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from core.mcp.config import McpServer
from core.mcp.hub import McpHub
from core.mcp.tools import ImagePart, TextPart
from tests.core.mcp.mcp_fixtures import SERVERS, tools_server, wait_for


def gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.02)
    return False


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    hub = McpHub(tmp_path_factory.mktemp("data"), [tools_server()])
    hub.start()
    assert wait_for(hub, "t").state == "ready"
    yield hub
    hub.stop()


def test_tools_are_listed_with_read_only_marked(hub):
    (status,) = hub.statuses()
    assert status.state == "ready" and status.error is None and status.pid
    tools = {t.name: t for t in status.tools}
    assert set(tools) == {
        "add",
        "echo",
        "read_clock",
        "explode",
        "slow",
        "hang",
        "crash",
        "picture",
    }
    assert tools["read_clock"].read_only and tools["read_clock"].title == "Read the clock"
    assert not tools["add"].read_only
    assert tools["add"].input_schema["required"] == ["a", "b"]
    table = hub.tools({"t": {"add", "echo"}})
    assert [s["function"]["name"] for s in table.specs] == ["add", "echo"]
    assert table.route("add") == ("t", "add")


def test_call_results_text_image_and_error(hub):
    assert hub.call("t", "add", {"a": 2, "b": 40}, 10).result(15).parts == (TextPart("42"),)
    picture = hub.call("t", "picture", {}, 10).result(15)
    assert isinstance(picture.parts[0], ImagePart) and picture.parts[0].mime == "image/png"
    assert picture.parts[0].data.startswith(b"\x89PNG")
    error = hub.call("t", "explode", {"reason": "on purpose"}, 10).result(15)
    assert error.is_error and "exploded: on purpose" in error.error
    missing = hub.call("t", "no_such_tool", {}, 10).result(15)
    assert missing.is_error and missing.error
    other = hub.call("nobody", "add", {}, 10).result(15)
    assert other.is_error and "nobody" in other.error


def test_cancel_stops_the_call_and_the_server_stays_usable(hub):
    done = threading.Event()
    handle = hub.call("t", "slow", {"seconds": 30}, 60)
    handle.add_done_callback(lambda h: done.set())
    time.sleep(0.3)
    began = time.monotonic()
    handle.cancel()
    result = handle.result(5)
    assert result.is_error and result.error == "cancelled"
    assert time.monotonic() - began < 2 and done.wait(1) and handle.done()
    assert hub.call("t", "echo", {"text": "still here"}, 10).result(15).text == "still here"
    assert hub.statuses()[0].state == "ready"


def test_timeout_is_an_error_result(hub):
    began = time.monotonic()
    result = hub.call("t", "slow", {"seconds": 30}, 0.5).result(10)
    assert result.is_error and "timed out after 0.5 s" in result.error
    assert time.monotonic() - began < 5
    assert hub.call("t", "add", {"a": 1, "b": 1}, 10).result(15).text == "2"


def test_a_crash_fails_the_call_then_the_server_restarts(tmp_path):
    hub = McpHub(tmp_path, [tools_server()], backoff_s=0.3, backoff_max_s=0.6)
    hub.start()
    try:
        first = wait_for(hub, "t").pid
        result = hub.call("t", "crash", {"code": 3}, 10).result(15)  # never hangs
        assert result.is_error and "closed the connection" in result.error
        status = wait_for(hub, "t", ("failed",))
        assert status.error == "the server exited with code 3" and status.tools == ()
        status = wait_for(hub, "t", ("ready",))
        assert status.restarts == 1 and status.pid != first and gone(first)
        # crashing again backs off longer (0.6 s, the cap) before the next start
        hub.call("t", "crash", {"code": 4}, 10).result(15)
        assert wait_for(hub, "t", ("failed",)).error == "the server exited with code 4"
        began = time.monotonic()
        assert wait_for(hub, "t", ("ready",)).restarts == 2
        assert time.monotonic() - began >= 0.5
        assert hub.call("t", "add", {"a": 1, "b": 2}, 10).result(15).text == "3"
    finally:
        hub.stop()


def test_stop_ends_every_child_and_in_flight_calls(tmp_path):
    hub = McpHub(tmp_path, [tools_server("a"), tools_server("b")])
    hub.start()
    pids = [wait_for(hub, name).pid for name in ("a", "b")]
    handle = hub.call("a", "slow", {"seconds": 30}, 60)
    time.sleep(0.3)
    hub.stop()
    assert handle.result(5).is_error
    assert all(gone(pid) for pid in pids)
    assert [s.state for s in hub.statuses()] == ["stopped", "stopped"]
    assert hub.call("a", "add", {"a": 1, "b": 1}).result(1).error == (
        "the MCP servers are not running"
    )
    log = hub.log_file("a").read_text()
    assert "tools_server: starting" in log  # its stderr


def test_bad_servers_fail_with_one_line_and_block_nothing(tmp_path):
    servers = [
        McpServer("missing", command=str(tmp_path / "no-such-program")),
        McpServer("garbage", command=sys.executable, args=(str(SERVERS / "bad_server.py"),)),
        McpServer("quits", command=sys.executable, args=("-c", "import sys; sys.exit(5)")),
        McpServer("nohttp", url="http://127.0.0.1:9/mcp"),
        tools_server("good"),
        tools_server("off", enabled=False),
    ]
    hub = McpHub(tmp_path, servers, backoff_s=30, start_timeout_s=3)
    began = time.monotonic()
    hub.start()
    assert time.monotonic() - began < 2  # start() waits for no server
    try:
        assert wait_for(hub, "good").state == "ready"
        statuses = {s.name: s for s in hub.statuses()}
        assert statuses["off"].state == "disabled"
        for name in ("missing", "garbage", "quits", "nohttp"):
            status = wait_for(hub, name, ("failed",), timeout=10)
            assert status.error and "\n" not in status.error, status
        statuses = {s.name: s for s in hub.statuses()}
        assert "No such file" in statuses["missing"].error
        assert "not JSON-RPC" in statuses["garbage"].error
        assert statuses["quits"].error == "the server exited with code 5"
        assert hub.call("good", "add", {"a": 1, "b": 1}, 10).result(15).text == "2"
        failed = hub.call("quits", "add", {"a": 1, "b": 1}, 10).result(2)
        assert failed.is_error and "not ready" in failed.error
    finally:
        hub.stop()


def test_reload_starts_stops_and_restarts(tmp_path):
    hub = McpHub(tmp_path, [tools_server("a"), tools_server("b")])
    hub.start()
    try:
        pid_a, pid_b = (wait_for(hub, n).pid for n in ("a", "b"))
        hub.reload([tools_server("a"), tools_server("b", enabled=False), tools_server("c")])
        assert wait_for(hub, "c").state == "ready"
        assert [s.state for s in hub.statuses()] == ["ready", "disabled", "ready"]
        assert hub.status("a").pid == pid_a and gone(pid_b)
        hub.reload([tools_server("c")])
        assert [s.name for s in hub.statuses()] == ["c"] and gone(pid_a)
        table = hub.tools({"c": {"add"}, "a": None})
        assert table.routes == {"add": ("c", "add")}
    finally:
        hub.stop()


def test_two_servers_with_the_same_tools_get_prefixed_names(tmp_path):
    hub = McpHub(tmp_path, [tools_server("one"), tools_server("two")])
    hub.start()
    try:
        wait_for(hub, "one"), wait_for(hub, "two")
        table = hub.tools({"one": {"add"}, "two": {"add", "echo"}})
        assert table.routes == {
            "one__add": ("one", "add"),
            "two__add": ("two", "add"),
            "echo": ("two", "echo"),
        }
        server, tool = table.route("two__add")
        assert hub.call(server, tool, {"a": 5, "b": 5}, 10).result(15).text == "10"
    finally:
        hub.stop()
