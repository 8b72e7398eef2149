"""The Anthropic endpoints: ``POST /v1/messages`` (JSON, or Anthropic's stream of events) and
``POST /v1/messages/count_tokens``. Errors are Anthropic-shaped (:mod:`core.api.errors`
picks the shape by path)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from core.api.anthropic_schema import (
    CountTokensRequest,
    MessageBuilder,
    MessagesCall,
    MessagesRequest,
    count_request,
    to_call,
)
from core.api.errors import ApiError, engine_error
from core.api.generation import ReplyWriter, run_generation
from core.api.relay import sse
from core.api.routing import (
    JsonRoute,
    PriorityHeader,
    SessionHeader,
    checked_call,
    key_namespace,
    server_of,
)
from core.engine.types import DoneEvent, ErrorEvent, Event, ProgressEvent, ToolCall
from core.errors import UserError

router = APIRouter(route_class=JsonRoute)
PING_EVERY_S = 10.0  # a long prefill sends pings, so proxies and clients see a live stream


@router.post("/v1/messages", summary="Create a message (Anthropic)")
async def messages(
    body: MessagesRequest,
    request: Request,
    session: SessionHeader = None,
    priority: PriorityHeader = None,
) -> Response:
    arrived = time.monotonic()
    api = server_of(request)
    call = await checked_call(
        request, body, to_call, api.model_card(), session, key_namespace(request), priority
    )
    return await run_generation(request, call.request, MessageWriter(call), arrived, call.stream)


class MessageWriter(ReplyWriter):
    """Anthropic's reply: a message, or its event sequence: message_start, ping, then per
    content block content_block_start, content_block_delta..., content_block_stop, and at
    the end message_delta (stop_reason, usage), message_stop. A thinking block (when the
    request enables thinking) opens with the reply's first thinking, its text in
    thinking_delta events, its signature in a signature_delta before it stops; a text block
    opens with its first text; each tool call is a tool_use block whose input comes as one
    input_json_delta. A long prefill, or thinking not sent, sends pings, so the client sees
    a live stream."""

    def __init__(self, call: MessagesCall):
        self.call, self.builder = call, MessageBuilder(call)
        self.blocks = _Blocks(self.builder, call)
        self.last_sent = time.monotonic()

    async def whole(self, done: DoneEvent) -> dict[str, Any]:
        return self.builder.full(done.text, done.stats, done.tool_calls, done.reasoning)

    def opening(self, first: Event) -> list[bytes]:
        # the engine's first event says how much of the prompt the cache served
        prompt, cached = (first.total, first.done) if isinstance(first, ProgressEvent) else (0, 0)
        self.last_sent = time.monotonic()
        return [
            sse(self.builder.start(prompt, cached), "message_start"),
            sse({"type": "ping"}, "ping"),
        ]

    def token(self, text: str) -> list[bytes]:
        return self._sent(self.blocks.text(text)) if text else []

    def reasoning(self, text: str) -> list[bytes]:
        if text and self.call.thinking:
            return self._sent(self.blocks.thinking(text))
        return self._ping_if_due()  # thinking not sent

    def tool_call(self, call: ToolCall) -> list[bytes]:
        return self._sent(self.blocks.tool_use(call))

    def progress(self, event: ProgressEvent) -> list[bytes]:
        return self._ping_if_due()  # a long prefill

    def _ping_if_due(self) -> list[bytes]:
        """A ping, if nothing was sent for a while."""
        if time.monotonic() - self.last_sent > PING_EVERY_S:
            return self._sent([({"type": "ping"}, "ping")])
        return []

    async def finished(self, done: DoneEvent) -> list[bytes]:
        return [
            *(sse(body, kind) for body, kind in self.blocks.close()),
            sse(self.builder.delta(done.stats), "message_delta"),
            sse({"type": "message_stop"}, "message_stop"),
        ]

    def failed(self, error: ApiError) -> list[bytes]:
        return [sse(error.anthropic_body(), "error")]

    def _sent(self, events: list[tuple[dict, str]]) -> list[bytes]:
        """``events`` (body, event name) as server-sent events, noting when they went."""
        if events:
            self.last_sent = time.monotonic()
        return [sse(body, kind) for body, kind in events]


class _Blocks:
    """The content blocks of a stream: which is open (thinking or text), and its index; each
    method returns the events to send, as (body, event name) pairs."""

    def __init__(self, builder: MessageBuilder, call: MessagesCall):
        self.builder, self.call = builder, call
        self.index = -1  # the last block's
        self.open: str | None = None  # "thinking" or "text": the block still open
        self.thought = ""  # the open thinking block's text (its signature is of it)

    def thinking(self, text: str) -> list[tuple[dict, str]]:
        out = self._open("thinking")
        self.thought += text
        if self.call.thinking_shown:
            out.append((self.builder.thinking_delta(text, self.index), "content_block_delta"))
        return out

    def text(self, text: str) -> list[tuple[dict, str]]:
        out = self._open("text")
        out.append((self.builder.text_delta(text, self.index), "content_block_delta"))
        return out

    def tool_use(self, call) -> list[tuple[dict, str]]:
        out = self.close()
        self.index += 1
        return [
            *out,
            (self.builder.block_start(self.index, call), "content_block_start"),
            (self.builder.input_delta(call, self.index), "content_block_delta"),
            (self.builder.block_stop(self.index), "content_block_stop"),
        ]

    def close(self) -> list[tuple[dict, str]]:
        """Stop the open block (a thinking block sends its signature first)."""
        out: list[tuple[dict, str]] = []
        if self.open == "thinking":
            out.append(
                (self.builder.signature_delta(self.thought, self.index), "content_block_delta")
            )
        if self.open is not None:
            out.append((self.builder.block_stop(self.index), "content_block_stop"))
        self.open, self.thought = None, ""
        return out

    def _open(self, kind: str) -> list[tuple[dict, str]]:
        if self.open == kind:
            return []
        out = self.close()
        self.index, self.open = self.index + 1, kind
        start = self.builder.block_start(self.index, thinking=kind == "thinking")
        return [*out, (start, "content_block_start")]


@router.post("/v1/messages/count_tokens", summary="Count a message's input tokens (Anthropic)")
async def count_tokens(body: CountTokensRequest, request: Request) -> JSONResponse:
    api = server_of(request)
    generation = await checked_call(request, body, count_request, api.model_card())
    try:
        tokens = await asyncio.to_thread(api.engine.count_tokens, generation)
    except UserError as exc:
        raise engine_error(ErrorEvent(str(exc), exc.kind), chat=True) from None
    return JSONResponse({"input_tokens": tokens})
