"""The OpenAI request models and the replies, without HTTP or an engine."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from core.api.errors import ApiError, param_of, validation_error
from core.api.openai_schema import ChatCompletionRequest, CompletionRequest, ReplyBuilder, to_call
from core.api.wire import ModelCard
from core.engine.types import RequestStats

CARD = ModelCard(
    "tiny", "f" * 64, 512, frozenset({"tiny", "default", "/models/tiny"}), 1_700_000_000
)
HI = [{"role": "user", "content": "hi"}]


def refusal(model, body) -> ApiError:
    """The 400 FastAPI would answer for ``body``."""
    with pytest.raises(ValidationError) as caught:
        model.model_validate(body)
    return validation_error(caught.value.errors())


def chat_call(**body):
    return to_call(ChatCompletionRequest.model_validate({"messages": HI, **body}), CARD)


@pytest.mark.parametrize(
    "loc, param",
    [
        (("messages", 0, "content", "str"), "messages[0].content"),
        (("messages", 0, "content", "list[TextPart]", 1, "text"), "messages[0].content[1].text"),
        (("stop", "function-after[_few_stops(), union[str,list[str]]]"), "stop"),
        (("prompt", "list[list[int]]", 0, 2), "prompt[0][2]"),
        ((), None),
    ],
)
def test_error_locations_name_the_field(loc, param):
    assert param_of(loc) == param


@pytest.mark.parametrize(
    "body, param, code",
    [
        (
            {"messages": HI, "temperature": "1.0"},
            "temperature",
            "invalid_type",
        ),  # strict: no coercion
        ({"messages": HI, "max_tokens": True}, "max_tokens", "invalid_type"),
        ({"messages": HI, "max_tokens": 1.5}, "max_tokens", "invalid_type"),
        ({"messages": HI, "temperature": 2.5}, "temperature", "invalid_value"),
        ({"messages": HI, "temperature": 10**400}, "temperature", "invalid_type"),
        ({"messages": HI, "top_k": 10**400}, "top_k", "invalid_value"),
        ({"messages": HI, "top_p": 0}, "top_p", "invalid_value"),
        ({"messages": HI, "seed": 2**64}, "seed", "invalid_value"),
        ({"messages": HI, "n": 3}, "n", "invalid_value"),
        ({"messages": HI, "presence_penalty": 0.5}, "presence_penalty", "invalid_value"),
        ({"messages": HI, "logprobs": True}, "logprobs", "invalid_value"),
        ({"messages": HI, "stop": ["x"] * 17}, "stop", "invalid_value"),
        ({"messages": HI, "stream": "yes"}, "stream", "invalid_type"),
        (
            {"messages": HI, "stream_options": {"include_usage": 1}},
            "stream_options.include_usage",
            "invalid_type",
        ),
        ({"messages": HI, "session": "s" * 257}, "session", "invalid_value"),
        ({"messages": []}, "messages", "invalid_value"),
        ({}, "messages", "missing_required_parameter"),
        ({"messages": [{"content": "hi"}]}, "messages[0].role", "missing_required_parameter"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role", "invalid_value"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "invalid_type"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages[0].content[0].type",
            "invalid_value",
        ),
        (
            {"messages": [{"role": "user", "content": "a\ud800b"}]},
            "messages[0].content",
            "invalid_value",
        ),
        ({"messages": HI, "session": "\udfff"}, "session", "invalid_value"),
    ],
)
def test_bad_chat_bodies_name_their_field(body, param, code):
    error = refusal(ChatCompletionRequest, body)
    assert (error.status, error.param, error.code) == (400, param, code), error.message
    assert param in error.message and "\n" not in error.message


@pytest.mark.parametrize(
    "model, field, refused, accepted, message",
    [
        (ChatCompletionRequest, "n", 2, 1, "only n=1 is supported"),
        (ChatCompletionRequest, "presence_penalty", 0.5, 0.0, "use 'repetition_penalty'"),
        (ChatCompletionRequest, "frequency_penalty", -1.0, 0.0, "use 'repetition_penalty'"),
        (ChatCompletionRequest, "logprobs", True, False, "logprobs are not supported"),
        (CompletionRequest, "logprobs", 0, None, "logprobs are not supported"),
        (CompletionRequest, "echo", True, False, "not supported"),
        (CompletionRequest, "suffix", "x", "", "not supported"),
        (CompletionRequest, "best_of", 2, 1, "only best_of=1 is supported"),
        (CompletionRequest, "n", 0, None, "only n=1 is supported"),
    ],
)
def test_what_is_not_supported_is_refused_naming_the_field(
    model, field, refused, accepted, message
):
    body = {"messages": HI} if model is ChatCompletionRequest else {"prompt": "hi"}
    error = refusal(model, {**body, field: refused})
    assert (error.status, error.param, error.code) == (400, field, "invalid_value")
    assert message in error.message
    assert getattr(model.model_validate({**body, field: accepted}), field) == accepted


def test_a_body_that_is_not_an_object():
    error = refusal(ChatCompletionRequest, [1, 2])
    assert (error.param, error.code) == (None, "invalid_type")
    assert "JSON object" in error.message


def test_a_lone_surrogate_is_reported_with_its_position():
    error = refusal(ChatCompletionRequest, {"messages": [{"role": "user", "content": "ab\ud800"}]})
    assert "U+D800" in error.message and "character 2" in error.message


def test_defaults_are_openais():
    call = chat_call()
    sampling = call.request.sampling
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.max_tokens) == (
        1.0,
        1.0,
        0,
        512,
    )
    assert not call.stream and not call.include_usage and call.request.session is None


def test_fields_reach_the_engine_request():
    call = chat_call(
        temperature=0,
        top_p=0.5,
        top_k=20,
        min_p=0.05,
        repetition_penalty=1.1,
        seed=3,
        max_completion_tokens=7,
        max_tokens=100,
        stop="END",
        stream=True,
        stream_options={"include_usage": True},
        session="s1",
    )
    sampling = call.request.sampling
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.min_p) == (
        0,
        0.5,
        20,
        0.05,
    )
    assert (sampling.repetition_penalty, sampling.seed, sampling.max_tokens) == (1.1, 3, 7)
    assert sampling.stop == ("END",) and call.stream and call.include_usage
    assert call.request.session == "s1"


def test_roles_and_content_parts():
    call = chat_call(
        messages=[
            {"role": "developer", "content": "be brief"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "one "}, {"type": "text", "text": "two"}],
            },
            {"role": "assistant", "content": None},
        ]
    )
    assert [(m.role, m.content) for m in call.request.messages] == [
        ("system", "be brief"),
        ("user", "one two"),
        ("assistant", ""),
    ]
    with pytest.raises(ApiError) as caught:
        chat_call(messages=[{"role": "user", "content": None}])
    assert caught.value.param == "messages[0].content"


def test_checks_that_need_the_model():
    assert chat_call(model="gpt-4o").chat  # any name is the loaded model (issue 30.3)
    assert chat_call(model="default").request.sampling.max_tokens == 512
    with pytest.raises(ApiError) as caught:
        chat_call(max_tokens=513)
    assert caught.value.param == "max_tokens"
    call = chat_call(
        tools=[{"type": "function", "function": {"name": "f"}}], tool_choice="required"
    )
    assert (
        call.request.tools[0]["function"]["name"] == "f" and call.request.tool_choice == "required"
    )
    with pytest.raises(ApiError) as caught:
        chat_call(
            tools=[{"type": "function", "function": {"name": "f"}}],
            tool_choice={"type": "function", "function": {"name": "g"}},
        )
    assert caught.value.param == "tool_choice"
    with pytest.raises(ApiError) as caught:
        chat_call(functions=[{"name": "f"}])
    assert caught.value.param == "functions"


def test_the_session_header_gives_way_to_the_body():
    body = ChatCompletionRequest.model_validate({"messages": HI})
    assert to_call(body, CARD, "from-header").request.session == "from-header"
    body = ChatCompletionRequest.model_validate({"messages": HI, "session": "from-body"})
    assert to_call(body, CARD, "from-header").request.session == "from-body"
    with pytest.raises(ApiError, match="at most 256"):
        to_call(ChatCompletionRequest.model_validate({"messages": HI}), CARD, "h" * 300)


def test_a_client_may_ask_for_a_lower_priority():
    assert chat_call().request.priority == 0
    assert chat_call(priority=7).request.priority == 7  # vLLM's field: lower is sooner
    completion = to_call(CompletionRequest.model_validate({"prompt": "p", "priority": 3}), CARD)
    assert completion.request.priority == 3
    body = ChatCompletionRequest.model_validate({"messages": HI})
    assert to_call(body, CARD, None, priority_header=" 4 ").request.priority == 4  # or the header
    assert (
        to_call(
            ChatCompletionRequest.model_validate({"messages": HI, "priority": 2}),
            CARD,
            None,
            priority_header="9",
        ).request.priority
        == 2
    )  # the body wins
    for bad in ("-1", "soon", "1.5", str(2**31)):
        with pytest.raises(ApiError) as caught:
            to_call(body, CARD, None, priority_header=bad)
        assert caught.value.param == "X-RadixChat-Priority"
    # never ahead of the app's own chat window (CHAT_PRIORITY is below 0)
    assert refusal(ChatCompletionRequest, {"messages": HI, "priority": -1}).param == "priority"


def test_anthropic_messages_take_a_priority_too():
    from core.api import anthropic_schema

    body = {"model": "tiny", "max_tokens": 5, "messages": HI}
    call = anthropic_schema.to_call(
        anthropic_schema.MessagesRequest.model_validate(body), CARD, None, priority_header="5"
    )
    assert call.request.priority == 5
    with_body = anthropic_schema.MessagesRequest.model_validate({**body, "priority": 1})
    assert anthropic_schema.to_call(with_body, CARD).request.priority == 1
    assert (
        anthropic_schema.to_call(
            anthropic_schema.MessagesRequest.model_validate(body), CARD
        ).request.priority
        == 0
    )


@pytest.mark.parametrize(
    "prompt, text, tokens",
    [
        ("once", "once", None),
        (["once"], "once", None),
        ([1, 2, 3], None, (1, 2, 3)),
        ([[4, 5]], None, (4, 5)),
    ],
)
def test_completion_prompts(prompt, text, tokens):
    request = to_call(CompletionRequest.model_validate({"prompt": prompt}), CARD).request
    assert (request.prompt_text, request.prompt_tokens, request.messages) == (text, tokens, ())


@pytest.mark.parametrize("prompt", ["", [], ["a", "b"], [[1], [2]]])
def test_completion_prompts_refused_after_validation(prompt):
    with pytest.raises(ApiError) as caught:
        to_call(CompletionRequest.model_validate({"prompt": prompt}), CARD)
    assert caught.value.param == "prompt"


@pytest.mark.parametrize("prompt", [{"text": "x"}, [1, -1], [True], 5])
def test_completion_prompts_refused_by_the_model(prompt):
    assert refusal(CompletionRequest, {"prompt": prompt}).param.startswith("prompt")


def test_replies_and_chunks():
    stats = RequestStats(
        prompt_tokens=10,
        cached_tokens=4,
        restored_tokens=2,
        completion_tokens=3,
        finish_reason="length",
    )
    reply = ReplyBuilder(chat_call(), CARD)
    body = reply.full("abc", stats)
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "abc"}
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {
        "prompt_tokens": 10,
        "completion_tokens": 3,
        "total_tokens": 13,
        "prompt_tokens_details": {"cached_tokens": 6},
    }
    assert reply.chunk(first=True)["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert reply.chunk("x")["choices"][0]["delta"] == {"content": "x"}
    last = reply.chunk(stats=RequestStats(finish_reason="stop"))
    assert last["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "stop",
    }
    assert {c["id"] for c in (body, last, reply.usage_chunk(stats))} == {reply.id}
    text = ReplyBuilder(to_call(CompletionRequest.model_validate({"prompt": "p"}), CARD), CARD)
    assert text.full("t", stats)["object"] == "text_completion"
    assert text.chunk("t")["choices"][0]["text"] == "t"


def test_a_request_may_choose_its_speculative_decoding():
    from core.api import anthropic_schema

    assert chat_call().request.speculative is None  # the server's setting
    assert chat_call(radixchat={"speculative": "off"}).request.speculative == "off"
    completion = CompletionRequest.model_validate(
        {"prompt": "p", "radixchat": {"speculative": "ngram"}}
    )
    assert to_call(completion, CARD).request.speculative == "ngram"
    body = {"model": "tiny", "max_tokens": 5, "messages": HI, "radixchat": {"speculative": "off"}}
    call = anthropic_schema.to_call(anthropic_schema.MessagesRequest.model_validate(body), CARD)
    assert call.request.speculative == "off"
    bad = refusal(ChatCompletionRequest, {"messages": HI, "radixchat": {"speculative": "fast"}})
    assert bad.param == "radixchat.speculative"


def test_usage_says_how_many_draft_tokens_were_taken():
    from core.api.openai_schema import usage

    plain = usage(RequestStats(completion_tokens=10, cache_namespace="api"))
    assert "draft_tokens" not in plain["radixchat"]
    stats = RequestStats(
        completion_tokens=30, draft_tokens=24, accepted_tokens=20, cache_namespace="api"
    )
    extra = usage(stats)["radixchat"]
    assert (extra["draft_tokens"], extra["accepted_tokens"]) == (24, 20)
    assert extra["tokens_per_step"] == 3.0  # 30 tokens in 10 forwards


def test_an_assistant_messages_thinking_comes_in_under_either_name():
    from core.api.openai_schema import ChatCompletionRequest, chat_messages

    body = ChatCompletionRequest.model_validate(
        {
            "messages": [
                {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "4", "reasoning_content": "Two and two."},
                {"role": "assistant", "content": "5", "reasoning": "Or not."},
                {"role": "assistant", "content": "6", "reasoning": {"summary": "a service's"}},
                {"role": "user", "content": "ok", "reasoning_content": "not a user's"},
            ]
        }
    )
    assert [m.reasoning for m in chat_messages(body.messages)] == [
        "",
        "Two and two.",
        "Or not.",
        "",
        "",
    ]
