"""What rank 0 tells the other ranks, as plain JSON values.

Messages on the control channel are length-prefixed JSON objects (4 bytes big-endian
length, then UTF-8 JSON): never pickles, so a peer can send values, not code. A request
crosses as the dict of its :class:`GenerationRequest` and comes back equal; a command of
:mod:`core.engine.commands` as its inputs, every field it is made with, by name (a field
added to a command crosses with it, or the command cannot be made on the other side).
"""

from __future__ import annotations

import dataclasses
import json
import socket
import struct
from typing import Any

from core.engine.commands import FlushCommand, ForgetCommand, GiveWayCommand, StopCommand
from core.engine.types import ChatMessage, GenerationRequest, SamplingParams, ToolCall

MAX_MESSAGE = 256 << 20  # a prompt of a few million tokens; anything longer is a broken peer
HANDSHAKE_MAX = 4096  # before a peer has proved itself, no message may be longer


class ChannelClosed(ConnectionError):
    """The peer closed the connection (or it broke)."""


def request_to_dict(request: GenerationRequest) -> dict[str, Any]:
    return dataclasses.asdict(request)


def request_from_dict(data: dict[str, Any]) -> GenerationRequest:
    sampling = dict(data["sampling"])
    sampling["stop"] = tuple(sampling.get("stop") or ())
    messages = tuple(
        ChatMessage(**{**m, "tool_calls": tuple(ToolCall(**c) for c in m.get("tool_calls") or ())})
        for m in data.get("messages") or ()
    )
    tokens = data.get("prompt_tokens")
    return GenerationRequest(
        **{
            **data,
            "messages": messages,
            "sampling": SamplingParams(**sampling),
            "prompt_tokens": tuple(tokens) if tokens is not None else None,
            "tools": tuple(data.get("tools") or ()),
            "context_tokens": tuple(data.get("context_tokens") or ()),
        }
    )


# The commands a group applies on every rank (loads and embeddings are not a group's: its
# rank 0 refuses them), by name.
GROUP_COMMANDS = {c.__name__: c for c in (ForgetCommand, FlushCommand, GiveWayCommand, StopCommand)}


def command_to_dict(command) -> dict[str, Any]:
    """``command``'s inputs (the fields it is made with; the engine's answers stay behind)."""
    kind = type(command)
    if GROUP_COMMANDS.get(kind.__name__) is not kind:
        raise TypeError(f"a group does not apply {kind.__name__} on its ranks")
    inputs = (f.name for f in dataclasses.fields(command) if f.init)
    return {"op": kind.__name__, **{name: getattr(command, name) for name in inputs}}


def command_from_dict(data: dict[str, Any]):
    """The command :func:`command_to_dict` made ``data`` of."""
    inputs = dict(data)
    return GROUP_COMMANDS[inputs.pop("op")](**inputs)


def send_message(sock: socket.socket, message: dict[str, Any]) -> None:
    body = json.dumps(message, separators=(",", ":")).encode()
    sock.sendall(struct.pack(">I", len(body)) + body)


def recv_message(sock: socket.socket, max_size: int = MAX_MESSAGE) -> dict[str, Any]:
    """The next message, at most ``max_size`` bytes; :class:`ChannelClosed` when the peer is
    gone (or sent garbage). A socket timeout propagates as ``TimeoutError``."""
    (length,) = struct.unpack(">I", _recv_exactly(sock, 4))
    if length > max_size:
        raise ChannelClosed(f"a message of {length} bytes: not a RadixChat peer")
    try:
        message = json.loads(_recv_exactly(sock, length))
    except ValueError as exc:
        raise ChannelClosed(f"a message that is not JSON: {exc}") from exc
    if not isinstance(message, dict):
        raise ChannelClosed("a message that is not a JSON object")
    return message


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        try:
            chunk = sock.recv(n - got)
        except (ConnectionResetError, BrokenPipeError) as exc:
            raise ChannelClosed(str(exc)) from exc
        if not chunk:
            raise ChannelClosed("connection closed")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
