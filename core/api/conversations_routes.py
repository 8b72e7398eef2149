"""The OpenAI Conversations endpoints: ``POST /v1/conversations``, ``GET``, ``POST``
(metadata) and ``DELETE /v1/conversations/{id}``, and its items: ``GET`` and ``POST
/v1/conversations/{id}/items``, ``GET`` and ``DELETE /v1/conversations/{id}/items/{item}``.

A conversation is kept with the stored responses (:mod:`core.api.responses_store`): the
same owner (another API key's requests get a 404, as for an id never seen) and the same
per-key share of the store's budget. ``POST /v1/responses`` with ``conversation`` renders
its items before the new input, and adds the input and output items after the answer, so
each turn's prompt extends the last one's: a cache hit. Wire format:
:mod:`core.api.conversations_schema`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse

from core.api.conversations_schema import (
    ConversationCreate,
    ConversationUpdate,
    ItemsCreate,
    conversation_items,
    item_list,
)
from core.api.responses_room import Refusal
from core.api.responses_routes import owner_of, refused, stored
from core.api.routing import JsonRoute, server_of

router = APIRouter(route_class=JsonRoute)
MAX_PAGE = 100  # items a page lists at most (OpenAI's)


@router.post("/v1/conversations", summary="Create a conversation (OpenAI Conversations API)")
async def create_conversation(body: ConversationCreate, request: Request) -> JSONResponse:
    items = conversation_items(body.items or [])
    made = await stored(
        request,
        server_of(request).responses.create_conversation,
        owner_of(request),
        body.metadata or {},
        items,
    )
    if isinstance(made, Refusal):
        raise refused(made, "items")
    return JSONResponse(made)


@router.get("/v1/conversations/{conversation_id}", summary="A conversation")
async def get_conversation(conversation_id: str, request: Request) -> JSONResponse:
    store = server_of(request).responses
    return JSONResponse(
        await stored(request, store.conversation, conversation_id, owner_of(request))
    )


@router.post("/v1/conversations/{conversation_id}", summary="Update a conversation's metadata")
async def update_conversation(
    conversation_id: str, body: ConversationUpdate, request: Request
) -> JSONResponse:
    store = server_of(request).responses
    return JSONResponse(
        await stored(
            request, store.update_conversation, conversation_id, owner_of(request), body.metadata
        )
    )


@router.delete("/v1/conversations/{conversation_id}", summary="Delete a conversation")
async def delete_conversation(conversation_id: str, request: Request) -> JSONResponse:
    store = server_of(request).responses
    await stored(request, store.delete_conversation, conversation_id, owner_of(request))
    return JSONResponse({"id": conversation_id, "object": "conversation.deleted", "deleted": True})


@router.get("/v1/conversations/{conversation_id}/items", summary="A conversation's items")
async def list_items(
    conversation_id: str,
    request: Request,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 20,
    order: Literal["asc", "desc"] = "desc",
    include: Annotated[list[str] | None, Query(description="accepted and ignored")] = None,
) -> JSONResponse:
    store = server_of(request).responses
    page = await stored(
        request,
        store.list_items,
        conversation_id,
        owner_of(request),
        after,
        limit,
        order == "asc",
    )
    return JSONResponse(item_list(page.items, page.has_more))


@router.post("/v1/conversations/{conversation_id}/items", summary="Add items to a conversation")
async def add_items(conversation_id: str, body: ItemsCreate, request: Request) -> JSONResponse:
    items = conversation_items(body.items)
    store = server_of(request).responses
    refusal = await stored(request, store.add_items, conversation_id, owner_of(request), items)
    if refusal is not None:
        raise refused(refusal, "items")
    return JSONResponse(item_list(items))


@router.get("/v1/conversations/{conversation_id}/items/{item_id}", summary="One item")
async def get_item(conversation_id: str, item_id: str, request: Request) -> JSONResponse:
    store = server_of(request).responses
    return JSONResponse(
        await stored(request, store.item, conversation_id, owner_of(request), item_id)
    )


@router.delete("/v1/conversations/{conversation_id}/items/{item_id}", summary="Delete an item")
async def delete_item(conversation_id: str, item_id: str, request: Request) -> JSONResponse:
    store = server_of(request).responses
    return JSONResponse(
        await stored(request, store.delete_item, conversation_id, owner_of(request), item_id)
    )
