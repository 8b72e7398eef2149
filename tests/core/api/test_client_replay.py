"""Request bodies real coding agents sent, replayed to a server on a tiny model: every
answer must parse in the client's own library.

``client_shapes/codex/`` holds bodies the Codex CLI (0.171, ``codex exec``) sent to
``POST /v1/responses``, captured once through a logging proxy (paths and ids replaced; no
key is in a body): its first turn (developer instructions, environment context, function
tools, a ``namespace`` tool and ``web_search``), a turn carrying a ``function_call`` and
its ``function_call_output``, and a turn with code mode's free-form ``custom`` tool (a
Lark grammar). Replayed as sent but for three things: long texts are cut (the tiny model's
context is small; every item, tool and field stays), ``max_output_tokens`` bounds the
reply, and the model is named ``default`` (the name Codex was configured with is not one
of the tiny model's). The answers are read with the ``openai`` package: its stream parser, then a
strict validation of every event and of the final response in its types.
"""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from core.api.server import ApiServer
from core.engine.engine import Engine
from core.models.tiny_model import TinyModelSpec, write_tiny_model

SHAPES = Path(__file__).parent / "client_shapes"
CODEX = sorted((SHAPES / "codex").glob("*.json"))
EVENT = TypeAdapter(ResponseStreamEvent)
CUT = 80  # characters kept of a long text
CUT_KEYS = frozenset({"text", "description", "output", "definition"})


def shortened(value, key: str | None = None):
    """``value`` with the long strings under ``CUT_KEYS`` cut to ``CUT`` characters."""
    if isinstance(value, dict):
        return {k: shortened(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [shortened(v, key) for v in value]
    if isinstance(value, str) and key in CUT_KEYS:
        return value[:CUT]
    return value


def as_replayed(body: dict, max_output_tokens: int) -> dict:
    return {
        **shortened(body),
        "model": "default",
        "max_output_tokens": max_output_tokens,
        "temperature": 0,
    }


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    root = tmp_path_factory.mktemp("replay")
    model = write_tiny_model(
        root / "tiny-16k", TinyModelSpec(num_layers=2, max_position_embeddings=16384)
    )
    engine = Engine(root / "data", str(model), pool_tokens=32768, disk_cache=False).start()
    try:
        engine.wait_ready(timeout=120)
        with (
            ApiServer(engine, "127.0.0.1", 0) as server,
            openai.OpenAI(
                base_url=server.address + "/v1", api_key="unused", max_retries=0, timeout=300
            ) as client,
        ):
            yield client
    finally:
        engine.shutdown()


def replay(client: openai.OpenAI, body: dict) -> Response:
    """Send ``body`` as it is (the package's own stream parser reads the answer); every
    event and the final response validated in the package's types."""
    stream = client.post(
        "/responses",
        body=body,
        cast_to=Response,
        stream=True,
        stream_cls=openai.Stream[ResponseStreamEvent],
    )
    events = [event.model_dump(by_alias=True, exclude_unset=True) for event in stream]
    for event in events:
        EVENT.validate_python(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created"
    assert events[-1]["type"] in ("response.completed", "response.incomplete"), events[-1]
    return Response.model_validate(events[-1]["response"])


@pytest.mark.parametrize("shape", CODEX, ids=lambda path: path.stem)
def test_codex_requests_are_answered_in_shapes_the_openai_package_reads(client, shape):
    body = json.loads(shape.read_text())
    assert body["stream"] is True and body["tools"]  # as Codex sends them
    answer = replay(client, as_replayed(body, max_output_tokens=8))
    assert answer.output and answer.usage.input_tokens > 0
    served = {tool["type"] for tool in body["tools"]}
    echoed = {tool.type for tool in answer.tools}
    assert served == echoed  # every tool kind echoed, the hosted ones though not run


def test_a_codex_prompt_sent_again_is_read_from_the_cache(client):
    body = as_replayed(json.loads(CODEX[0].read_text()), max_output_tokens=4)
    first, again = replay(client, body), replay(client, body)
    assert again.usage.input_tokens == first.usage.input_tokens
    # nothing in Codex's prompt changes between sends: all of it but the last token is cached
    assert again.usage.input_tokens_details.cached_tokens == first.usage.input_tokens - 1
