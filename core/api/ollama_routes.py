"""The Ollama endpoints: ``GET``/``HEAD /``, ``/api/version``, ``/api/tags``, ``/api/ps``,
``/api/show``, ``/api/chat`` and ``/api/generate`` (NDJSON, or one object with
``"stream": false``), ``/api/embed`` and ``/api/embeddings``, ``/api/pull`` and
``/api/delete``. Errors are Ollama-shaped
(``{"error": "..."}``: :mod:`core.api.errors` picks the shape by path).

Any model name a chat or generate request sends is served by the loaded model, and the reply
names the model as it was asked for (as Ollama's replies do); ``/api/ps`` says which model is
loaded. The model list and descriptions are plain file reads, done off the event loop.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from core.api.embedding_routes import run_embedding
from core.api.errors import ApiError
from core.api.generation import ReplyWriter, run_generation
from core.api.ollama_embed import (
    OllamaEmbeddingsRequest,
    OllamaEmbedRequest,
    embed_reply,
    embed_request,
    embeddings_reply,
)
from core.api.ollama_models import OllamaModel, find, local_models, ps_body, show_body
from core.api.ollama_pull import (
    PullSwitch,
    parse_name,
    plan_pull,
    pull_key,
    pull_refusal,
    pull_statuses,
)
from core.api.ollama_reply import OllamaReply, ndjson
from core.api.ollama_schema import (
    TOOL_CHOICE_HEADER,
    OllamaCall,
    OllamaChatRequest,
    OllamaGenerateRequest,
    OllamaModelRequest,
    OllamaPullRequest,
    model_of,
    to_call,
)
from core.api.relay import CLIENT_GONE, watch_disconnect
from core.api.routing import (
    SSE_HEADERS,
    JsonRoute,
    PriorityHeader,
    SessionHeader,
    checked_call,
    key_namespace,
    named,
    server_of,
)
from core.engine.types import DoneEvent, ToolCall
from core.errors import UserError
from core.models.hub.client import HubError

if TYPE_CHECKING:
    from core.api.state import ApiState

router = APIRouter(route_class=JsonRoute)
NDJSON = "application/x-ndjson"
RUNNING = "Ollama is running"
# The Ollama release whose API this one matches: clients gate features on the version
OLLAMA_API_VERSION = "0.12.0"
HUB_KINDS = ("hf-cache", "hf-gguf")


@router.get("/", summary="Ollama's liveness answer: 'Ollama is running'")
def root() -> PlainTextResponse:
    return PlainTextResponse(RUNNING)


@router.head("/", include_in_schema=False)
def root_head() -> PlainTextResponse:
    return PlainTextResponse(RUNNING)


@router.get("/api/version", summary="The Ollama API version this server matches (Ollama)")
def version(request: Request) -> JSONResponse:
    return JSONResponse({"version": OLLAMA_API_VERSION, "radixchat": server_of(request).version})


async def _models(api: ApiState) -> list[OllamaModel]:
    info = api.engine.model_info
    model_id = (api.model_name or info.name) if info is not None else ""
    return await asyncio.to_thread(local_models, api.engine.data_root, info, model_id)


@router.get("/api/tags", summary="The models on this machine (Ollama)")
async def tags(request: Request) -> JSONResponse:
    models = await _models(server_of(request))
    return JSONResponse({"models": [m.listed() for m in models]})


@router.get("/api/ps", summary="The loaded model (Ollama)")
async def ps(request: Request) -> JSONResponse:
    api = server_of(request)
    info = api.engine.model_info
    if info is None:
        return JSONResponse({"models": []})
    models = await _models(api)
    return JSONResponse(ps_body(models[0], info, api.engine.stats(), api.started_at))


@router.post("/api/show", summary="A model's template, parameters and capabilities (Ollama)")
async def show(body: OllamaModelRequest, request: Request) -> JSONResponse:
    api = server_of(request)
    name = body.model_name()
    info = api.engine.model_info
    models = await _models(api)
    model = find(models, name)
    loaded = models[0] if info is not None else None
    if model is None:  # any other name is served by the loaded model
        model = loaded
    if model is None:
        raise ApiError(404, f"model '{name}' not found", code="model_not_found")
    if model is loaded:
        facts = await asyncio.to_thread(api.engine.template_facts)
        return JSONResponse(show_body(model, facts, info))
    return JSONResponse(show_body(model))


ToolChoiceHeader = Annotated[
    str | None,
    Header(
        alias=TOOL_CHOICE_HEADER,
        description="RadixChat: auto, none, required or a tool's name (Ollama has no tool_choice)",
    ),
]


@router.post("/api/chat", summary="A chat reply (Ollama)")
async def chat(
    body: OllamaChatRequest,
    request: Request,
    session: SessionHeader = None,
    priority: PriorityHeader = None,
    tool_choice: ToolChoiceHeader = None,
) -> Response:
    return await _generate(request, body, session, priority, tool_choice)


@router.post("/api/generate", summary="A completion of a prompt (Ollama)")
async def generate(
    body: OllamaGenerateRequest,
    request: Request,
    session: SessionHeader = None,
    priority: PriorityHeader = None,
) -> Response:
    return await _generate(request, body, session, priority)


async def _generate(
    request: Request,
    body: OllamaChatRequest | OllamaGenerateRequest,
    session: str | None,
    priority: str | None,
    tool_choice: str | None = None,
) -> Response:
    arrived = time.monotonic()
    api = server_of(request)
    card = api.model_card()
    facts = await asyncio.to_thread(api.engine.template_facts)
    call = await checked_call(
        request,
        body,
        to_call,
        card,
        facts,
        session,
        key_namespace(request),
        priority,
        tool_choice,
    )
    reply = OllamaReply(call, model_of(body), arrived)
    if call.request is None:  # only load (or unload): the model is loaded already
        return JSONResponse(reply.loading())
    return await run_generation(
        request, call.request, LineWriter(call, reply), arrived, call.stream
    )


class LineWriter(ReplyWriter):
    """Ollama's reply: one object, or NDJSON lines (one a piece, the last with
    ``"done": true`` and the figures)."""

    media_type = NDJSON

    def __init__(self, call: OllamaCall, reply: OllamaReply):
        self.reply = reply
        self.chat = call.chat

    async def whole(self, done: DoneEvent) -> dict[str, Any]:
        return self.reply.last(done, whole=True)

    def token(self, text: str) -> list[bytes]:
        return self._line(self.reply.piece(text=text))

    def reasoning(self, text: str) -> list[bytes]:
        return self._line(self.reply.piece(thinking=text))

    def tool_call(self, call: ToolCall) -> list[bytes]:
        return self._line(self.reply.tool_call(call))

    async def finished(self, done: DoneEvent) -> list[bytes]:
        return [ndjson(self.reply.last(done, whole=False))]

    def failed(self, error: ApiError) -> list[bytes]:
        return [ndjson(error.ollama_body())]

    @staticmethod
    def _line(body: dict[str, Any] | None) -> list[bytes]:
        return [ndjson(body)] if body is not None else []


@router.post("/api/embed", summary="Embeddings of texts (Ollama)")
async def embed(body: OllamaEmbedRequest, request: Request) -> Response:
    return await _embed(body, request)


@router.post("/api/embeddings", summary="The embedding of a prompt (Ollama's older endpoint)")
async def embeddings(body: OllamaEmbeddingsRequest, request: Request) -> Response:
    return await _embed(body, request)


async def _embed(body: OllamaEmbedRequest | OllamaEmbeddingsRequest, request: Request) -> Response:
    arrived = time.monotonic()
    api = server_of(request)
    api.model_card()  # 503 while no model is loaded
    model = model_of(body)
    embedding = embed_request(body, key_namespace(request))
    result = await run_embedding(request, embedding, arrived) if embedding is not None else None
    if isinstance(body, OllamaEmbeddingsRequest):
        answer = embeddings_reply(result)
    else:
        answer = embed_reply(model, result, arrived)
    data = await asyncio.to_thread(lambda: json.dumps(answer).encode())
    response = Response(data, media_type="application/json")
    return named(response, embedding.cache_namespace) if embedding is not None else response


@router.post("/api/pull", summary="Download a model from the hub (Ollama)")
async def pull(body: OllamaPullRequest, request: Request) -> Response:
    api = server_of(request)
    target = parse_name(body.model_name())
    try:
        plan = await asyncio.to_thread(plan_pull, target)
    except HubError as exc:
        raise pull_refusal(exc) from None
    key = pull_key(plan)
    if key in api.pulls:
        raise ApiError(409, f"{key} is being pulled already", code="pull_running")
    api.pulls.add(key)
    switch = PullSwitch()
    statuses = pull_statuses(plan, api.engine.data_root, switch)
    if body.stream is False:
        try:
            async with watch_disconnect(request.scope, request.receive, switch):
                async for status in statuses:
                    if "error" in status and not request.scope.get(CLIENT_GONE):
                        raise ApiError(400, status["error"], code="pull_failed")
        finally:
            await statuses.aclose()
            api.pulls.discard(key)
        if request.scope.get(CLIENT_GONE):
            return Response(status_code=499)  # nobody will read it
        return JSONResponse({"status": "success"})
    return StreamingResponse(_released(statuses, api, key), media_type=NDJSON, headers=SSE_HEADERS)


async def _released(statuses, api: ApiState, key: str) -> AsyncIterator[bytes]:
    try:
        async for status in statuses:
            yield ndjson(status)
    finally:
        await statuses.aclose()
        api.pulls.discard(key)


@router.delete("/api/delete", summary="Delete a downloaded model (Ollama)")
async def delete(body: OllamaModelRequest, request: Request) -> Response:
    from core.models.hub.installed import delete_model

    api = server_of(request)
    name = body.model_name()
    models = await _models(api)
    model = find(models, name)
    if model is None:
        raise ApiError(404, f"model '{name}' not found", code="model_not_found")
    if api.engine.model_info is not None and model is models[0]:
        raise ApiError(
            400, f"{model.name} is the loaded model: load another one first", code="model_loaded"
        )
    if model.kind not in HUB_KINDS:
        raise ApiError(
            400,
            f"{model.name} was not downloaded from the hub ({model.path}): RadixChat deletes "
            "only what it downloaded; delete the file yourself",
            code="not_deletable",
        )
    try:
        await asyncio.to_thread(delete_model, api.engine.data_root, model.spec)
    except UserError as exc:
        raise ApiError(400, str(exc), code="delete_failed") from None
    return Response(status_code=200)
