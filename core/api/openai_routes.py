"""The OpenAI endpoints: ``/health``, ``/metrics``, ``/v1/models``, ``/v1/chat/completions``,
``/v1/completions`` (JSON, or server-sent events with ``"stream": true``)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from core.api import anthropic_schema
from core.api.errors import ApiError
from core.api.generation import ReplyWriter, run_generation
from core.api.openai_schema import (
    ChatCompletionRequest,
    CompletionCall,
    CompletionRequest,
    ReplyBuilder,
    model_object,
    to_call,
)
from core.api.relay import sse
from core.api.routing import (
    JsonRoute,
    PriorityHeader,
    SessionHeader,
    checked_call,
    key_namespace,
    server_of,
)
from core.api.wire import ModelCard
from core.engine.types import DoneEvent, Event, ToolCall

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
    return await run_generation(
        request, call.request, ChunkWriter(call, card), arrived, call.stream
    )


class ChunkWriter(ReplyWriter):
    """OpenAI's reply: a completion object, or its chunks as server-sent events (a chat
    stream's first chunk names the assistant's role; ``data: [DONE]`` ends the stream)."""

    def __init__(self, call: CompletionCall, card: ModelCard):
        self.call, self.reply = call, ReplyBuilder(call, card)
        self.chat = call.chat

    async def whole(self, done: DoneEvent) -> dict[str, Any]:
        return self.reply.full(done.text, done.stats, done.tool_calls, done.reasoning)

    def opening(self, first: Event) -> list[bytes]:
        return [sse(self.reply.chunk(first=True))] if self.call.chat else []

    def token(self, text: str) -> list[bytes]:
        return [sse(self.reply.chunk(text))]

    def reasoning(self, text: str) -> list[bytes]:
        return [sse(self.reply.chunk(reasoning=text))]

    def tool_call(self, call: ToolCall) -> list[bytes]:
        return [sse(self.reply.chunk(tool_call=call))]

    async def finished(self, done: DoneEvent) -> list[bytes]:
        chunks = [sse(self.reply.chunk(stats=done.stats))]
        if self.call.include_usage:
            chunks.append(sse(self.reply.usage_chunk(done.stats)))
        return [*chunks, b"data: [DONE]\n\n"]

    def failed(self, error: ApiError) -> list[bytes]:
        return [sse(error.body())]
