"""Ollama's replies: the NDJSON lines of a streamed ``/api/chat`` or ``/api/generate`` reply
and the one object of a whole one, with Ollama's figures.

The last object says how the reply went, as Ollama reports it: ``done_reason`` (``stop``,
``length``; ``load`` / ``unload`` for a request that only loads), ``prompt_eval_count``
(the prompt tokens the model computed: what the prefix cache served is not counted, as
Ollama counts only what it evaluates), ``eval_count`` (reply tokens), and durations in
nanoseconds: ``total_duration`` (arrival to the end), ``load_duration`` (waiting before the
engine took the request on: the model is loaded already), ``prompt_eval_duration`` (to the
first reply token) and ``eval_duration`` (the rest). RadixChat's own figures sit beside them
in ``radixchat``: ``prompt_tokens`` (the whole prompt) and ``cached_tokens`` (what the cache
served, RAM and disk), then the usage extras every dialect has. A generate reply (not raw)
carries ``context``: the prompt's and reply's token ids, to send back with the next prompt.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import UTC, datetime
from typing import Any

from core.api.ollama_schema import OllamaCall
from core.api.openai_schema import usage_extra
from core.engine.types import DoneEvent, RequestStats, ToolCall

log = logging.getLogger(__name__)

NS = 1_000_000_000


def timestamp(at: float | None = None) -> str:
    """RFC 3339 in UTC, as Ollama writes ``created_at``."""
    moment = datetime.fromtimestamp(time.time() if at is None else at, UTC)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


def tool_call_object(call: ToolCall, index: int) -> dict[str, Any]:
    """A call as Ollama sends it: arguments as an object."""
    try:
        arguments = json.loads(call.arguments)
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):
        log.warning("a tool call's arguments are not a JSON object: %.80s", call.arguments)
        arguments = {}
    return {"id": call.id, "function": {"index": index, "name": call.name, "arguments": arguments}}


def figures(stats: RequestStats, arrived: float) -> dict[str, Any]:
    """The last object's counts and durations (nanoseconds), and RadixChat's cache figures."""
    total = max(0.0, time.monotonic() - arrived)
    extra = usage_extra(stats).get("radixchat", {})
    return {
        "total_duration": int(total * NS),
        "load_duration": int(max(0.0, total - stats.total_s) * NS),
        "prompt_eval_count": stats.computed_tokens,
        "prompt_eval_duration": int(stats.ttft_s * NS),
        "eval_count": stats.completion_tokens,
        "eval_duration": int(max(0.0, stats.total_s - stats.ttft_s) * NS),
        "radixchat": {
            "prompt_tokens": stats.prompt_tokens,
            "cached_tokens": stats.cached_tokens + stats.restored_tokens,
            **extra,
        },
    }


def done_reason(stats: RequestStats) -> str:
    return "length" if stats.finish_reason == "length" else "stop"


class OllamaReply:
    """The objects of one reply, all naming ``model``."""

    def __init__(self, call: OllamaCall, model: str, arrived: float):
        self.call, self.model, self.arrived = call, model, arrived
        self.calls_sent = 0

    def _object(self, text: str, thinking: str, calls: list[dict], done: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.model, "created_at": timestamp()}
        thinking = thinking if self.call.thinking else ""
        if self.call.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if thinking:
                message["thinking"] = thinking
            if calls:
                message["tool_calls"] = calls
            out["message"] = message
        else:
            out["response"] = text
            if thinking:
                out["thinking"] = thinking
        out["done"] = done
        return out

    def piece(self, text: str = "", thinking: str = "") -> dict[str, Any] | None:
        """A streamed line for a piece of the answer or of the thinking (None when there is
        nothing to send: thinking the request did not ask to see)."""
        if not text and not (thinking and self.call.thinking):
            return None
        return self._object(text, thinking, [], False)

    def tool_call(self, call: ToolCall) -> dict[str, Any]:
        self.calls_sent += 1
        return self._object("", "", [tool_call_object(call, self.calls_sent - 1)], False)

    def last(self, done: DoneEvent, whole: bool) -> dict[str, Any]:
        """The last object: the whole reply (``whole``) or nothing more, then the figures."""
        if whole:
            calls = [tool_call_object(call, i) for i, call in enumerate(done.tool_calls)]
            out = self._object(done.text, done.reasoning, calls, True)
        else:
            out = self._object("", "", [], True)
        out["done_reason"] = done_reason(done.stats)
        out.update(figures(done.stats, self.arrived))
        if self.call.context:
            out["context"] = [*done.prompt_tokens, *done.reply_tokens]
        return out

    def loading(self) -> dict[str, Any]:
        """The answer to a request that only loads (or unloads) the model."""
        out = self._object("", "", [], True)
        out["done_reason"] = self.call.loading
        return out


def ndjson(body: dict[str, Any]) -> bytes:
    return json.dumps(body, ensure_ascii=False).encode() + b"\n"
