"""Ollama's replies (core/api/ollama_reply.py), no server: a whole reply with its thinking
apart and Ollama's figures, streamed pieces and the last object with ``context``, the
thinking left out with ``think: false``, tool calls as Ollama sends them."""

from __future__ import annotations

from core.api.ollama_reply import OllamaReply
from core.api.ollama_schema import OllamaCall
from core.engine.types import DoneEvent, RequestStats, ToolCall


def call(thinking: bool = True, chat: bool = True, context: bool = False) -> OllamaCall:
    return OllamaCall(chat, None, True, thinking, context)


def done(text: str = "Hello!", reasoning: str = "The user greets.", calls=()) -> DoneEvent:
    stats = RequestStats(
        prompt_tokens=10,
        cached_tokens=4,
        restored_tokens=2,
        computed_tokens=4,
        completion_tokens=3,
        ttft_s=0.5,
        total_s=2.0,
        finish_reason="stop",
        cache_namespace="api",
    )
    return DoneEvent(text, stats, tuple(calls), reasoning, (1, 2), (3,))


def test_a_whole_reply_carries_the_thinking_apart_and_ollamas_figures():
    whole = OllamaReply(call(), "qwen3:latest", arrived=0.0).last(done(), whole=True)
    assert whole["message"] == {
        "role": "assistant",
        "content": "Hello!",
        "thinking": "The user greets.",
    }
    assert whole["done"] and whole["done_reason"] == "stop" and whole["model"] == "qwen3:latest"
    assert whole["prompt_eval_count"] == 4 and whole["eval_count"] == 3  # computed, generated
    assert whole["prompt_eval_duration"] == 500_000_000
    assert whole["eval_duration"] == 1_500_000_000
    assert whole["total_duration"] >= whole["load_duration"] >= 0
    assert whole["radixchat"]["prompt_tokens"] == 10 and whole["radixchat"]["cached_tokens"] == 6
    assert whole["radixchat"]["ram_tokens"] == 4 and whole["radixchat"]["disk_tokens"] == 2
    assert whole["created_at"].endswith("Z") and "context" not in whole
    hidden = OllamaReply(call(thinking=False), "m", 0.0).last(done(), whole=True)
    assert hidden["message"] == {"role": "assistant", "content": "Hello!"}  # think: false


def test_streamed_pieces_then_the_last_object():
    reply = OllamaReply(call(chat=False, context=True), "m", 0.0)
    thought = reply.piece(thinking="Hm")
    assert (thought["thinking"], thought["response"], thought["done"]) == ("Hm", "", False)
    assert reply.piece("OK")["response"] == "OK" and not reply.piece("OK")["done"]
    assert reply.piece() is None
    last = reply.last(done(), whole=False)
    assert last["response"] == "" and last["context"] == [1, 2, 3]  # the prompt's and reply's
    assert last["done"] and "thinking" not in last
    quiet = OllamaReply(call(thinking=False), "m", 0.0)
    assert quiet.piece(thinking="Hm") is None  # think: false: no line for the thinking


def test_tool_calls_as_ollama_sends_them():
    reply = OllamaReply(OllamaCall(True, None, True), "m", 0.0)
    line = reply.tool_call(ToolCall("call_1", "get_time", '{"zone": "UTC"}'))
    assert line["message"]["tool_calls"] == [
        {"id": "call_1", "function": {"index": 0, "name": "get_time", "arguments": {"zone": "UTC"}}}
    ]
    whole = reply.last(done("", "", [ToolCall("call_2", "f", "{}")]), whole=True)
    assert whole["message"]["tool_calls"][0]["function"]["arguments"] == {}
    assert whole["message"]["content"] == ""


def test_a_load_only_answer():
    reply = OllamaReply(OllamaCall(False, None, True, loading="unload"), "m", 0.0)
    loaded = reply.loading()
    assert (loaded["response"], loaded["done"], loaded["done_reason"]) == ("", True, "unload")
