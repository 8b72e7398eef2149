"""The hub's plain values: OpenAI tool tables (names valid, clashes resolved), results."""

from __future__ import annotations

import base64
import re

from mcp import types

from core.mcp.tools import ImagePart, TextPart, ToolInfo, openai_tools, tool_info, tool_result

VALID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def info(server, name, read_only=False) -> ToolInfo:
    return ToolInfo(server, name, None, f"{name} of {server}", {"type": "object"}, read_only)


def test_table_picks_servers_and_tools_and_routes_names():
    tools = [info("a", "read"), info("a", "write"), info("b", "search"), info("c", "other")]
    table = openai_tools(tools, {"a": {"read"}, "b": None})
    assert [s["function"]["name"] for s in table.specs] == ["read", "search"]
    assert table.specs[0] == {
        "type": "function",
        "function": {
            "name": "read",
            "description": "read of a",
            "parameters": {"type": "object"},
        },
    }
    assert table.route("search") == ("b", "search") and table.route("other") is None


def test_clashing_and_invalid_names_are_made_valid_and_distinct():
    tools = [
        info("fs", "read"),
        info("git", "read"),
        info("x", "files.list/all"),
        info("y", "é" * 80),
        info("z", "a" * 70),
        info("z2", "a" * 64),
    ]
    table = openai_tools(tools, {t.server: None for t in tools})
    names = [s["function"]["name"] for s in table.specs]
    assert names[:3] == ["fs__read", "git__read", "files_list_all"]
    assert all(VALID.match(n) for n in names) and len(set(names)) == len(names)
    assert {table.route(n) for n in names} == {(t.server, t.name) for t in tools}


def test_results_text_image_error_and_tool_info():
    png = b"\x89PNG..."
    result = tool_result(
        types.CallToolResult(
            content=[
                types.TextContent(type="text", text="hi"),
                types.ImageContent(
                    type="image", data=base64.b64encode(png).decode(), mime_type="image/png"
                ),
            ]
        )
    )
    assert result.parts == (TextPart("hi"), ImagePart(png, "image/png")) and not result.is_error
    error = tool_result(
        types.CallToolResult(
            content=[types.TextContent(type="text", text="no\nsuch file")], is_error=True
        )
    )
    assert error.is_error and error.error == "no such file"
    tool = types.Tool(
        name="look",
        input_schema={"type": "object"},
        annotations=types.ToolAnnotations(title="Look", read_only_hint=True),
    )
    assert tool_info("s", tool) == ToolInfo("s", "look", "Look", "", {"type": "object"}, True)
