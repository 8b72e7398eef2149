"""The OpenAI Conversations wire format: the bodies of ``/v1/conversations`` (pydantic
models) and conversation items as the API answers them.

A conversation item is an input item of the Responses API (:data:`InputItem`) with an
``id`` and a ``status``, its text content as a list of parts (``input_text``, or
``output_text`` for the assistant), the shape ``client.conversations.items.list()``
parses. Items added to a conversation always get a new id; a response's output items keep
theirs. No HTTP and no store here.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from core.api.responses_reply import new_id
from core.api.responses_schema import (
    CustomToolCallItem,
    InputItem,
    MessageItem,
    Metadata,
    ReasoningItem,
    item_dicts,
)
from core.api.wire import WireModel

MAX_ITEMS_A_CALL = 20  # OpenAI's: items in one create or add call
ID_PREFIX = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "custom_tool_call": "ctc",
    "custom_tool_call_output": "ctco",
    "reasoning": "rs",
}


class ConversationCreate(WireModel):
    """``POST /v1/conversations``."""

    items: list[InputItem] | None = Field(
        None, max_length=MAX_ITEMS_A_CALL, description="the conversation's first items"
    )
    metadata: Metadata | None = None


class ConversationUpdate(WireModel):
    """``POST /v1/conversations/{id}``."""

    metadata: Metadata


class ItemsCreate(WireModel):
    """``POST /v1/conversations/{id}/items``."""

    items: list[InputItem] = Field(min_length=1, max_length=MAX_ITEMS_A_CALL)


def conversation_items(items: list) -> list[dict[str, Any]]:
    """Validated input items as a conversation holds them (each with a new id)."""
    out = []
    for item, plain in zip(items, item_dicts(items), strict=True):
        plain["id"] = new_id(ID_PREFIX[plain.get("type", "message")])
        if isinstance(item, MessageItem):
            plain["type"] = "message"
            if isinstance(item.content, str):
                kind = "output_text" if item.role == "assistant" else "input_text"
                plain["content"] = [{"type": kind, "text": item.content}]
            for part in plain["content"]:
                if part["type"] == "output_text":  # as a response's output has them
                    part["annotations"] = []
            plain["status"] = "completed"
        elif isinstance(item, ReasoningItem):
            plain["summary"] = []
        elif not isinstance(item, CustomToolCallItem):  # (a custom tool call has no status)
            plain["status"] = "completed"
        out.append(plain)
    return out


def item_list(items: list[dict[str, Any]], has_more: bool = False) -> dict[str, Any]:
    """A page of items as the API lists them."""
    return {
        "object": "list",
        "data": items,
        "first_id": items[0]["id"] if items else None,
        "last_id": items[-1]["id"] if items else None,
        "has_more": has_more,
    }
