"""The MCP reference servers from npm through the hub: ``@modelcontextprotocol/
server-filesystem`` on a folder of three files and ``@modelcontextprotocol/server-everything``'s
echo, each started as ``node <package>/dist/index.js``. Skipped where node is missing or the
packages are not installed (``npm install --prefix tests/core/mcp/node``; CI does)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from core.mcp.config import McpServer
from core.mcp.hub import McpHub
from tests.core.mcp.mcp_fixtures import wait_for

PACKAGES = Path(__file__).parent / "node" / "node_modules" / "@modelcontextprotocol"
FILESYSTEM = PACKAGES / "server-filesystem" / "dist" / "index.js"
EVERYTHING = PACKAGES / "server-everything" / "dist" / "index.js"

pytestmark = [
    pytest.mark.mcp_npm,
    pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed"),
    pytest.mark.skipif(
        not (FILESYSTEM.is_file() and EVERYTHING.is_file()),
        reason="the MCP reference servers are not installed "
        "(npm install --prefix tests/core/mcp/node)",
    ),
]


def test_reference_servers_through_the_hub(tmp_path):
    folder = tmp_path / "scratch"
    folder.mkdir()
    for name in ("a.txt", "b.md", "c.json"):
        (folder / name).write_text(name)
    node = shutil.which("node")
    servers = [
        McpServer("fs", command=node, args=(str(FILESYSTEM), str(folder))),
        McpServer("everything", command=node, args=(str(EVERYTHING),)),
    ]
    hub = McpHub(tmp_path / "data", servers)
    hub.start()
    try:
        fs, everything = wait_for(hub, "fs"), wait_for(hub, "everything")
        assert fs.state == "ready", fs
        assert everything.state == "ready", everything
        tools = {t.name: t for t in fs.tools}
        assert tools["list_directory"].read_only
        allowed = hub.call("fs", "list_allowed_directories", {}, 20).result(25)
        assert not allowed.is_error and folder.resolve().name in allowed.text
        listing = hub.call("fs", "list_directory", {"path": str(folder)}, 20).result(25)
        assert not listing.is_error
        assert all(f"[FILE] {name}" in listing.text for name in ("a.txt", "b.md", "c.json"))
        echo = hub.call("everything", "echo", {"message": "hello from radixchat"}, 20).result(25)
        assert not echo.is_error and "hello from radixchat" in echo.text
        table = hub.tools({"fs": {"list_directory"}, "everything": {"echo"}})
        assert table.routes == {
            "list_directory": ("fs", "list_directory"),
            "echo": ("everything", "echo"),
        }
        pids = [s.pid for s in hub.statuses()]
    finally:
        hub.stop()
    assert all(pid is not None for pid in pids)
