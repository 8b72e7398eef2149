"""A reasoning model's thinking through the real clients (``openai``, ``anthropic``), in all
three dialects, streamed and not: ``reasoning_content`` on chat completions, ``thinking``
blocks on ``/v1/messages`` (when the request enables thinking), ``reasoning`` items in the
Responses API; the template's switches (``chat_template_kwargs``, ``reasoning_effort``,
``thinking``, ``reasoning.effort``) reaching it; and the cache on turn 2 of a template that
drops earlier turns' thinking (Qwen3's): the prompt up to the previous reply is a hit.

The model is the scripted reasoning model of ``tests/core/engine/thinking_model.py``: with
Qwen3's real chat template it always replies ``<think>Hm</think>OK``."""

from __future__ import annotations

import http.client
import json

import anthropic
import openai
import pytest

from core.api import anthropic_routes
from core.api.server import ApiServer
from tests.core.engine.helpers import start_engine
from tests.core.engine.thinking_model import ANSWER, THINKING, THINKING_TOKENS, write_thinking_model

ASK = [{"role": "user", "content": "Is it OK?"}]
EMPTY_THINKING = 6  # <think> \n \n </think> \n \n: the prompt's part that switches thinking off


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("reasoning-api")
    engine = start_engine(root / "data", write_thinking_model(root / "qwen3"), disk_cache=False)
    with ApiServer(engine, "127.0.0.1", 0) as api:
        yield api
    engine.shutdown()


@pytest.fixture(scope="module")
def oai(server):
    with openai.OpenAI(base_url=server.address + "/v1", api_key="unused", max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def claude(server):
    with anthropic.Anthropic(base_url=server.address, api_key="unused", max_retries=0) as c:
        yield c


def chat(oai, messages=ASK, **kw):
    return oai.chat.completions.create(model="default", messages=messages, max_tokens=20, **kw)


# ------------------------------------------------------------------ chat completions
def test_chat_completion_gives_reasoning_content_apart_from_the_content(oai):
    reply = chat(oai)
    message = reply.choices[0].message
    assert message.content == ANSWER and message.reasoning_content == THINKING
    assert reply.usage.completion_tokens_details.reasoning_tokens == THINKING_TOKENS
    assert reply.choices[0].finish_reason == "stop"


def test_a_streamed_chat_completion_sends_reasoning_content_deltas_first(oai):
    deltas = [c.choices[0].delta for c in chat(oai, stream=True) if c.choices]
    thinking = [d.reasoning_content for d in deltas if getattr(d, "reasoning_content", None)]
    answer = [d.content for d in deltas if d.content]
    assert "".join(thinking) == THINKING and "".join(answer) == ANSWER
    first_answer = next(i for i, d in enumerate(deltas) if d.content)
    assert all(not getattr(d, "reasoning_content", None) for d in deltas[first_answer:])


@pytest.mark.parametrize(
    "switch",
    [
        {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}},
        {"reasoning_effort": "none"},
    ],
)
def test_chat_template_kwargs_and_reasoning_effort_reach_the_template(oai, switch):
    plain = chat(oai).usage.prompt_tokens
    assert chat(oai, **switch).usage.prompt_tokens == plain + EMPTY_THINKING


def test_a_renderer_argument_in_chat_template_kwargs_is_a_400(oai):
    with pytest.raises(openai.BadRequestError) as caught:
        chat(oai, extra_body={"chat_template_kwargs": {"add_generation_prompt": False}})
    assert caught.value.body["param"] == "chat_template_kwargs.add_generation_prompt"


def test_turn_two_hits_the_cache_up_to_the_reply_whose_thinking_the_template_dropped(oai):
    """Qwen3's template renders an earlier turn's reply without its thinking, so turn 2's
    prompt parts from what the cache holds (turn 1's prompt, then ``<think>Hm</think>OK``)
    right after turn 1's prompt: that whole prompt is served from the cache, and turn 1's
    answer is computed again."""
    alone = {"extra_body": {"cache_salt": "chat"}}  # a namespace of its own: no other hit
    first = chat(oai, **alone)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    history = ASK + [first.choices[0].message.model_dump(exclude_none=True)]
    assert history[1]["reasoning_content"] == THINKING  # sent back as it came
    second = chat(oai, messages=history + [{"role": "user", "content": "Sure?"}], **alone)
    assert second.usage.prompt_tokens_details.cached_tokens == first.usage.prompt_tokens
    computed = second.usage.prompt_tokens - first.usage.prompt_tokens
    # what turn 2 computes: turn 1's answer as the template renders it (without its
    # thinking), then the new turn: OK<|im_end|>\n<|im_start|>user\nSure?<|im_end|>\n
    # <|im_start|>assistant\n, a token per byte and one per special token
    assert computed == len(f"{ANSWER}\nuser\nSure?\nassistant\n") + 4


# ------------------------------------------------------------------ Anthropic messages
def message(claude, **kw):
    return claude.messages.create(
        model="claude-sonnet-4-5", messages=ASK, max_tokens=20, extra_body={"temperature": 0}, **kw
    )


ENABLED = {"type": "enabled", "budget_tokens": 1024}


def prompt_size(reply) -> int:
    """The prompt's tokens: computed now and read from the cache."""
    return reply.usage.input_tokens + reply.usage.cache_read_input_tokens


def test_a_message_with_thinking_enabled_has_a_thinking_block_first(claude):
    reply = message(claude, thinking=ENABLED)
    assert [block.type for block in reply.content] == ["thinking", "text"]
    assert reply.content[0].thinking == THINKING and reply.content[0].signature
    assert reply.content[1].text == ANSWER and reply.stop_reason == "end_turn"


