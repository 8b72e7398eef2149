"""The MCP reference servers from npm through the real window (issue 46.5): a chat using
``@modelcontextprotocol/server-filesystem`` on a scratch folder of three files and
``@modelcontextprotocol/server-everything``; a forced first call (the chat's First Step, so
the test never depends on the model's choice) waits for Allow, runs, and its result is in
the prompt of the reply's next step. Marked ``mcp_npm``; CI installs the servers
(``npm install --prefix tests/core/mcp/node``); skipped where node or they are missing."""

from __future__ import annotations

import shutil

import pytest
from PySide6.QtCore import Qt

from core.mcp.config import McpServer
from tests.app.test_window_tools import (
    ask,
    last_reply,
    open_with_tools,
    use_tools,
    wait_reply_end,
    waiting_card,
)
from tests.core.mcp.test_npm_servers import EVERYTHING, FILESYSTEM

pytestmark = [
    pytest.mark.mcp_npm,
    pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed"),
    pytest.mark.skipif(
        not (FILESYSTEM.is_file() and EVERYTHING.is_file()),
        reason="the MCP reference servers are not installed "
        "(npm install --prefix tests/core/mcp/node)",
    ),
]


def test_reference_servers_in_the_window(qtbot, open_window, tmp_path, long_tiny_model):
    folder = tmp_path / "scratch"
    folder.mkdir()
    for name in ("a.txt", "b.md", "c.json"):
        (folder / name).write_text(name)
    node = shutil.which("node")
    servers = [
        McpServer("fs", command=node, args=(str(FILESYSTEM), str(folder))),
        McpServer("everything", command=node, args=(str(EVERYTHING),)),
    ]
    window, bridge, store = open_with_tools(
        open_window, tmp_path, long_tiny_model, qtbot, servers=servers, wait=("fs", "everything")
    )
    assert window.tools.hub.status("fs").state == "ready"
    assert window.tools.hub.status("everything").state == "ready"
    # the filesystem server: its folder, after Allow, is in the next step's prompt
    use_tools(window, store, "fs", ["list_allowed_directories"], "list_allowed_directories", 2)
    ask(qtbot, window, "Which folder may you read?")
    card = waiting_card(qtbot, window)
    assert "fs › list_allowed_directories" in card.title.text()
    qtbot.mouseClick(card.allow_button, Qt.MouseButton.LeftButton)
    wait_reply_end(qtbot, window)
    assert card.state == "ok" and str(folder.resolve()) in card.result_text
    reply = last_reply(store, window)
    step = reply.tool_steps[0]
    first = step["stats"]
    last = reply.stats if reply.stats else reply.tool_steps[-1]["stats"]
    assert last["prompt_tokens"] >= first["prompt_tokens"] + len(card.result_text.encode())
    assert last["cached_tokens"] >= first["prompt_tokens"] - 16
    # the everything server: an image result shows as a picture
    use_tools(window, store, "everything", ["get-tiny-image"], "get-tiny-image", 1)
    ask(qtbot, window, "Show me a picture")
    card = waiting_card(qtbot, window)
    qtbot.mouseClick(card.allow_button, Qt.MouseButton.LeftButton)
    wait_reply_end(qtbot, window)
    assert card.state == "ok" and card.images and not card.images[0].pixmap().isNull()
    kinds = [p["type"] for p in last_reply(store, window).tool_steps[0]["results"][0]["parts"]]
    assert "image" in kinds
