"""A test MCP server written with the SDK's MCPServer (FastMCP before mcp 2): ``python
tools_server.py`` serves stdio, ``python tools_server.py http PORT`` streamable HTTP on
127.0.0.1:PORT/mcp. Its tools: add, echo, a read-only one, one that raises, a slow one,
one that hangs, one that crashes the process and one that returns an image."""

from __future__ import annotations

import os
import sys
import time

from mcp.server.mcpserver import Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

PNG = (  # a 2x2 red PNG
    b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x02\x00\x00\x00\x02"
    b"\x08\x06\x00\x00\x00r\xb6\r$\x00\x00\x00\x11IDATx\x9cc\xf8\xcf\xc0\xf0"
    b"\x1f\x84\x19`\x0c\x00G\xca\x07\xf9gYn\xb7\x00\x00\x00\x00IEND\xaeB"
    b"`\x82"
)

server = MCPServer("radixchat-test-tools")


@server.tool(description="Add two integers.")
def add(a: int, b: int) -> int:
    return a + b


@server.tool(description="Echo the text back.")
def echo(text: str) -> str:
    return text


@server.tool(
    title="Read the clock", annotations=ToolAnnotations(readOnlyHint=True), description="Now."
)
def read_clock() -> str:
    return "12:00"


@server.tool(description="Always fails.")
def explode(reason: str = "boom") -> str:
    raise ToolError(f"exploded: {reason}")


@server.tool(description="Sleep, then say so.")
def slow(seconds: float) -> str:
    time.sleep(seconds)
    return f"slept {seconds}"


@server.tool(description="Wait a minute (a call to cancel).")
def hang() -> str:
    time.sleep(60)
    return "waited"


@server.tool(description="End the server process at once.")
def crash(code: int = 3) -> str:
    os._exit(code)


@server.tool(description="A tiny PNG.")
def picture() -> Image:
    return Image(data=PNG, format="png")


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        print("tools_server: starting", file=sys.stderr, flush=True)
        server.run()
