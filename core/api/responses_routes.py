"""The OpenAI Responses endpoints: ``POST /v1/responses`` (JSON, or its stream of events),
``GET`` and ``DELETE /v1/responses/{id}``; and what the conversations' routes
(:mod:`core.api.conversations_routes`) share with them: the owner, the store's errors.

A request goes through what the other dialects' requests do (:func:`checked_call`, the
engine, :mod:`core.api.relay`), in the cache namespace of its API key and with its
priority; its wire format is :mod:`core.api.responses_schema` (in) and
:mod:`core.api.responses_reply` (out). A response asked to be stored (``store``, the
default) is kept in :mod:`core.api.responses_store` before its last event is sent, so a
client that continues it at once (``previous_response_id``) finds it; a response made in
a ``conversation`` adds its input and output items to it the same way. What is stored
belongs to its API key: another key's requests get a 404, as for an id never seen. A
response that could never be stored (past the store's caps) is a 413 before the model
runs; one the store finds no room for after it ran is answered with ``store: false``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from core.api.conversations_schema import conversation_items
from core.api.errors import ApiError, invalid
from core.api.generation import ReplyWriter, run_generation
from core.api.relay import sse
from core.api.responses_reply import ResponseBuilder
from core.api.responses_room import Refusal
from core.api.responses_schema import STORED_ITEMS, ResponsesCall, ResponsesRequest, to_call
from core.api.responses_store import History, Missing, ResponseStore, Saved, Turn
from core.api.responses_tables import ROW_BYTES, dump, utf8_bytes
from core.api.routing import (
    JsonRoute,
    PriorityHeader,
    SessionHeader,
    checked_call,
    key_namespace,
    server_of,
)
from core.engine import namespaces
from core.engine.types import DoneEvent, Event, ToolCall
from core.errors import StoreError

log = logging.getLogger(__name__)
router = APIRouter(route_class=JsonRoute)
ECHOED = ("tools", "tool_choice", "text")  # a response repeats these of its request as sent
T = TypeVar("T")


def _not_found(response_id: str, param: str | None = None) -> ApiError:
    return ApiError(
        404,
        f"no stored response '{response_id}' (it was not stored, was deleted, or belongs to "
        "another API key)",
        param=param,
        code="response_not_found",
    )


def store_failed(exc: StoreError) -> ApiError:
    return ApiError(503, f"stored responses: {exc}", type="server_error", code="store_unavailable")


def refused(refusal: Refusal, param: str | None = None) -> ApiError:
    """A write the store found no room for: 507 when the disk is nearly full, else 413."""
    if refusal.kind == "disk":
        return ApiError(507, refusal.message, type="server_error", code="insufficient_storage")
    if refusal.kind == "gone":
        return ApiError(404, refusal.message, param=param, code="not_found")
    return ApiError(413, refusal.message, param=param, code="stored_too_large")


def owner_of(request: Request) -> str:
    """Whose stored responses and conversations a request may see: its API key's (a cache
    salt splits a key's cache, not what it owns)."""
    return namespaces.owner(key_namespace(request))


async def stored(
    request: Request, work: Callable[..., T], *args: Any, param: str | None = None
) -> T:
    """``work(*args)``, a call of the store, on a worker thread: a store that cannot be used
    is a 503, something missing a 404 naming it."""
    try:
        return await asyncio.to_thread(work, *args)
    except StoreError as exc:
        raise store_failed(exc) from None
    except Missing as missing:
        raise ApiError(404, str(missing), param=param, code="not_found") from None


async def _history(request: Request, body: ResponsesRequest) -> History:
    """What the request continues: the chain of its ``previous_response_id``, or the items of
    its ``conversation``."""
    store = server_of(request).responses
    conversation = body.conversation_id
    if body.previous_response_id is None:
        if conversation is None:
            return History((), 0)
        return await stored(
            request, store.conversation_items, conversation, owner_of(request), param="conversation"
        )
    if conversation is not None:
        raise invalid(
            "conversation",
            "send 'previous_response_id' or 'conversation', not both",
            code="invalid_value",
        )
    history = await stored(request, store.history, body.previous_response_id, owner_of(request))
    if history is None:
        raise _not_found(body.previous_response_id, "previous_response_id")
    if history.conversation is not None:
        raise invalid(
            "previous_response_id",
            f"response '{body.previous_response_id}' was made in conversation "
            f"'{history.conversation}': continue that conversation ('conversation')",
        )
    return history


