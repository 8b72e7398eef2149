"""The Anthropic endpoints: ``POST /v1/messages`` (JSON, or Anthropic's stream of events) and
``POST /v1/messages/count_tokens``. Errors are Anthropic-shaped (:mod:`core.api.errors`
picks the shape by path)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

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
from core.api.errors import engine_error, shutting_down
from core.api.relay import EngineEvents, reply_stream, reply_whole, sse
from core.api.routing import (
    JsonRoute,
    PriorityHeader,
    SessionHeader,
    checked_call,
    key_namespace,
    named,
    server_of,
)
from core.engine.types import (
    DoneEvent,
    ErrorEvent,
    Event,
    ProgressEvent,
    ReasoningEvent,
    TokenEvent,
    ToolCallEvent,
)
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
    handle = api.submit(call.request)
    events = EngineEvents(api, handle, request, arrived)
    builder = MessageBuilder(call)
    if not call.stream:
        return named(
            await reply_whole(
                request,
                handle,
                events,
                True,
                lambda done: builder.full(done.text, done.stats, done.tool_calls, done.reasoning),
            ),
            call.request.cache_namespace,
        )
    return named(
        await reply_stream(
            request, handle, events, True, lambda first: _stream(call, builder, first, events)
        ),
        call.request.cache_namespace,
    )


async def _stream(
    call: MessagesCall, builder: MessageBuilder, first: Event, events: EngineEvents
) -> AsyncIterator[bytes]:
    """Anthropic's event sequence: message_start, ping, then per content block
    content_block_start, content_block_delta..., content_block_stop, and at the end
    message_delta (stop_reason, usage), message_stop. A thinking block (when the request
    enables thinking) opens with the reply's first thinking, its text in thinking_delta
    events, its signature in a signature_delta before it stops; a text block opens with its
    first text; each tool call is a tool_use block whose input comes as one input_json_delta.
    A long prefill, or thinking not sent, sends pings, so the client sees a live stream."""
    blocks = _Blocks(builder, call)
    try:
        # the engine's first event says how much of the prompt the cache served
        prompt, cached = (first.total, first.done) if isinstance(first, ProgressEvent) else (0, 0)
        yield sse(builder.start(prompt, cached), "message_start")
        yield sse({"type": "ping"}, "ping")
        last_sent = time.monotonic()
        event: Event | None = first
        while event is not None:
            out: list[tuple[dict, str]] = []
            if isinstance(event, ReasoningEvent) and event.text and call.thinking:
                out = blocks.thinking(event.text)
            elif isinstance(event, TokenEvent) and event.text:
                out = blocks.text(event.text)
            elif isinstance(event, ToolCallEvent):
                out = blocks.tool_use(event.call)
            elif (
                isinstance(event, (ProgressEvent, ReasoningEvent))  # a prefill, thinking unsent
                and time.monotonic() - last_sent > PING_EVERY_S
            ):
                out = [({"type": "ping"}, "ping")]
            elif isinstance(event, ErrorEvent):
                yield sse(engine_error(event, chat=True).anthropic_body(), "error")
                return
            elif isinstance(event, DoneEvent):
                if event.stats.finish_reason == "cancelled":  # the server is stopping
                    yield sse(shutting_down().anthropic_body(), "error")
                    return
                for body, kind in blocks.close():
                    yield sse(body, kind)
                yield sse(builder.delta(event.stats), "message_delta")
                yield sse({"type": "message_stop"}, "message_stop")
                return
            for body, kind in out:
                yield sse(body, kind)
            if out:
                last_sent = time.monotonic()
            event = await anext(events, None)
    finally:
        events.handle.cancel()


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
