"""The OpenAI endpoints: ``/health``, ``/metrics``, ``/v1/models``, ``/v1/chat/completions``,
``/v1/completions`` (JSON, or server-sent events with ``"stream": true``)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from core.api import anthropic_schema
from core.api.errors import engine_error, shutting_down
from core.api.openai_schema import (
    ChatCompletionRequest,
    CompletionCall,
    CompletionRequest,
    ReplyBuilder,
    model_object,
    to_call,
)
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
    ReasoningEvent,
    TokenEvent,
    ToolCallEvent,
)

router = APIRouter(route_class=JsonRoute)


@router.get("/health", summary="Liveness: 200 once the model is loaded, 503 while it loads")
def health(request: Request) -> JSONResponse:
    api = server_of(request)
    if api.engine.model_info is None:
        return JSONResponse({"status": "loading"}, status_code=503)
    return JSONResponse({"status": "ok", "model": api.model_card().id})


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
def metrics(request: Request) -> Response:
    data, content_type = server_of(request).metrics.exposition()
    return Response(data, media_type=content_type)


def _anthropic(request: Request) -> bool:
    """Anthropic's clients send ``anthropic-version``: they get its shape of the model list."""
    return "anthropic-version" in request.headers


@router.get(
    "/v1/models", summary="The loaded model (OpenAI's shape, or Anthropic's with anthropic-version)"
)
def list_models(request: Request) -> JSONResponse:
    card = server_of(request).model_card(with_cache=True)
    if _anthropic(request):
        return JSONResponse(anthropic_schema.model_list(card))
    names = [card.id, *card.listed]
    return JSONResponse({"object": "list", "data": [model_object(card, n) for n in names]})


@router.get("/v1/models/{model:path}", summary="The loaded model, by any name")
def retrieve_model(model: str, request: Request) -> JSONResponse:
    """Any name is the loaded model (as any name in a request is): under that name if it is
    one of the model's (an alias), else under its id."""
    card = server_of(request).model_card(with_cache=True)
    name = model if model in card.listed else card.id
    if _anthropic(request):
        return JSONResponse(anthropic_schema.model_object(card, name))
    return JSONResponse(model_object(card, name))


@router.post("/v1/chat/completions", summary="Chat completion (OpenAI)")
async def chat_completions(
    body: ChatCompletionRequest,
    request: Request,
    session: SessionHeader = None,
    priority: PriorityHeader = None,
) -> Response:
    return await generate(request, body, session, priority)


@router.post("/v1/completions", summary="Text completion (OpenAI, legacy)")
async def completions(
    body: CompletionRequest,
    request: Request,
    session: SessionHeader = None,
    priority: PriorityHeader = None,
) -> Response:
    return await generate(request, body, session, priority)


async def generate(
    request: Request,
    body: ChatCompletionRequest | CompletionRequest,
    session: str | None,
    priority: str | None = None,
) -> Response:
    arrived = time.monotonic()
    api = server_of(request)
    card = api.model_card()
    call = await checked_call(
        request, body, to_call, card, session, key_namespace(request), priority
    )
    handle = api.submit(call.request)
    events = EngineEvents(api, handle, request, arrived)
    reply = ReplyBuilder(call, card)
    if not call.stream:
        return named(
            await reply_whole(
                request,
                handle,
                events,
                call.chat,
                lambda done: reply.full(done.text, done.stats, done.tool_calls, done.reasoning),
            ),
            call.request.cache_namespace,
        )
    return named(
        await reply_stream(
            request, handle, events, call.chat, lambda first: _chunks(call, reply, first, events)
        ),
        call.request.cache_namespace,
    )


async def _chunks(
    call: CompletionCall, reply: ReplyBuilder, first: Event, events: EngineEvents
) -> AsyncIterator[bytes]:
    """The server-sent events of a reply; if the client leaves, Starlette cancels this and the
    request is cancelled with it."""
    try:
        if call.chat:
            yield sse(reply.chunk(first=True))
        event: Event | None = first
        while event is not None:
            if isinstance(event, TokenEvent):
                yield sse(reply.chunk(event.text))
            elif isinstance(event, ReasoningEvent):
                yield sse(reply.chunk(reasoning=event.text))
            elif isinstance(event, ToolCallEvent):
                yield sse(reply.chunk(tool_call=event.call))
            elif isinstance(event, ErrorEvent):
                yield sse(engine_error(event, call.chat).body())
                return
            elif isinstance(event, DoneEvent):
                if event.stats.finish_reason == "cancelled":  # the server is stopping
                    yield sse(shutting_down().body())
                    return
                yield sse(reply.chunk(stats=event.stats))
                if call.include_usage:
                    yield sse(reply.usage_chunk(event.stats))
                yield b"data: [DONE]\n\n"
                return
            event = await anext(events, None)
    finally:
        events.handle.cancel()
