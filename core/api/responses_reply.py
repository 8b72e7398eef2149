"""The OpenAI Responses wire format out: the response object, its output items and the
stream's events (:class:`ResponseBuilder`).

A stream is the event sequence the ``openai`` package (and Codex) parse, each event with
its ``sequence_number``::

    response.created, response.in_progress
    per thinking:   response.output_item.added (a reasoning item), response.content_part.added
                    (reasoning_text), response.reasoning_text.delta...,
                    response.reasoning_text.done, response.content_part.done,
                    response.output_item.done
    per text:       response.output_item.added (a message), response.content_part.added,
                    response.output_text.delta..., response.output_text.done,
                    response.content_part.done, response.output_item.done
    per tool call:  response.output_item.added, response.function_call_arguments.delta,
                    response.function_call_arguments.done, response.output_item.done
                    (a custom tool: response.custom_tool_call_input.delta / .done)
    at the end:     response.completed (or response.incomplete: max_output_tokens),
                    or response.failed with the error

The answer without ``stream`` is the final response object of the same builder. No HTTP
and no engine here.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from core.api.errors import ApiError
from core.api.openai_schema import usage_extra
from core.api.responses_schema import CUSTOM_INPUT, ResponsesCall
from core.api.wire import ModelCard
from core.engine.types import RequestStats, ToolCall


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def usage(stats: RequestStats) -> dict[str, Any]:
    return {
        "input_tokens": stats.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": stats.cached_tokens + stats.restored_tokens,
            "cache_write_tokens": 0,  # the cache is written as a side effect: nothing to bill
        },
        "output_tokens": stats.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": stats.reasoning_tokens},
        "total_tokens": stats.prompt_tokens + stats.completion_tokens,
        **usage_extra(stats),
    }


def failure_code(error: ApiError) -> str:
    """The response's ``error.code`` (the Responses API has a closed list of them)."""
    return "server_error" if error.status >= 500 else "invalid_prompt"


