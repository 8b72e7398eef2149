"""One request of ``radixchat bench soak`` through the real client packages (``openai``,
``anthropic``): a :class:`Step` (a dialect's operation and its body) sent to a server, read
to the end or dropped after a few events, and its :class:`Reply` (text, tool calls, the ids
it made) in one shape for the three dialects, so two servers' replies compare.

The dialects: OpenAI chat completions (``chat``), Anthropic ``/v1/messages`` (``messages``),
OpenAI Responses (``responses``: ``store``, ``previous_response_id``, ``conversation``), and
the operations around them (``conversation``: create one; ``delete``: a stored response or
a conversation). The packages are imported on use: they are the dev extra's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from core.errors import UserError

OPS = ("chat", "messages", "responses", "conversation", "delete_response", "delete_conversation")


class StreamFailed(Exception):
    """A stream that ended on an error event, or without its last event."""


@dataclass(frozen=True)
class Step:
    """One request: ``op`` (one of ``OPS``) with ``body``, the SDK call's keyword arguments
    (the model and the sampling included); ``drop_after`` events of a stream read before the
    connection is closed (None: read to its end, or not a stream)."""

    op: str
    body: dict[str, Any]
    stream: bool = False
    drop_after: int | None = None

    @property
    def dialect(self) -> str:
        """``chat``, ``messages`` or ``responses`` (what the conversations and deletes are)."""
        return self.op if self.op in ("chat", "messages") else "responses"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON, keys sorted (the dialects send a string or an object)
    call_id: str  # the id a tool result answers (not compared: each server makes its own)


@dataclass
class Reply:
    """What came back: the reply's text and tool calls; ``made`` the id it made (a stored
    response, a conversation); ``dropped``: the stream was closed after ``events`` events."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    made: str | None = None
    events: int = 0
    dropped: bool = False

    def same_as(self, other: Reply) -> bool:
        return self.text == other.text and [(c.name, c.arguments) for c in self.tool_calls] == [
            (c.name, c.arguments) for c in other.tool_calls
        ]

    def summary(self, limit: int = 80) -> str:
        calls = "".join(f" [{c.name}({c.arguments})]" for c in self.tool_calls)
        return (self.text + calls)[:limit]


def _sorted_json(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return arguments  # not JSON: compared as sent
    return json.dumps(arguments, sort_keys=True)


class Clients:
    """The SDK clients of one server and one key, with no retries of their own (the soak
    counts every failure) and ``timeout_s`` for every request."""

    def __init__(self, port: int, key: str, timeout_s: float):
        try:
            import anthropic
            import openai
        except ImportError as exc:
            raise UserError(
                f"bench soak drives the server with the openai and anthropic packages: "
                f"{exc.name} is not installed (pip install 'radixchat[dev]')"
            ) from None
        base = f"http://127.0.0.1:{port}"
        self.openai = openai.OpenAI(
            base_url=base + "/v1", api_key=key, max_retries=0, timeout=timeout_s
        )
        self.anthropic = anthropic.Anthropic(
            base_url=base, api_key=key, max_retries=0, timeout=timeout_s
        )

    def close(self) -> None:
        self.openai.close()
        self.anthropic.close()

    def perform(self, step: Step) -> Reply:
        """Send ``step``; exceptions are the packages' own (the caller sorts them)."""
        if step.op == "chat":
            if step.stream:
                return self._chat_stream(step)
            return _chat_reply(self.openai.chat.completions.create(**step.body))
        if step.op == "messages":
            if step.stream:
                return self._messages_stream(step)
            return _message_reply(self.anthropic.messages.create(**step.body))
        if step.op == "responses":
            if step.stream:
                return self._responses_stream(step)
            return _response_reply(self.openai.responses.create(**step.body))
        if step.op == "conversation":
            return Reply(made=self.openai.conversations.create(**step.body).id)
        if step.op == "delete_response":
            self.openai.responses.delete(step.body["id"])
            return Reply()
        if step.op == "delete_conversation":
            self.openai.conversations.delete(step.body["id"])
            return Reply()
        raise ValueError(f"unknown op {step.op!r}")

    def _chat_stream(self, step: Step) -> Reply:
        reply = Reply()
        text: list[str] = []
        calls: dict[int, dict[str, str]] = {}
        with self.openai.chat.completions.create(**step.body, stream=True) as stream:
            for chunk in stream:
                reply.events += 1
                for choice in chunk.choices:
                    text.append(choice.delta.content or "")
                    for delta in choice.delta.tool_calls or ():
                        call = calls.setdefault(delta.index, {"id": "", "name": "", "args": ""})
                        call["id"] += delta.id or ""
                        if delta.function is not None:
                            call["name"] += delta.function.name or ""
                            call["args"] += delta.function.arguments or ""
                if step.drop_after and reply.events >= step.drop_after:
                    reply.dropped = True
                    break  # leaving the block closes the connection mid-stream
        reply.text = "".join(text)
        reply.tool_calls = tuple(
            ToolCall(c["name"], _sorted_json(c["args"]), c["id"]) for _, c in sorted(calls.items())
        )
        return reply

    def _messages_stream(self, step: Step) -> Reply:
        events = 0
        with self.anthropic.messages.stream(**step.body) as stream:
            for _ in stream:
                events += 1
                if step.drop_after and events >= step.drop_after:
                    return Reply(events=events, dropped=True)
            reply = _message_reply(stream.get_final_message())
        reply.events = events
        return reply

    def _responses_stream(self, step: Step) -> Reply:
        events = 0
        with self.openai.responses.create(**step.body, stream=True) as stream:
            for event in stream:
                events += 1
                if step.drop_after and events >= step.drop_after:
                    return Reply(events=events, dropped=True)
                if event.type in ("response.completed", "response.incomplete"):
                    reply = _response_reply(event.response)  # incomplete: max_output_tokens
                    reply.events = events
                    return reply
                if event.type in ("response.failed", "error"):
                    raise StreamFailed(f"the stream ended with {event.type}")
        raise StreamFailed("a Responses stream ended without its last event")


def _chat_reply(completion) -> Reply:
    message = completion.choices[0].message
    return Reply(
        text=message.content or "",
        tool_calls=tuple(
            ToolCall(c.function.name, _sorted_json(c.function.arguments), c.id)
            for c in message.tool_calls or ()
        ),
    )


def _message_reply(message) -> Reply:
    return Reply(
        text="".join(block.text for block in message.content if block.type == "text"),
        tool_calls=tuple(
            ToolCall(block.name, _sorted_json(block.input), block.id)
            for block in message.content
            if block.type == "tool_use"
        ),
    )


def _response_reply(response) -> Reply:
    return Reply(
        text=response.output_text,
        tool_calls=tuple(
            ToolCall(item.name, _sorted_json(item.arguments), item.call_id)
            for item in response.output
            if item.type == "function_call"
        ),
        made=response.id,
    )


def error_kind(exc: BaseException) -> tuple[str, bool]:
    """A failure's kind for the report (``HTTP 503``, ``APITimeoutError``...), and whether
    the server failed: a 5xx, or an error event in a stream it had answered 200 (the
    packages raise ``APIError`` without a status, or a status error of 200, for those)."""
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and status != 200:
        return f"HTTP {status}", status >= 500
    if status == 200 or isinstance(exc, StreamFailed) or type(exc).__name__ == "APIError":
        return "error event in a stream", True
    if type(exc).__name__ == "RemoteProtocolError":  # httpx's, read from a stream
        return "reply cut short", True  # the server closed the connection mid-reply
    return type(exc).__name__, False  # the client's side: a timeout, a connection refused
