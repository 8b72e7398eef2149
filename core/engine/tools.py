"""Tool calls: messages for the chat template, and the model's call markup out of its text.

The model writes a call between its template's markers (``<tool_call>`` ...
``</tool_call>`` for Hermes/Qwen-style templates); mlx-lm's tool parser for that template
turns the text between them into a name and arguments. :class:`ToolCallText` streams the
reply's text with that markup held back, so it never reaches a text event, and hands
each call over as soon as its end marker arrives.
"""

from __future__ import annotations

import json
import logging
import uuid

from core.engine.constrain import ToolMarkup
from core.engine.types import ChatMessage, ToolCall

log = logging.getLogger(__name__)


def template_message(message: ChatMessage) -> dict:
    """``message`` as chat templates expect it (Hugging Face's convention: a call's
    arguments as a mapping, a tool result with its call id and tool name, an assistant
    message's thinking as ``reasoning_content``, the name Qwen3's and DeepSeek's templates,
    llama.cpp and vLLM give it)."""
    out: dict = {"role": message.role, "content": message.content}
    if message.reasoning:
        out["reasoning_content"] = message.reasoning
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": _arguments(c.arguments)},
            }
            for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        out["name"] = message.name
    return out


def _arguments(text: str):
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, dict) else text


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def parse_calls(
    markup: ToolMarkup, text: str, tools, complete: bool = True
) -> list[ToolCall] | None:
    """The calls written in ``text`` (what was between the markers), None if it does not
    parse (the text is then shown as it is, nothing lost). ``complete``: the end marker
    came (a call cut short by max_tokens failing to parse is no surprise)."""
    try:
        parsed = markup.parse(text, list(tools))
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        (log.warning if complete else log.debug)(
            "a tool call did not parse (%s): %r", exc, text[:200]
        )
        return None
    calls = []
    for item in parsed if isinstance(parsed, list) else [parsed]:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return None
        arguments = item.get("arguments", {})
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        calls.append(ToolCall(str(item.get("id") or new_call_id()), item["name"], arguments))
    return calls


class ToolCallText:
    """Streams text with tool-call markup taken out. ``feed(piece)`` takes the next piece of
    the reply and returns the text safe to show and the calls completed by it; a tail
    that could still become the start marker is held back."""

    def __init__(self, markup: ToolMarkup, tools):
        self.markup = markup
        self.tools = tools
        self.pending = ""  # held back: a possible start of the marker, or an open call
        self.inside = False
        self.calls: list[ToolCall] = []
        self.unfinished: str | None = None  # an open call the reply ended inside, unparsed

    def feed(self, piece: str) -> tuple[str, list[ToolCall]]:
        start, end = self.markup.start, self.markup.end
        self.pending += piece
        shown, calls = "", []
        while True:
            if not self.inside:
                at = self.pending.find(start)
                if at == -1:
                    hold = _partial_suffix(self.pending, start)
                    cut = len(self.pending) - hold
                    shown += self.pending[:cut]
                    self.pending = self.pending[cut:]
                    break
                shown += self.pending[:at]
                self.pending = self.pending[at + len(start) :]
                self.inside = True
            else:
                at = self.pending.find(end)
                if at == -1:
                    break
                body, self.pending = self.pending[:at], self.pending[at + len(end) :]
                self.inside = False
                parsed = parse_calls(self.markup, body, self.tools)
                if parsed is None:
                    shown += start + body + end
                else:
                    calls += parsed
        self.calls += calls
        return shown, calls

    def finish(self) -> tuple[str, list[ToolCall]]:
        """What is left once the reply ended: an open call (no end marker: some models stop
        right after the call) is parsed if it can be; one cut short (by max_tokens) is kept
        in ``unfinished`` (never in the text: the markup never reaches it), for the error
        that says the call was cut."""
        rest, self.pending = self.pending, ""
        if not self.inside:
            return rest, []
        self.inside = False
        parsed = (
            parse_calls(self.markup, rest, self.tools, complete=False) if rest.strip() else None
        )
        if parsed is None:
            log.info("an unfinished tool call: %r", rest[:200])
            self.unfinished = rest.strip()
            return "", []
        self.calls += parsed
        return "", parsed


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest tail of ``text`` that is a proper start of ``marker``."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0
