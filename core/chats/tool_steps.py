"""A reply's tool loop, as a chat keeps it and as the engine is asked it.

A reply that used tools is one assistant message: its ``content`` is the final answer,
and its ``tool_steps`` the loop before it, oldest first. Each step is a plain dict::

    {"content": "text the model wrote before its calls (may be empty)",
     "reasoning": "its thinking (optional)",
     "tool_calls": [{"id", "name", "arguments" (JSON text), "server", "tool"}],
     "results": [{"id", "status": "ok" | "error" | "denied" | "cancelled",
                  "parts": [{"type": "text", "text"} | {"type": "image", "mime", "data"}]}],
     "stats": the engine's figures for the request that made the calls (optional)}

``name`` is the name the model called; ``server`` and ``tool`` (optional) say which MCP
server's tool that was. An image's ``data`` is base64. Only calls and results are kept:
nothing of a server's configuration (its command, environment, headers) has a place here,
and :func:`checked` drops any key it does not know.

To the engine (:func:`expand`, :func:`loop_messages`), a step is an assistant message with
its calls, then one ``tool`` message per call, in the order of the calls: the text parts of
its result joined (an image as ``[image: MIME, N bytes]``), a denied call's
:data:`DENIED`, a cancelled one's :data:`CANCELLED` (a call with no result counts as
cancelled), a failed one's error text. So the prompt of each step of a running loop is the
previous step's prompt plus that step's calls and results, and the reply's final prompt
the last step's plus its answer: each step is a prefix-cache hit.

No mlx and no Qt here.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable

from core.engine.types import ChatMessage, ToolCall

STATUSES = ("ok", "error", "denied", "cancelled")
DENIED = "The user denied this tool call."
CANCELLED = "The tool call was cancelled."
FAILED = "The tool call failed."  # an error result that says nothing itself
CALL_KEYS = ("id", "name", "arguments")  # the texts every call has
CALL_SOURCE_KEYS = ("server", "tool")  # which MCP server's tool it was (optional)


class StepError(ValueError):
    """A tool step that is not one: the message says what is wrong, in one line."""


def checked(steps: object) -> tuple[dict, ...]:
    """``steps`` as the store keeps them (known keys only, in a fixed shape), or StepError
    saying, in one line, which step is wrong and how. ``None`` is no steps."""
    if steps is None:
        return ()
    if isinstance(steps, (str, bytes, dict)) or not isinstance(steps, Iterable):
        raise StepError("tool steps are not a list of steps")
    return tuple(_step(number, step) for number, step in enumerate(steps, 1))


def to_json(steps: tuple[dict, ...]) -> str | None:
    """The stored column's text: None for a plain reply (no steps)."""
    return json.dumps(list(steps), ensure_ascii=False) if steps else None


def from_json(text: str | None) -> tuple[dict, ...]:
    """The steps a stored column holds; StepError when it does not read back as steps."""
    if not text:
        return ()
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        raise StepError("tool steps are not JSON") from None
    if not isinstance(value, list):
        raise StepError("tool steps are not a list of steps")
    return checked(value)


def result_text(result: dict | None) -> str:
    """What the model is told a call gave: its text parts joined (an image as a short
    placeholder), or the words for a denied or cancelled call (no result: cancelled)."""
    if result is None or result["status"] == "cancelled":
        return CANCELLED
    if result["status"] == "denied":
        return DENIED
    text = "\n".join(_part_text(part) for part in result["parts"])
    if result["status"] == "error" and not text:
        return FAILED
    return text


def image_bytes(part: dict) -> int:
    """How many bytes an image part's base64 ``data`` decodes to."""
    data = part["data"].strip()
    return len(data) * 3 // 4 - len(data) + len(data.rstrip("="))


def step_messages(step: dict) -> tuple[ChatMessage, ...]:
    """One step to the engine: the assistant message with its calls, then each call's
    result as a ``tool`` message, in the order of the calls."""
    calls = tuple(ToolCall(c["id"], c["name"], c["arguments"]) for c in step["tool_calls"])
    results = {r["id"]: r for r in step["results"]}
    return (
        ChatMessage("assistant", step["content"], calls, reasoning=step.get("reasoning") or ""),
        *(
            ChatMessage("tool", result_text(results.get(c.id)), tool_call_id=c.id, name=c.name)
            for c in calls
        ),
    )


