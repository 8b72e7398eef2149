"""The OpenAI Responses endpoints: ``POST /v1/responses`` (JSON, or its stream of events),
``GET`` and ``DELETE /v1/responses/{id}``.

A request goes through what the other dialects' requests do (:func:`checked_call`, the
engine, :mod:`core.api.relay`), in the cache namespace of its API key and with its
priority; its wire format is :mod:`core.api.responses_schema` (in) and
:mod:`core.api.responses_reply` (out). A response asked to be stored (``store``, the
default) is kept in :mod:`core.api.responses_store` before its last event is sent, so a
client that continues it at once (``previous_response_id``) finds it. A stored response
belongs to its API key: another key's requests get a 404, as for an id never seen.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from core.api.errors import ApiError, engine_error, shutting_down
from core.api.relay import EngineEvents, reply_stream, reply_whole, sse
from core.api.responses_reply import ResponseBuilder
from core.api.responses_schema import ResponsesCall, ResponsesRequest, to_call
from core.api.routing import (
    JsonRoute,
    PriorityHeader,
    SessionHeader,
    checked_call,
    key_namespace,
    named,
    server_of,
)
from core.engine import namespaces
from core.engine.types import (
    DoneEvent,
    ErrorEvent,
    Event,
    ReasoningEvent,
    TokenEvent,
    ToolCallEvent,
)
from core.errors import StoreError

log = logging.getLogger(__name__)
router = APIRouter(route_class=JsonRoute)
ECHOED = ("tools", "tool_choice", "text")  # a response repeats these of its request as sent


def _not_found(response_id: str, param: str | None = None) -> ApiError:
    return ApiError(
        404,
        f"no stored response '{response_id}' (it was not stored, was deleted, or belongs to "
        "another API key)",
        param=param,
        code="response_not_found",
    )


def _store_failed(exc: StoreError) -> ApiError:
    return ApiError(503, f"stored responses: {exc}", type="server_error", code="store_unavailable")


def _owner(request: Request) -> str:
    """Whose stored responses a request may see: its API key's (a cache salt splits a
    key's cache, not what it owns)."""
    return namespaces.owner(key_namespace(request))


async def _history(request: Request, body: ResponsesRequest) -> tuple[dict[str, Any], ...]:
    """The conversation ``previous_response_id`` continues (its input and its output)."""
    if body.previous_response_id is None:
        return ()
    store = server_of(request).responses
    try:
        stored = await asyncio.to_thread(store.get, body.previous_response_id, _owner(request))
    except StoreError as exc:
        raise _store_failed(exc) from None
    if stored is None:
        raise _not_found(body.previous_response_id, "previous_response_id")
    return stored.continued()


async def _keep(request: Request, call: ResponsesCall, builder: ResponseBuilder) -> None:
    """Store the finished response (when asked): a store that fails costs the continuation,
    never the answer (one line in the log)."""
    if not call.store or builder.final is None or builder.final["status"] == "failed":
        return
    store = server_of(request).responses
    try:
        await asyncio.to_thread(store.put, _owner(request), builder.final, call.history)
    except StoreError as exc:
        log.warning("response %s not stored: %s", builder.id, exc)


@router.post("/v1/responses", summary="Create a response (OpenAI Responses API)")
async def create_response(
    body: ResponsesRequest,
    request: Request,
    session: SessionHeader = None,
    priority: PriorityHeader = None,
) -> Response:
    arrived = time.monotonic()
    api = server_of(request)
    card = api.model_card()
    history = await _history(request, body)
    call = await checked_call(
        request, body, to_call, card, session, key_namespace(request), priority, history
    )
    raw = await request.json()  # parsed once already (JsonRoute): the settings to echo
    builder = ResponseBuilder(call, card, {k: raw[k] for k in ECHOED if raw.get(k) is not None})
    handle = api.submit(call.request)
    events = EngineEvents(api, handle, request, arrived)
    try:
        if not call.stream:
            answer = await reply_whole(
                request,
                handle,
                events,
                True,
                lambda done: builder.full(done.text, done.stats, done.tool_calls, done.reasoning),
            )
            await _keep(request, call, builder)
        else:
            answer = await reply_stream(
                request,
                handle,
                events,
                True,
                lambda first: _stream(request, call, builder, first, events),
            )
    except ApiError as error:
        raise _about_input(error) from None
    return named(answer, call.request.cache_namespace)


def _about_input(error: ApiError) -> ApiError:
    """An engine error about the prompt names this body's field (``input``), not the chat
    API's (``messages``)."""
    if error.param != "messages":
        return error
    return ApiError(error.status, error.message, error.type, "input", error.code, error.headers)


async def _stream(
    request: Request,
    call: ResponsesCall,
    builder: ResponseBuilder,
    first: Event,
    events: EngineEvents,
) -> AsyncIterator[bytes]:
    """The response's events (:mod:`core.api.responses_reply`); an engine error after the
    start is a ``response.failed`` event."""
    try:
        for body in builder.start():
            yield sse(body, body["type"])
        event: Event | None = first
        while event is not None:
            out: list[dict[str, Any]] = []
            if isinstance(event, TokenEvent) and event.text:
                out = builder.text(event.text)
            elif isinstance(event, ReasoningEvent) and event.text:
                out = builder.reasoning(event.text)
            elif isinstance(event, ToolCallEvent):
                out = builder.tool_call(event.call)
            elif isinstance(event, ErrorEvent):
                out = builder.failed(engine_error(event, chat=True))
            elif isinstance(event, DoneEvent):
                if event.stats.finish_reason == "cancelled":  # the server is stopping
                    out = builder.failed(shutting_down())
                else:
                    out = builder.finish(event.stats)
                    await _keep(request, call, builder)
            for body in out:
                yield sse(body, body["type"])
            if isinstance(event, (ErrorEvent, DoneEvent)):
                return
            event = await anext(events, None)
    finally:
        events.handle.cancel()


@router.get("/v1/responses/{response_id}", summary="A stored response (OpenAI Responses API)")
async def get_response(response_id: str, request: Request) -> JSONResponse:
    try:
        stored = await asyncio.to_thread(
            server_of(request).responses.get, response_id, _owner(request)
        )
    except StoreError as exc:
        raise _store_failed(exc) from None
    if stored is None:
        raise _not_found(response_id)
    return JSONResponse(stored.response)


@router.delete("/v1/responses/{response_id}", summary="Delete a stored response")
async def delete_response(response_id: str, request: Request) -> JSONResponse:
    try:
        deleted = await asyncio.to_thread(
            server_of(request).responses.delete, response_id, _owner(request)
        )
    except StoreError as exc:
        raise _store_failed(exc) from None
    if not deleted:
        raise _not_found(response_id)
    return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})