def _check_room(
    store: ResponseStore,
    call: ResponsesCall,
    builder: ResponseBuilder,
    history: History,
    own: list[dict[str, Any]],
) -> None:
    """Before the model runs: a response that could never be stored is a 413 (its input
    and response object past what one stored response may take, or the conversation it
    extends past the key's share), rather than an answer the next turn cannot continue."""
    conversation = call.body.conversation_id
    if not call.store and conversation is None:
        return
    size = ROW_BYTES + utf8_bytes(dump(own)) + utf8_bytes(dump(builder.response("in_progress")))
    budget = store.budget
    if size > budget.item_bytes:
        raise ApiError(
            413,
            f"this response with its input is {size:,} bytes; one stored response may take "
            f"{budget.item_bytes:,} (send 'store': false, or less)",
            param="input",
            code="stored_too_large",
        )
    if history.bytes + size > budget.owner_bytes:
        param = "conversation" if conversation is not None else "previous_response_id"
        raise ApiError(
            413,
            f"the conversation with this response is {history.bytes + size:,} bytes; this "
            f"API key's stored responses and conversations may take {budget.owner_bytes:,} "
            "(start a new conversation, or send 'store': false and the whole conversation)",
            param=param,
            code="conversation_too_large",
        )


async def _keep(
    request: Request, call: ResponsesCall, builder: ResponseBuilder, own: list[dict[str, Any]]
) -> None:
    """Store the finished response (when asked) and, in a conversation, its items: a store
    that fails costs the continuation, never the answer (which then says ``store: false``;
    one line in the log)."""
    final = builder.final
    conversation = call.body.conversation_id
    if final is None or final["status"] == "failed" or not (call.store or conversation):
        return
    turn = Turn(
        final if call.store else None,
        own,
        final["output"],
        call.body.previous_response_id,
        conversation,
    )
    try:
        saved = await asyncio.to_thread(server_of(request).responses.put, owner_of(request), turn)
    except StoreError as exc:
        saved = Saved(Refusal("store", str(exc)))
    if not saved.stored:
        log.warning("response %s not stored: %s", builder.id, saved.refusal.message)
        final["store"] = False


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
        request, body, to_call, card, session, key_namespace(request), priority, history.items
    )
    raw = await request.json()  # parsed once already (JsonRoute): the settings to echo
    builder = ResponseBuilder(call, card, {k: raw[k] for k in ECHOED if raw.get(k) is not None})
    own = list(call.input)
    if body.conversation_id is not None:  # its items get ids in the conversation
        own = conversation_items(STORED_ITEMS.validate_python(own))
    _check_room(api.responses, call, builder, history, own)
    writer = ResponseWriter(request, call, builder, own)
    try:
        return await run_generation(request, call.request, writer, arrived, call.stream)
    except ApiError as error:
        raise _about_input(error) from None


def _about_input(error: ApiError) -> ApiError:
    """An engine error about the prompt names this body's field (``input``), not the chat
    API's (``messages``)."""
    if error.param != "messages":
        return error
    return ApiError(error.status, error.message, error.type, "input", error.code, error.headers)


class ResponseWriter(ReplyWriter):
    """The response object, or its events (:mod:`core.api.responses_reply`); an engine
    error after the start is a ``response.failed`` event. The finished response is kept
    (:func:`_keep`) before it is answered, or its last event sent."""

    def __init__(
        self,
        request: Request,
        call: ResponsesCall,
        builder: ResponseBuilder,
        own: list[dict[str, Any]],
    ):
        self.request, self.call, self.builder, self.own = request, call, builder, own

    async def whole(self, done: DoneEvent) -> dict[str, Any]:
        self.builder.full(done.text, done.stats, done.tool_calls, done.reasoning)
        await _keep(self.request, self.call, self.builder, self.own)
        return self.builder.final  # as kept (store: false if it was not)

    def opening(self, first: Event) -> list[bytes]:
        return self._sse(self.builder.start())

    def token(self, text: str) -> list[bytes]:
        return self._sse(self.builder.text(text)) if text else []

    def reasoning(self, text: str) -> list[bytes]:
        return self._sse(self.builder.reasoning(text)) if text else []

    def tool_call(self, call: ToolCall) -> list[bytes]:
        return self._sse(self.builder.tool_call(call))

    async def finished(self, done: DoneEvent) -> list[bytes]:
        events = self.builder.finish(done.stats)
        await _keep(self.request, self.call, self.builder, self.own)  # before it is sent
        return self._sse(events)

    def failed(self, error: ApiError) -> list[bytes]:
        return self._sse(self.builder.failed(error))

    @staticmethod
    def _sse(bodies: list[dict[str, Any]]) -> list[bytes]:
        return [sse(body, body["type"]) for body in bodies]


@router.get("/v1/responses/{response_id}", summary="A stored response (OpenAI Responses API)")
async def get_response(response_id: str, request: Request) -> JSONResponse:
    response = await stored(
        request, server_of(request).responses.get, response_id, owner_of(request)
    )
    if response is None:
        raise _not_found(response_id)
    return JSONResponse(response)


@router.delete("/v1/responses/{response_id}", summary="Delete a stored response")
async def delete_response(response_id: str, request: Request) -> JSONResponse:
    deleted = await stored(
        request, server_of(request).responses.delete, response_id, owner_of(request)
    )
    if not deleted:
        raise _not_found(response_id)
    return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})