class ResponseBuilder:
    """The response object and stream events of one reply, all with the same id.

    ``echo``: the body's own ``tools``, ``tool_choice`` and ``text`` as it sent them (a
    response echoes its request's settings)."""

    def __init__(self, call: ResponsesCall, card: ModelCard, echo: dict[str, Any]):
        self.call = call
        self.id = new_id("resp")
        self.created_at = int(time.time())
        self.model = card.id
        self.echo = echo
        self.output: list[dict[str, Any]] = []
        self.sequence = 0
        self._open: dict[str, Any] | None = None  # the message or reasoning item being written
        self.final: dict[str, Any] | None = None  # the response once it ended

    # ------------------------------------------------------------ objects
    def response(
        self,
        status: str,
        stats: RequestStats | None = None,
        error: ApiError | None = None,
    ) -> dict[str, Any]:
        body = self.call.body
        incomplete = status == "incomplete"
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "completed_at": int(time.time()) if status == "completed" else None,
            "error": (
                {"code": failure_code(error), "message": error.message}
                if error is not None
                else None
            ),
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "model": self.model,
            "output": list(self.output),
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id,
            "conversation": {"id": body.conversation_id} if body.conversation_id else None,
            "reasoning": {
                "effort": body.reasoning.effort if body.reasoning is not None else None,
                "summary": None,
            },
            "store": self.call.store,
            "temperature": 1.0 if body.temperature is None else body.temperature,
            "text": self.echo.get("text") or {"format": {"type": "text"}},
            "tool_choice": self.echo.get("tool_choice") or "auto",
            "tools": self.echo.get("tools") or [],
            "top_p": 1.0 if body.top_p is None else body.top_p,
            "truncation": body.truncation or "disabled",
            "usage": usage(stats) if stats is not None else None,
            "user": body.user,
            "metadata": body.metadata or {},
        }

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def _item_event(self, kind: str, item: dict[str, Any]) -> dict[str, Any]:
        return self._event(kind, output_index=self.output.index(item), item=dict(item))

    # ------------------------------------------------------------ events
    def start(self) -> list[dict[str, Any]]:
        response = self.response("in_progress")
        return [
            self._event("response.created", response=response),
            self._event("response.in_progress", response=response),
        ]

    def text(self, piece: str) -> list[dict[str, Any]]:
        """Events for a piece of the answer (a message item, opened by its first piece)."""
        return self._piece("message", piece)

    def reasoning(self, piece: str) -> list[dict[str, Any]]:
        """Events for a piece of the thinking (a reasoning item, opened by its first piece)."""
        return self._piece("reasoning", piece)

    def _piece(self, kind: str, piece: str) -> list[dict[str, Any]]:
        events = []
        if self._open is not None and self._open["type"] != kind:
            events += self._close()
        if self._open is None:
            item: dict[str, Any] = (
                {"id": new_id("msg"), "type": "message", "role": "assistant"}
                if kind == "message"
                else {"id": new_id("rs"), "type": "reasoning", "summary": []}
            )
            item |= {"status": "in_progress", "content": []}
            self._open = item
            self.output.append(item)
            events += [
                self._item_event("response.output_item.added", item),
                self._event(
                    "response.content_part.added", part=self._part(kind, ""), **self._where(item)
                ),
            ]
            item["content"] = [self._part(kind, "")]
        item = self._open
        item["content"][0]["text"] += piece
        delta = (
            "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
        )
        logprobs = {"logprobs": []} if kind == "message" else {}
        events.append(self._event(delta, delta=piece, **logprobs, **self._where(item)))
        return events

    @staticmethod
    def _part(kind: str, text: str) -> dict[str, Any]:
        if kind == "reasoning":
            return {"type": "reasoning_text", "text": text}
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def _where(self, item: dict[str, Any]) -> dict[str, Any]:
        where = {"item_id": item["id"], "output_index": self.output.index(item)}
        return {**where, "content_index": 0} if item["type"] in ("message", "reasoning") else where

    def _close(self, status: str = "completed") -> list[dict[str, Any]]:
        """Events closing the message or reasoning item being written (none if none is)."""
        item, self._open = self._open, None
        if item is None:
            return []
        kind = item["type"]
        text = item["content"][0]["text"]
        item["status"] = status
        done = "response.output_text.done" if kind == "message" else "response.reasoning_text.done"
        logprobs = {"logprobs": []} if kind == "message" else {}
        return [
            self._event(done, text=text, **logprobs, **self._where(item)),
            self._event(
                "response.content_part.done", part=self._part(kind, text), **self._where(item)
            ),
            self._item_event("response.output_item.done", item),
        ]

    def tool_call(self, call: ToolCall) -> list[dict[str, Any]]:
        events = self._close()
        tools = self.call.tools
        custom = call.name in tools.custom
        item: dict[str, Any] = (
            {"id": new_id("ctc"), "type": "custom_tool_call", "call_id": call.id}
            | {"name": call.name, "input": ""}
            if custom
            else {"id": new_id("fc"), "type": "function_call", "call_id": call.id}
            | {"name": call.name, "arguments": "", "status": "in_progress"}
        )
        if call.name in tools.namespaces:
            item["namespace"] = tools.namespaces[call.name]
        self.output.append(item)
        events.append(self._item_event("response.output_item.added", item))
        if custom:
            item["input"] = custom_input(call.arguments)
            events += [
                self._event(
                    "response.custom_tool_call_input.delta",
                    delta=item["input"],
                    **self._where(item),
                ),
                self._event(
                    "response.custom_tool_call_input.done", input=item["input"], **self._where(item)
                ),
            ]
        else:
            item["arguments"], item["status"] = call.arguments, "completed"
            events += [
                self._event(
                    "response.function_call_arguments.delta",
                    delta=call.arguments,
                    **self._where(item),
                ),
                self._event(
                    "response.function_call_arguments.done",
                    arguments=call.arguments,
                    **self._where(item),
                ),
            ]
        events.append(self._item_event("response.output_item.done", item))
        return events

    def finish(self, stats: RequestStats) -> list[dict[str, Any]]:
        """The end: the open message closed, then response.completed (or .incomplete)."""
        incomplete = stats.finish_reason == "length"
        events = self._close("incomplete" if incomplete else "completed")
        self.final = self.response("incomplete" if incomplete else "completed", stats)
        kind = "response.incomplete" if incomplete else "response.completed"
        return [*events, self._event(kind, response=self.final)]

    def failed(self, error: ApiError) -> list[dict[str, Any]]:
        self._close("incomplete")
        self.final = self.response("failed", error=error)
        return [self._event("response.failed", response=self.final)]

    def full(
        self,
        text: str,
        stats: RequestStats,
        calls: tuple[ToolCall, ...] = (),
        reasoning: str = "",
    ) -> dict:
        """The response object of a reply that is not streamed."""
        if reasoning:
            self.reasoning(reasoning)
        if text:
            self.text(text)
        for call in calls:
            self.tool_call(call)
        self.finish(stats)
        return self.final


def custom_input(arguments: str) -> str:
    """A custom tool's input, out of the model's call of its function (``{"input": ...}``);
    the text as it is when it is not that shape (nothing lost)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(value, dict) and isinstance(value.get(CUSTOM_INPUT), str):
        return value[CUSTOM_INPUT]
    return arguments