def loop_messages(
    messages: Iterable[ChatMessage], steps: Iterable[dict]
) -> tuple[ChatMessage, ...]:
    """The prompt of the next step of a running loop: ``messages`` (the turn's history and
    its user message) and the ``steps`` made so far (each as :func:`step_messages`)."""
    out = tuple(messages)
    for step in steps:
        out += step_messages(step)
    return out


def expand(
    role: str, content: str, reasoning: str | None = None, steps: Iterable[dict] = ()
) -> tuple[ChatMessage, ...]:
    """A stored message to the engine. A reply with tool steps becomes its steps
    (:func:`step_messages`) and then its final answer (left out when the loop ended with no
    answer and no thinking: a loop stopped at its step limit, or cancelled); any other
    message is itself."""
    steps = tuple(steps)
    final = ChatMessage(role, content, reasoning=reasoning or "")
    if not steps:
        return (final,)
    return loop_messages((), steps) + ((final,) if content or reasoning else ())


# -- checking one step --


def _step(number: int, step: object) -> dict:
    where = f"tool step {number}"
    if not isinstance(step, dict):
        raise StepError(f"{where} is not an object")
    content = step.get("content", "")
    if not isinstance(content, str):
        raise StepError(f"{where}: its content is not text")
    reasoning = step.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, str):
        raise StepError(f"{where}: its reasoning is not text")
    calls = step.get("tool_calls")
    if not isinstance(calls, list) or not calls:
        raise StepError(f"{where}: its tool_calls are not a list of calls")
    calls = [_call(where, i, call) for i, call in enumerate(calls, 1)]
    ids = [call["id"] for call in calls]
    if len(set(ids)) != len(ids):
        raise StepError(f"{where}: two of its calls have the same id")
    results = step.get("results", [])
    if not isinstance(results, list):
        raise StepError(f"{where}: its results are not a list")
    results = [_result(where, i, result, ids) for i, result in enumerate(results, 1)]
    if len({r["id"] for r in results}) != len(results):
        raise StepError(f"{where}: two results answer the same call")
    stats = step.get("stats")
    if stats is not None and not isinstance(stats, dict):
        raise StepError(f"{where}: its stats are not an object")
    out = {"content": content, "tool_calls": calls, "results": results}
    if reasoning:
        out["reasoning"] = reasoning
    if stats is not None:
        out["stats"] = dict(stats)
    return out


def _call(where: str, number: int, call: object) -> dict:
    where = f"{where}, call {number}"
    if not isinstance(call, dict):
        raise StepError(f"{where} is not an object")
    for key in CALL_KEYS:
        if not isinstance(call.get(key), str) or (key != "arguments" and not call[key]):
            raise StepError(f"{where}: its {key} is not text")
    out = {key: call[key] for key in CALL_KEYS}
    for key in CALL_SOURCE_KEYS:
        value = call.get(key)
        if value is not None and not isinstance(value, str):
            raise StepError(f"{where}: its {key} is not text")
        out[key] = value
    return out


def _result(where: str, number: int, result: object, ids: list[str]) -> dict:
    where = f"{where}, result {number}"
    if not isinstance(result, dict):
        raise StepError(f"{where} is not an object")
    if result.get("id") not in ids:
        raise StepError(f"{where} answers no call of its step")
    if result.get("status") not in STATUSES:
        raise StepError(f"{where}: its status is not one of {', '.join(STATUSES)}")
    parts = result.get("parts", [])
    if not isinstance(parts, list):
        raise StepError(f"{where}: its parts are not a list")
    return {
        "id": result["id"],
        "status": result["status"],
        "parts": [_part(where, i, part) for i, part in enumerate(parts, 1)],
    }


def _part(where: str, number: int, part: object) -> dict:
    where = f"{where}, part {number}"
    if not isinstance(part, dict) or part.get("type") not in ("text", "image"):
        raise StepError(f"{where} is neither a text nor an image")
    if part["type"] == "text":
        if not isinstance(part.get("text"), str):
            raise StepError(f"{where}: its text is not text")
        return {"type": "text", "text": part["text"]}
    mime, data = part.get("mime"), part.get("data")
    if not isinstance(mime, str) or not mime:
        raise StepError(f"{where}: an image without its MIME type")
    if not isinstance(data, str):
        raise StepError(f"{where}: an image without its base64 data")
    try:
        base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise StepError(f"{where}: its image data is not base64") from None
    return {"type": "image", "mime": mime, "data": data}


def _part_text(part: dict) -> str:
    if part["type"] == "text":
        return part["text"]
    return f"[image: {part['mime']}, {image_bytes(part)} bytes]"
