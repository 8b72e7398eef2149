"""``radixchat serve --max-output-tokens``: the reply ceiling of a request that sets no limit
of its own, in each dialect; a request's own limit wins (up to the context); how each
dialect says the ceiling ended the reply."""

from __future__ import annotations

import argparse

import anthropic
import openai
import pytest

from core.api import anthropic_schema, openai_schema, responses_schema
from core.api.errors import ApiError
from core.api.limits import RequestLimits
from core.api.server import ApiServer
from core.api.wire import ModelCard
from core.cli.commands import serve as serve_command
from core.cli.serve import request_limits
from core.limits import MAX_OUTPUT_TOKENS

CARD = ModelCard("tiny", "f" * 64, 1024, frozenset({"tiny", "default"}), 0)
HI = [{"role": "user", "content": "hi"}]
CEILING = RequestLimits(max_output_tokens=100)


def reply_limit(schema, model, base: dict, limits: RequestLimits, body: dict) -> int:
    """The reply's token limit ``schema.to_call`` gives a request ``base | body``."""
    call = schema.to_call(model.model_validate({**base, **body}), CARD, limits=limits)
    return call.request.sampling.max_tokens


def chat(limits=CEILING, **body) -> int:
    base = {"messages": HI}
    return reply_limit(openai_schema, openai_schema.ChatCompletionRequest, base, limits, body)


def completion(limits=CEILING, **body) -> int:
    base = {"prompt": "hi"}
    return reply_limit(openai_schema, openai_schema.CompletionRequest, base, limits, body)


def responses(limits=CEILING, **body) -> int:
    base = {"input": "hi"}
    return reply_limit(responses_schema, responses_schema.ResponsesRequest, base, limits, body)


def messages(limits=CEILING, **body) -> int:
    base = {"model": "claude-x", "messages": HI}
    return reply_limit(anthropic_schema, anthropic_schema.MessagesRequest, base, limits, body)


@pytest.mark.parametrize("dialect", [chat, completion, responses])
def test_a_request_without_a_limit_gets_the_ceiling(dialect):
    assert dialect() == 100
    assert dialect(RequestLimits(max_output_tokens=5000)) == CARD.context_length
    assert dialect(RequestLimits(max_output_tokens=0)) == CARD.context_length  # 0: no ceiling
    assert dialect(RequestLimits()) == min(MAX_OUTPUT_TOKENS, CARD.context_length)


@pytest.mark.parametrize(
    "dialect, field",
    [
        (chat, "max_tokens"),
        (chat, "max_completion_tokens"),
        (completion, "max_tokens"),
        (responses, "max_output_tokens"),
    ],
)
def test_a_requests_own_limit_wins_up_to_the_context(dialect, field):
    assert dialect(**{field: 700}) == 700  # above the ceiling
    assert dialect(**{field: 7}) == 7
    with pytest.raises(ApiError) as caught:
        dialect(**{field: CARD.context_length + 1})
    assert caught.value.param == field


def test_anthropics_max_tokens_is_required_so_the_ceiling_never_applies():
    assert messages(max_tokens=700) == 700
    # Claude Code asks for 64,000: the context caps it, as before
    assert messages(max_tokens=64_000) == CARD.context_length


def test_the_option_sets_the_ceiling_and_refuses_a_negative_number():
    parser = argparse.ArgumentParser()
    serve_command.add_parser(parser.add_subparsers())
    assert request_limits(parser.parse_args(["serve"])).max_output_tokens == MAX_OUTPUT_TOKENS
    args = parser.parse_args(["serve", "--max-output-tokens", "0"])
    assert request_limits(args).max_output_tokens == 0
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--max-output-tokens", "-1"])
    with pytest.raises(ValueError):
        RequestLimits(max_output_tokens=-1)


@pytest.fixture(scope="module")
def ceiling_server(tiny_engine):
    with ApiServer(tiny_engine, "127.0.0.1", 0, limits=RequestLimits(max_output_tokens=4)) as api:
        yield api


def test_each_dialect_says_the_ceiling_ended_the_reply(ceiling_server):
    """Through the clients' own packages: OpenAI's chat ends with ``length``, a response is
    ``incomplete`` (reason ``max_output_tokens``, as OpenAI's API says it, streamed or not),
    and Anthropic's own ``max_tokens`` (above the ceiling) is what ends its reply."""
    with openai.OpenAI(
        base_url=ceiling_server.address + "/v1", api_key="unused", max_retries=0, timeout=60
    ) as client:
        reply = client.chat.completions.create(model="gpt-4o", messages=HI, temperature=0)
        assert reply.choices[0].finish_reason == "length"
        assert reply.usage.completion_tokens == 4
        response = client.responses.create(model="gpt-5", input="hi", temperature=0)
        assert response.status == "incomplete"
        assert response.incomplete_details.reason == "max_output_tokens"
        assert response.usage.output_tokens == 4 and response.max_output_tokens is None
        with client.responses.stream(model="gpt-5", input="hi", temperature=0) as stream:
            kinds = [event.type for event in stream]
        assert kinds[-1] == "response.incomplete" and "response.completed" not in kinds
    with anthropic.Anthropic(
        base_url=ceiling_server.address, api_key="unused", max_retries=0, timeout=60
    ) as client:
        message = client.messages.create(
            model="claude-x", max_tokens=6, messages=HI, extra_body={"temperature": 0}
        )
        assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 6
