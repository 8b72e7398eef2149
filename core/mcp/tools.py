"""The plain values the MCP hub hands other threads, and how MCP results and tool lists
become them: :class:`ToolInfo`, :class:`ServerStatus`, :class:`ToolResult` (text and image
parts) and the OpenAI-style tool table a chat sends the model (:func:`openai_tools`).

Nothing here holds a session or touches the event loop: every value is frozen and safe to
pass to the GUI thread.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

ServerState = Literal["starting", "ready", "failed", "disabled", "stopped"]
_NAME_OK = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_NAME_BAD_CHARS = re.compile(r"[^a-zA-Z0-9_-]")


@dataclass(frozen=True)
class ToolInfo:
    """One tool a server offers, as its ``tools/list`` described it."""

    server: str
    name: str
    title: str | None
    description: str
    input_schema: dict[str, Any]
    read_only: bool  # the tool's annotations say readOnlyHint (a hint, from the server)


@dataclass(frozen=True)
class ServerStatus:
    """Where one configured server stands."""

    name: str
    state: ServerState
    error: str | None = None  # one line, when failed
    tools: tuple[ToolInfo, ...] = ()
    restarts: int = 0
    pid: int | None = None  # a running stdio server's process


@dataclass(frozen=True)
class TextPart:
    text: str


@dataclass(frozen=True)
class ImagePart:
    data: bytes
    mime: str


@dataclass(frozen=True)
class ToolResult:
    """What a call gave: its parts (for the model and the window) and whether it failed.
    A failed call (the tool's own error, a timeout, a crash, a cancel) has ``is_error`` and
    a one-line ``error``; its text is in ``parts`` too."""

    parts: tuple[TextPart | ImagePart, ...]
    is_error: bool = False
    error: str | None = None

    @property
    def text(self) -> str:
        """The text parts, joined."""
        return "\n".join(p.text for p in self.parts if isinstance(p, TextPart))


def failed(error: str) -> ToolResult:
    """A result that is only an error (the hub's, not the tool's)."""
    error = one_line(error)
    return ToolResult(parts=(TextPart(error),), is_error=True, error=error)


def one_line(text: str, limit: int = 300) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def error_line(exc: BaseException) -> str:
    """An exception as one line: the first leaf of an exception group, its message or type."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    message = one_line(str(exc))
    if isinstance(exc, TimeoutError) and not message:
        return "timed out"
    return message or type(exc).__name__


def tool_info(server: str, tool: Any) -> ToolInfo:
    """A ``mcp.types.Tool`` as a :class:`ToolInfo`."""
    annotations = getattr(tool, "annotations", None)
    title = getattr(tool, "title", None) or getattr(annotations, "title", None)
    return ToolInfo(
        server=server,
        name=tool.name,
        title=title,
        description=tool.description or "",
        input_schema=dict(tool.input_schema or {"type": "object"}),
        read_only=bool(getattr(annotations, "read_only_hint", False)),
    )


def tool_result(result: Any) -> ToolResult:
    """A ``mcp.types.CallToolResult`` as a :class:`ToolResult`."""
    parts: list[TextPart | ImagePart] = []
    for block in result.content or ():
        kind = getattr(block, "type", None)
        if kind == "text":
            parts.append(TextPart(block.text))
        elif kind == "image":
            try:
                parts.append(
                    ImagePart(base64.b64decode(block.data, validate=True), block.mime_type)
                )
            except (binascii.Error, ValueError):
                parts.append(TextPart(f"[an image ({block.mime_type}) that is not base64]"))
        elif kind == "audio":
            parts.append(TextPart(f"[audio ({block.mime_type}), not shown]"))
        elif kind == "resource":
            resource = block.resource
            text = getattr(resource, "text", None)
            parts.append(TextPart(text if text is not None else f"[resource {resource.uri}]"))
        elif kind == "resource_link":
            parts.append(TextPart(f"[{block.name}: {block.uri}]"))
    if not parts and getattr(result, "structured_content", None) is not None:
        parts.append(TextPart(json.dumps(result.structured_content, ensure_ascii=False)))
    if result.is_error:
        text = "\n".join(p.text for p in parts if isinstance(p, TextPart))
        return ToolResult(tuple(parts), True, one_line(text) or "the tool failed")
    return ToolResult(tuple(parts))


@dataclass(frozen=True)
class ToolTable:
    """The tools a chat offers the model: OpenAI-style ``specs`` (``{"type": "function",
    "function": {"name", "description", "parameters"}}``) and ``routes``, each spec's name to
    its ``(server, tool)``."""

    specs: tuple[dict[str, Any], ...] = ()
    routes: dict[str, tuple[str, str]] = field(default_factory=dict)

    def route(self, name: str) -> tuple[str, str] | None:
        """The ``(server, tool)`` of a name the model called, or None."""
        return self.routes.get(name)


def openai_tools(
    tools: Iterable[ToolInfo], enabled: Mapping[str, set[str] | frozenset[str] | None]
) -> ToolTable:
    """The table of ``tools`` that ``enabled`` chooses (a server's name to None for all its
    tools or to the set of its tools' names; a server not named: none). Names are kept valid
    for OpenAI (``^[a-zA-Z0-9_-]{1,64}$``); a name two servers share becomes
    ``server__tool``; what still clashes gets ``_2``, ``_3``…"""
    chosen = [
        t
        for t in tools
        if t.server in enabled and (enabled[t.server] is None or t.name in enabled[t.server])
    ]
    plain = [_valid_name(t.name) for t in chosen]
    counts: dict[str, int] = {}
    for name in plain:
        counts[name] = counts.get(name, 0) + 1
    specs, routes = [], {}
    for tool, name in zip(chosen, plain):
        if counts[name] > 1:
            name = _valid_name(f"{tool.server}__{tool.name}")
        base, n = name, 2
        while name in routes:
            suffix = f"_{n}"
            name, n = base[: 64 - len(suffix)] + suffix, n + 1
        routes[name] = (tool.server, tool.name)
        description = tool.description or tool.title or tool.name
        specs.append(
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": description,
                    "parameters": tool.input_schema or {"type": "object", "properties": {}},
                },
            }
        )
    return ToolTable(tuple(specs), routes)


def _valid_name(name: str) -> str:
    if _NAME_OK.match(name):
        return name
    return (_NAME_BAD_CHARS.sub("_", name) or "tool")[:64]
