"""``/v1/conversations`` through the official ``openai`` package (and the OpenAI Agents SDK)
against a live server on a tiny model: a conversation and its items, a response made in a
conversation (its items added, the next turn a cache hit on the last), owners, errors."""

from __future__ import annotations

import asyncio

import openai
import pytest
from openai.types.conversations import Conversation, ConversationItemList

from core.api.server import ApiServer
from core.engine.config import EngineConfig
from core.engine.engine import Engine

KEYS = ("carol-0123456789abcdef", "dave-fedcba9876543210")


@pytest.fixture(scope="module")
def server(tiny_engine):
    with ApiServer(tiny_engine, "127.0.0.1", 0) as api:
        yield api


def make_client(server, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.address + "/v1", api_key=key, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def client(server):
    with make_client(server) as client:
        yield client


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": text}


def texts(items) -> list[tuple[str, str]]:
    return [(item.role, "".join(part.text for part in item.content)) for item in items]


def test_a_conversation_and_its_items(client):
    """Today: POST /v1/conversations was a 404."""
    made = client.conversations.create(metadata={"topic": "demo"}, items=[user("Hello")])
    Conversation.model_validate(made.model_dump())
    assert made.id.startswith("conv_") and made.metadata == {"topic": "demo"}
    assert client.conversations.retrieve(made.id) == made
    added = client.conversations.items.create(
        made.id,
        items=[
            {"type": "message", "role": "assistant", "content": "Hi!"},
            user("How are you?"),
        ],
    )
    ConversationItemList.model_validate(added.model_dump())
    assert [item.id[:4] for item in added.data] == ["msg_", "msg_"]
    first_page = client.conversations.items.list(made.id, limit=2)  # newest first
    assert texts(first_page.data) == [("user", "How are you?"), ("assistant", "Hi!")]
    assert first_page.has_more
    every = list(client.conversations.items.list(made.id, limit=2, order="asc"))  # all pages
    assert texts(every) == [("user", "Hello"), ("assistant", "Hi!"), ("user", "How are you?")]
    middle = client.conversations.items.retrieve(every[1].id, conversation_id=made.id)
    assert middle.id == every[1].id and middle.status == "completed"
    after = client.conversations.items.delete(every[1].id, conversation_id=made.id)
    assert after.id == made.id
    left = list(client.conversations.items.list(made.id, order="asc"))
    assert texts(left) == [("user", "Hello"), ("user", "How are you?")]
    updated = client.conversations.update(made.id, metadata={"topic": "other"})
    assert updated.metadata == {"topic": "other"}
    deleted = client.conversations.delete(made.id)
    assert deleted.deleted and deleted.id == made.id
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.list(made.id)


@pytest.mark.parametrize("stream", [False, True])
def test_each_turn_is_a_cache_hit_on_the_last(client, stream):
    """Today: ``conversation`` on /v1/responses was a 400 ("use previous_response_id")."""
    made = client.conversations.create()

    def ask(text: str):
        body = {
            "model": "default",
            "conversation": made.id,
            "input": text,
            "temperature": 0,
            "max_output_tokens": 6,
        }
        if not stream:
            return client.responses.create(**body)
        with client.responses.create(**body, stream=True) as events:
            *_, last = events  # response.incomplete: max_output_tokens
        return last.response

    first = ask("Tell me about Lyon, please.")
    second = ask("And Paris?")
    assert first.conversation.id == made.id == second.conversation.id
    # the whole first prompt, and the reply but its last token, from the cache
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.total_tokens - 1
    items = list(client.conversations.items.list(made.id, order="asc"))
    assert texts(items) == [
        ("user", "Tell me about Lyon, please."),
        ("assistant", first.output_text),
        ("user", "And Paris?"),
        ("assistant", second.output_text),
    ]
    assert items[1].id == first.output[0].id  # the output item as the response answered it
    assert client.responses.retrieve(second.id).output_text == second.output_text


def test_items_added_by_hand_are_the_next_turns_context(client):
    made = client.conversations.create(items=[user("My name is Ada.")])
    reply = client.responses.create(
        model="default", conversation={"id": made.id}, input="Who am I?", max_output_tokens=2
    )
    assert reply.usage.input_tokens > len("My name is Ada.Who am I?")  # both turns rendered
    assert len(list(client.conversations.items.list(made.id))) == 3


def test_a_conversation_and_a_previous_response_do_not_mix(client):
    made = client.conversations.create()
    reply = client.responses.create(
        model="default", conversation=made.id, input="Hi", max_output_tokens=2
    )
    with pytest.raises(openai.BadRequestError) as error:
        client.responses.create(
            model="default",
            conversation=made.id,
            previous_response_id=reply.id,
            input="x",
            max_output_tokens=2,
        )
    assert error.value.body["param"] == "conversation"
    with pytest.raises(openai.BadRequestError) as error:  # continue it in its conversation
        client.responses.create(
            model="default", previous_response_id=reply.id, input="x", max_output_tokens=2
        )
    assert made.id in error.value.body["message"]
    with pytest.raises(openai.NotFoundError) as error:
        client.responses.create(
            model="default", conversation="conv_nope", input="x", max_output_tokens=2
        )
    assert error.value.body["param"] == "conversation"


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.conversations.create(metadata={f"k{i}": "v" for i in range(17)}),
        lambda c: c.conversations.create(metadata={"k": "v" * 513}),
        lambda c: c.conversations.create(items=[user("x")] * 21),
        lambda c: c.responses.create(model="default", input="x", metadata={"k": "é" * 600}),
        lambda c: c.responses.create(model="default", input="x", user="u" * 300),
    ],
)
def test_what_is_stored_but_never_read_is_capped(client, call):
    """Today a 7.5 MB field the model never reads was stored with every response."""
    with pytest.raises(openai.BadRequestError):
        call(client)


