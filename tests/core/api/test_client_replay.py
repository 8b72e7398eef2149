"""Real clients' requests, replayed (issue 30): the bodies Claude Code and Codex sent
(captured once, secrets and local paths taken out: tests/core/api/client_shapes/README.md)
go to a server on a tiny model whose template takes no tools, and every answer must parse
in the client's own library's types.

The tiny model's tokenizer spends a token per byte, so each string longer than
``SHRINK_TO`` characters (the system prompt's paragraphs, the tools' descriptions) is cut
to that length and ``max_tokens`` (``max_output_tokens``) to a few: the shapes (every
field, block, item, tool kind and schema keyword the client sends) are what is replayed,
not the text's length.

Codex (0.171, ``codex exec``, ``POST /v1/responses``): its first turn (developer
instructions, environment context, function tools, a ``namespace`` tool and ``web_search``),
a turn carrying a ``function_call`` and its ``function_call_output``, and a turn with code
mode's free-form ``custom`` tool (a Lark grammar); read by the ``openai`` package's own
stream parser, then every event and the final response validated strictly in its types.
"""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import openai
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from core.api.server import ApiServer
from core.models.tiny_model import TinyModelSpec, write_tiny_model
from tests.core.engine.helpers import start_engine

SHAPES = Path(__file__).parent / "client_shapes"
SHRINK_TO = 60
MAX_TOKENS = 8
CLAUDE_CODE = sorted((SHAPES / "claude_code").glob("*.json"))
CODEX = sorted((SHAPES / "codex").glob("*.json"))
RESPONSE_EVENT = TypeAdapter(ResponseStreamEvent)


def shrunk(value):
    """``value`` with every string cut to ``SHRINK_TO`` characters."""
    if isinstance(value, str):
        return value[:SHRINK_TO]
    if isinstance(value, list):
        return [shrunk(item) for item in value]
    if isinstance(value, dict):
        return {key: shrunk(item) for key, item in value.items()}
    return value


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("replay")
    model = write_tiny_model(
        root / "tiny", TinyModelSpec(num_layers=2, max_position_embeddings=32768)
    )
    engine = start_engine(root / "data", model, pool_tokens=65536, disk_cache=False)
    with ApiServer(engine, "127.0.0.1", 0) as api:
        yield api
    engine.shutdown()


def test_the_claude_code_shapes_are_there():
    assert len(CLAUDE_CODE) >= 2  # its first request and one that continues it
    for path in CLAUDE_CODE:
        text = path.read_text()
        assert "x-api-key" not in text and "/tmp/" not in text  # stripped when captured


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("shape", CLAUDE_CODE, ids=lambda p: p.stem)
def test_claude_code_requests_get_answers_its_library_parses(server, shape, stream):
    recorded = json.loads(shape.read_text())
    body = shrunk(recorded["body"])
    body.update(max_tokens=MAX_TOKENS, stream=stream)
    headers = {k: v for k, v in recorded["headers"].items() if k.startswith("anthropic-")}
    with anthropic.Anthropic(
        base_url=server.address, api_key="unused", max_retries=0, timeout=300
    ) as client:
        response = client.post(
            "/v1/messages?" + recorded["query"],
            body=body,
            cast_to=Message,
            options={"headers": headers},
            stream=stream,
            stream_cls=anthropic.Stream[RawMessageStreamEvent],
        )
        if not stream:
            message = response
        else:
            events = [
                TypeAdapter(RawMessageStreamEvent).validate_python(e.model_dump()) for e in response
            ]
            kinds = [e.type for e in events]
            assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
            message = events[0].message
    assert isinstance(message, Message) and message.role == "assistant"
    assert message.model == "tiny"  # the loaded model, whatever name Claude Code sent


# ------------------------------------------------------------------ Codex
def codex_body(path: Path, max_output_tokens: int = MAX_TOKENS) -> dict:
    body = shrunk(json.loads(path.read_text()))
    return {**body, "max_output_tokens": max_output_tokens, "temperature": 0}


def replay_codex(server, body: dict) -> Response:
    """Send ``body`` as it is (the package's own stream parser reads the answer); every
    event and the final response validated in the package's types."""
    with openai.OpenAI(
        base_url=server.address + "/v1", api_key="unused", max_retries=0, timeout=300
    ) as client:
        stream = client.post(
            "/responses",
            body=body,
            cast_to=Response,
            stream=True,
            stream_cls=openai.Stream[ResponseStreamEvent],
        )
        events = [event.model_dump(by_alias=True, exclude_unset=True) for event in stream]
    for event in events:
        RESPONSE_EVENT.validate_python(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created"
    assert events[-1]["type"] in ("response.completed", "response.incomplete"), events[-1]
    return Response.model_validate(events[-1]["response"])


def test_the_codex_shapes_are_there():
    assert len(CODEX) >= 3
    for path in CODEX:
        text = path.read_text()
        assert "Bearer" not in text and "/tmp/" not in text  # stripped when captured


@pytest.mark.parametrize("shape", CODEX, ids=lambda path: path.stem)
def test_codex_requests_get_answers_its_library_parses(server, shape):
    body = json.loads(shape.read_text())
    assert body["stream"] is True and body["tools"]  # as Codex sends them
    answer = replay_codex(server, codex_body(shape))
    assert answer.output and answer.usage.input_tokens > 0
    assert answer.model == "tiny"  # the loaded model, whatever name Codex sent
    # every tool kind echoed as sent, the hosted ones (dropped, never run) too
    assert [tool.type for tool in answer.tools] == [tool["type"] for tool in body["tools"]]


def test_a_codex_prompt_sent_again_is_read_from_the_cache(server):
    body = codex_body(CODEX[0], max_output_tokens=4)
    first, again = replay_codex(server, body), replay_codex(server, body)
    assert again.usage.input_tokens == first.usage.input_tokens
    # nothing in Codex's prompt changes between sends: all of it but the last token is cached
    assert again.usage.input_tokens_details.cached_tokens == first.usage.input_tokens - 1
