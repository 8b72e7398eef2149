"""Ollama's ``think`` on a reasoning model, through the official ``ollama`` package: the
scripted tiny reasoning model with Qwen3's template (tests/core/engine/thinking_model.py)
writes ``<think>Hm</think>OK``; its thinking comes back in ``thinking``, streamed and not,
for chat and generate, left out with ``think: false`` (which the template hears), and an
earlier reply's thinking goes back to the template."""

from __future__ import annotations

import ollama
import pytest

from core.api.server import ApiServer
from tests.core.engine.helpers import start_engine
from tests.core.engine.thinking_model import ANSWER, THINKING, write_thinking_model

ASK = [{"role": "user", "content": "Is it OK?"}]
LIMIT = {"num_predict": 20}
EMPTY_THINKING = 6  # <think> \n \n </think> \n \n: the prompt's part that switches thinking off


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    root = tmp_path_factory.mktemp("ollama-reasoning")
    engine = start_engine(root / "data", write_thinking_model(root / "qwen3"), disk_cache=False)
    with ApiServer(engine, "127.0.0.1", 0) as api, ollama.Client(host=api.address) as client:
        yield client
    engine.shutdown()


def test_show_says_the_model_thinks(client):
    assert client.show("qwen3").capabilities == ["completion", "tools", "thinking"]


def test_the_thinking_comes_apart_whole_and_streamed(client):
    whole = client.chat(model="qwen3", messages=ASK, think=True, options=LIMIT)
    assert (whole.message.thinking, whole.message.content) == (THINKING, ANSWER)
    assert whole.done_reason == "stop"
    parts = list(client.chat(model="qwen3", messages=ASK, think=True, options=LIMIT, stream=True))
    thinking = [p.message.thinking for p in parts if p.message.thinking]
    answer = "".join(p.message.content for p in parts)
    assert "".join(thinking) == THINKING and answer == ANSWER
    first_answer = next(i for i, p in enumerate(parts) if p.message.content)
    assert all(not p.message.thinking for p in parts[first_answer:])  # thinking first
    unset = client.chat(model="qwen3", messages=ASK, options=LIMIT)  # the template's default
    assert (unset.message.thinking, unset.message.content) == (THINKING, ANSWER)


def test_think_false_switches_the_template_off_and_sends_no_thinking(client):
    off = client.chat(model="qwen3", messages=ASK, think=False, options=LIMIT)
    assert off.message.thinking is None and off.message.content == ANSWER
    # the template heard it: it closed an empty thinking in the prompt, six tokens more
    prompt = {think: prompt_tokens(client, think) for think in (True, False)}
    assert prompt[False] - prompt[True] == EMPTY_THINKING
    streamed = list(
        client.chat(model="qwen3", messages=ASK, think=False, options=LIMIT, stream=True)
    )
    assert not any(p.message.thinking for p in streamed)
    assert "".join(p.message.content for p in streamed) == ANSWER


def prompt_tokens(client, think: bool) -> int:
    body = {"model": "qwen3", "messages": ASK, "think": think, "stream": False, "options": LIMIT}
    return client._client.post("/api/chat", json=body).json()["radixchat"]["prompt_tokens"]


def test_generate_sends_its_thinking_too(client):
    reply = client.generate(model="qwen3", prompt="Is it OK?", think=True, options=LIMIT)
    assert (reply.thinking, reply.response) == (THINKING, ANSWER)
    assert reply.context  # the prompt's and the reply's ids, thinking included


def test_an_earlier_replys_thinking_goes_back_to_the_template(client):
    first = client.chat(model="qwen3", messages=ASK, think=True, options=LIMIT)
    history = [*ASK, first.message.model_dump(exclude_none=True), *ASK]
    again = client.chat(model="qwen3", messages=history, think=True, options=LIMIT)
    assert again.message.content == ANSWER and again.prompt_eval_count > 0