def test_a_streamed_message_sends_thinking_deltas_and_a_signature(claude):
    with claude.messages.stream(
        model="claude-sonnet-4-5",
        messages=ASK,
        max_tokens=20,
        thinking=ENABLED,
        extra_body={"temperature": 0},
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    assert "".join(d.thinking for d in deltas if d.type == "thinking_delta") == THINKING
    assert [d.type for d in deltas].index("signature_delta") < [d.type for d in deltas].index(
        "text_delta"
    )
    assert [block.type for block in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == THINKING and final.content[1].text == ANSWER
    assert final.content[0].signature == message(claude, thinking=ENABLED).content[0].signature


def test_without_thinking_enabled_there_is_no_thinking_block_and_the_template_is_told(claude):
    off = message(claude)
    disabled = message(claude, thinking={"type": "disabled"})
    on = message(claude, thinking=ENABLED)
    for reply in (off, disabled):
        assert [block.type for block in reply.content] == ["text"]
        assert reply.content[0].text == ANSWER  # the model thought anyway: not shown
        assert prompt_size(reply) == prompt_size(on) + EMPTY_THINKING
    with claude.messages.stream(
        model="claude-sonnet-4-5", messages=ASK, max_tokens=20, extra_body={"temperature": 0}
    ) as stream:
        kinds = {e.delta.type for e in stream if e.type == "content_block_delta"}
    assert kinds == {"text_delta"}


def test_thinking_shown_as_omitted_comes_as_an_empty_block(claude):
    reply = message(claude, thinking={"type": "adaptive", "display": "omitted"})
    assert reply.content[0].type == "thinking" and reply.content[0].thinking == ""
    assert reply.content[0].signature and reply.content[1].text == ANSWER


def test_a_thinking_block_sent_back_is_taken_and_turn_two_hits_the_cache(claude):
    alone = {"extra_body": {"cache_salt": "messages"}}  # a namespace of its own: no other hit
    first = claude.messages.create(
        model="claude-sonnet-4-5", messages=ASK, max_tokens=20, thinking=ENABLED, **alone
    )
    assert first.usage.cache_read_input_tokens == 0
    history = ASK + [
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {"role": "user", "content": "Sure?"},
    ]
    second = claude.messages.create(
        model="claude-sonnet-4-5", messages=history, max_tokens=20, thinking=ENABLED, **alone
    )
    turn_one = prompt_size(first)
    assert second.usage.cache_read_input_tokens == turn_one
    counted = claude.messages.count_tokens(
        model="claude-sonnet-4-5", messages=history, thinking=ENABLED
    )
    assert counted.input_tokens == second.usage.input_tokens + turn_one


def test_a_thinking_block_in_a_user_message_is_a_400(claude):
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(
            model="claude-sonnet-4-5",
            messages=[{"role": "user", "content": [{"type": "thinking", "thinking": "x"}]}],
            max_tokens=5,
        )


# ------------------------------------------------------------------ Responses
def respond(oai, **kw):
    return oai.responses.create(model="default", input="Is it OK?", max_output_tokens=20, **kw)


def test_a_response_has_a_reasoning_item_before_its_message(oai):
    response = respond(oai)
    assert [item.type for item in response.output] == ["reasoning", "message"]
    reasoning, answer = response.output
    assert [(c.type, c.text) for c in reasoning.content] == [("reasoning_text", THINKING)]
    assert answer.content[0].text == ANSWER and response.output_text == ANSWER
    assert response.usage.output_tokens_details.reasoning_tokens == THINKING_TOKENS


def test_a_streamed_response_sends_reasoning_text_events(oai):
    events = list(respond(oai, stream=True))
    kinds = [e.type for e in events]
    deltas = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    assert "".join(deltas) == THINKING
    done = next(e for e in events if e.type == "response.reasoning_text.done")
    assert done.text == THINKING and done.output_index == 0
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")
    final = events[-1].response
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert final.output[0].content[0].text == THINKING and final.output_text == ANSWER


def test_reasoning_effort_reaches_the_template_and_the_response_echoes_it(oai):
    plain = respond(oai).usage.input_tokens
    none = respond(oai, reasoning={"effort": "none"})
    assert none.usage.input_tokens == plain + EMPTY_THINKING
    assert none.reasoning.effort == "none"


def test_a_continued_response_carries_its_reasoning_and_hits_the_cache(oai):
    alone = {"extra_body": {"cache_salt": "responses"}}  # a namespace of its own: no other hit
    first = respond(oai, **alone)
    assert first.usage.input_tokens_details.cached_tokens == 0
    second = oai.responses.create(
        model="default",
        input="Sure?",
        previous_response_id=first.id,
        max_output_tokens=20,
        **alone,
    )
    assert second.usage.input_tokens_details.cached_tokens == first.usage.input_tokens
    assert second.output_text == ANSWER


def test_thinking_not_sent_keeps_the_stream_alive_with_pings(server, monkeypatch):
    """A model that thinks for long with thinking not enabled sends nothing for a while:
    pings say the stream is alive (here after every hidden piece)."""
    monkeypatch.setattr(anthropic_routes, "PING_EVERY_S", 0.0)
    body = {"model": "claude", "messages": ASK, "max_tokens": 20, "stream": True}
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    try:
        conn.request("POST", "/v1/messages", json.dumps(body), {"Content-Type": "application/json"})
        lines = conn.getresponse().read().decode().splitlines()
    finally:
        conn.close()
    kinds = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    first_text = kinds.index("content_block_start")
    assert kinds.count("ping") >= 1 + 2  # the one after message_start, then one per piece
    assert "ping" in kinds[2:first_text]
    assert "thinking_delta" not in "".join(lines) and THINKING not in "".join(lines)
