"""A reasoning model's reply taken apart into thought and answer as it streams
(core/api/thinking.py), and Ollama's replies built on it (core/api/ollama_reply.py)."""

from __future__ import annotations

import pytest

from core.api.ollama_reply import OllamaReply
from core.api.ollama_schema import OllamaCall, ThoughtMarkers
from core.api.thinking import Parts, ThoughtSplitter, split_whole
from core.engine.types import DoneEvent, RequestStats, ToolCall

REPLY = "<think>\nThe user greets.\n</think>\n\nHello!"


def streamed(text: str, size: int, inside: bool = False) -> Parts:
    splitter = ThoughtSplitter("<think>", "</think>", inside)
    thinking = content = ""
    for at in range(0, len(text), size):
        part = splitter.feed(text[at : at + size])
        assert "<" not in part.thinking and "<" not in part.content  # never a piece of a marker
        thinking, content = thinking + part.thinking, content + part.content
    last = splitter.finish()
    return Parts(thinking + last.thinking, content + last.content)


@pytest.mark.parametrize("size", [1, 2, 3, 7, 100])
def test_the_thought_comes_apart_whatever_the_pieces(size):
    assert streamed(REPLY, size) == Parts("\nThe user greets.\n", "Hello!")


def test_a_prompt_that_opened_the_thought_and_replies_without_one():
    assert streamed("weighing it</think>Yes.", 2, inside=True) == Parts("weighing it", "Yes.")
    assert split_whole("Just an answer.", "<think>", "</think>") == Parts("", "Just an answer.")
    assert split_whole("<think>cut short", "<think>", "</think>") == Parts("cut short", "")
    assert split_whole("  <thin", "<think>", "</think>") == Parts("", "  <thin")


def call(show: bool = True, chat: bool = True, context: bool = False) -> OllamaCall:
    return OllamaCall(chat, None, True, ThoughtMarkers("<think>", "</think>", False, show), context)


def done(text: str, calls=()) -> DoneEvent:
    stats = RequestStats(
        prompt_tokens=10,
        cached_tokens=4,
        restored_tokens=2,
        computed_tokens=4,
        completion_tokens=3,
        ttft_s=0.5,
        total_s=2.0,
        finish_reason="stop",
    )
    return DoneEvent(text, stats, tuple(calls), (1, 2), (3,))


def test_a_whole_reply_carries_the_thought_apart_and_ollamas_figures():
    whole = OllamaReply(call(), "qwen3:latest", arrived=0.0).last(done(REPLY), whole=True)
    assert whole["message"] == {
        "role": "assistant",
        "content": "Hello!",
        "thinking": "\nThe user greets.\n",
    }
    assert whole["done"] and whole["done_reason"] == "stop" and whole["model"] == "qwen3:latest"
    assert whole["prompt_eval_count"] == 4 and whole["eval_count"] == 3  # computed, generated
    assert whole["prompt_eval_duration"] == 500_000_000 and whole["eval_duration"] == 1_500_000_000
    assert whole["radixchat"]["prompt_tokens"] == 10 and whole["radixchat"]["cached_tokens"] == 6
    assert whole["created_at"].endswith("Z")
    hidden = OllamaReply(call(show=False), "m", 0.0).last(done(REPLY), whole=True)
    assert hidden["message"] == {"role": "assistant", "content": "Hello!"}  # think: false


def test_streamed_pieces_then_the_last_object():
    reply = OllamaReply(call(chat=False, context=True), "m", 0.0)
    pieces = [reply.piece(reply.split(REPLY[i : i + 4])) for i in range(0, len(REPLY), 4)]
    sent = [p for p in pieces if p is not None]
    assert "".join(p.get("thinking", "") for p in sent) == "\nThe user greets.\n"
    assert (
        "".join(p["response"] for p in sent) + (reply.flush() or {}).get("response", "") == "Hello!"
    )
    last = reply.last(done(REPLY), whole=False)
    assert last["response"] == "" and last["context"] == [1, 2, 3]  # the prompt's and reply's


def test_tool_calls_as_ollama_sends_them():
    reply = OllamaReply(OllamaCall(True, None, True), "m", 0.0)
    line = reply.tool_call(ToolCall("call_1", "get_time", '{"zone": "UTC"}'))
    assert line["message"]["tool_calls"] == [
        {"id": "call_1", "function": {"index": 0, "name": "get_time", "arguments": {"zone": "UTC"}}}
    ]
    whole = reply.last(done("", [ToolCall("call_2", "f", "{}")]), whole=True)
    assert whole["message"]["tool_calls"][0]["function"]["arguments"] == {}