def test_conversations_belong_to_their_api_key(tiny_engine):
    with (
        ApiServer(tiny_engine, "127.0.0.1", 0, api_key=list(KEYS)) as server,
        make_client(server, KEYS[0]) as carol,
        make_client(server, KEYS[1]) as dave,
    ):
        made = carol.conversations.create(items=[user("Carol's secret")])
        for attempt in (
            lambda: dave.conversations.retrieve(made.id),
            lambda: dave.conversations.items.list(made.id),
            lambda: dave.conversations.items.create(made.id, items=[user("x")]),
            lambda: dave.conversations.delete(made.id),
            lambda: dave.responses.create(
                model="default", conversation=made.id, input="x", max_output_tokens=2
            ),
        ):
            with pytest.raises(openai.NotFoundError):
                attempt()
        assert texts(carol.conversations.items.list(made.id)) == [("user", "Carol's secret")]


@pytest.mark.real_model
def test_the_agents_sdk_runs_a_two_turn_conversation(default_model_file, tmp_path):
    """Today the Agents SDK's ``conversation_id`` got a 400. On the default model (a tiny
    generated one never ends its turn, which the SDK takes as a failure)."""
    import agents  # the OpenAI Agents SDK (openai-agents): slow to import, so here

    engine = Engine(
        tmp_path / "data", str(default_model_file), config=EngineConfig(pool_tokens=8192)
    ).start()

    async def run(address: str) -> tuple:
        client = openai.AsyncOpenAI(
            base_url=address + "/v1", api_key="unused", max_retries=0, timeout=120
        )
        agents.set_tracing_disabled(True)
        agent = agents.Agent(
            name="brief",
            instructions="Answer in one short sentence.",
            model=agents.OpenAIResponsesModel(model="default", openai_client=client),
            model_settings=agents.ModelSettings(temperature=0, max_tokens=60),
        )
        made = await client.conversations.create()
        first = await agents.Runner.run(
            agent, "What is the capital of France?", conversation_id=made.id
        )
        second = await agents.Runner.run(agent, "And of Italy?", conversation_id=made.id)
        items = [item async for item in client.conversations.items.list(made.id, order="asc")]
        await client.close()
        return first, second, items

    try:
        engine.wait_ready(timeout=120)
        with ApiServer(engine, "127.0.0.1", 0) as server:
            first, second, items = asyncio.run(run(server.address))
    finally:
        engine.shutdown()
    assert first.final_output and second.final_output
    assert [item.role for item in items] == ["user", "assistant", "user", "assistant"]
    assert texts(items)[2] == ("user", "And of Italy?")
    assert texts(items)[3] == ("assistant", second.final_output)
    usage = second.context_wrapper.usage
    assert usage.input_tokens_details.cached_tokens > 0  # turn 2 extends turn 1's prompt
