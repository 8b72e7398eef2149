"""Real clients' requests, replayed (issue 30): the bodies Claude Code sent (captured once,
secrets and local paths taken out: tests/core/api/client_shapes/README.md) go to a server
on a tiny model whose template takes no tools, and every answer must parse in the client's
own library's types.

The tiny model's tokenizer spends a token per byte, so each string longer than
``SHRINK_TO`` characters (the system prompt's paragraphs, the tools' descriptions) is cut
to that length and ``max_tokens`` to a few: the shapes (every field, block and schema
keyword the client sends) are what is replayed, not the text's length.
"""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from core.api.server import ApiServer
from core.models.tiny_model import TinyModelSpec, write_tiny_model
from tests.core.engine.helpers import start_engine

SHAPES = Path(__file__).parent / "client_shapes"
SHRINK_TO = 60
MAX_TOKENS = 8
CLAUDE_CODE = sorted((SHAPES / "claude_code").glob("*.json"))


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
