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
from core.engine.types import DoneEvent, ErrorEvent, Event, ProgressEvent, TokenEvent, ToolCallEvent
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
                lambda done: builder.full(done.text, done.stats, done.tool_calls),
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
    message_delta (stop_reason, usage), message_stop. A text block opens with its first
    text; each tool call is a tool_use block whose input comes as one input_json_delta."""
    index, text_open = -1, False  # the last block's index; whether it is a text block still open
    try:
        # the engine's first event says how much of the prompt the cache served
        prompt, cached = (first.total, first.done) if isinstance(first, ProgressEvent) else (0, 0)
        yield sse(builder.start(prompt, cached), "message_start")
        yield sse({"type": "ping"}, "ping")
        last_sent = time.monotonic()
        event: Event | None = first
        while event is not None:
            if isinstance(event, TokenEvent) and event.text:
                if not text_open:
                    index, text_open = index + 1, True
                    yield sse(builder.block_start(index), "content_block_start")
                yield sse(builder.text_delta(event.text, index), "content_block_delta")
                last_sent = time.monotonic()
            elif isinstance(event, ToolCallEvent):
                if text_open:
                    text_open = False
                    yield sse(builder.block_stop(index), "content_block_stop")
                index += 1
                yield sse(builder.block_start(index, event.call), "content_block_start")
                yield sse(builder.input_delta(event.call, index), "content_block_delta")
                yield sse(builder.block_stop(index), "content_block_stop")
                last_sent = time.monotonic()
            elif isinstance(event, ProgressEvent) and time.monotonic() - last_sent > PING_EVERY_S:
                yield sse({"type": "ping"}, "ping")
                last_sent = time.monotonic()
            elif isinstance(event, ErrorEvent):
                yield sse(engine_error(event, chat=True).anthropic_body(), "error")
                return
            elif isinstance(event, DoneEvent):
                if event.stats.finish_reason == "cancelled":  # the server is stopping
                    yield sse(shutting_down().anthropic_body(), "error")
                    return
                if text_open:
                    yield sse(builder.block_stop(index), "content_block_stop")
                yield sse(builder.delta(event.stats), "message_delta")
                yield sse({"type": "message_stop"}, "message_stop")
                return
            event = await anext(events, None)
    finally:
        events.handle.cancel()


@router.post("/v1/messages/count_tokens", summary="Count a message's input tokens (Anthropic)")
async def count_tokens(body: CountTokensRequest, request: Request) -> JSONResponse:
    api = server_of(request)
    generation = await checked_call(request, body, count_request, api.model_card())
    try:
        tokens = await asyncio.to_thread(api.engine.count_tokens, generation)
    except UserError as exc:
        raise engine_error(ErrorEvent(str(exc), exc.kind), chat=True) from None
    return JSONResponse({"input_tokens": tokens})
