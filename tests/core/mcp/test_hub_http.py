"""McpHub against the test server served over streamable HTTP on loopback (a subprocess)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from core.mcp.config import McpServer
from core.mcp.hub import McpHub
from tests.core.mcp.mcp_fixtures import TOOLS_SERVER, wait_for


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def http_server():
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(TOOLS_SERVER), "http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/mcp"
    process.kill()  # a cancelled slow call's thread would hold a graceful stop for 30 s
    process.wait(10)


def test_http_server_tools_and_calls(tmp_path, http_server):
    hub = McpHub(tmp_path, [McpServer("web", url=http_server, headers={"X-Test": "1"})])
    hub.start()
    try:
        status = wait_for(hub, "web")
        assert status.state == "ready", status
        assert status.pid is None
        assert {t.name for t in status.tools} >= {"add", "read_clock"}
        assert hub.call("web", "add", {"a": 20, "b": 22}, 10).result(15).text == "42"
        error = hub.call("web", "explode", {}, 10).result(15)
        assert error.is_error and "exploded" in error.error
        handle = hub.call("web", "slow", {"seconds": 30}, 60)
        time.sleep(0.3)
        handle.cancel()
        assert handle.result(5).error == "cancelled"
        assert hub.call("web", "echo", {"text": "ok"}, 10).result(15).text == "ok"
    finally:
        hub.stop()
    assert hub.statuses()[0].state == "stopped"
