"""The route skeleton every dialect shares (:func:`core.api.generation.run_generation`): a
dialect is its :class:`ReplyWriter`; submitting, waiting, streaming, the engine's errors,
the 499/503 answers and the namespace header are the skeleton's, the same for any writer."""

from __future__ import annotations

import json

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from core.api.app import error_response
from core.api.errors import ApiError
from core.api.generation import ReplyWriter, run_generation
from core.api.routing import NAMESPACE_HEADER
from core.api.state import ApiState
from core.engine import namespaces
from core.engine.types import DoneEvent, Event, GenerationRequest, SamplingParams, ToolCall

PROMPT = "Say something"


class LinesWriter(ReplyWriter):
    """A toy dialect: one JSON line a piece, named by what it is."""

    media_type = "application/x-test-lines"

    def __init__(self, chat: bool):
        self.chat = chat

    async def whole(self, done: DoneEvent) -> dict:
        return {"text": done.text, "finish": done.stats.finish_reason}

    def opening(self, first: Event) -> list[bytes]:
        return [self._line("open", type(first).__name__)]

    def token(self, text: str) -> list[bytes]:
        return [self._line("token", text)]

    def reasoning(self, text: str) -> list[bytes]:
        return [self._line("reasoning", text)]

    def tool_call(self, call: ToolCall) -> list[bytes]:
        return [self._line("tool_call", call.name)]

    async def finished(self, done: DoneEvent) -> list[bytes]:
        return [self._line("done", done.stats.finish_reason)]

    def failed(self, error: ApiError) -> list[bytes]:
        return [self._line("failed", error.message)]

    @staticmethod
    def _line(kind: str, value: str) -> bytes:
        return json.dumps({kind: value}).encode() + b"\n"


@pytest.fixture(scope="module")
def client(tiny_engine):
    api = ApiState(tiny_engine, "127.0.0.1", (), None, 1 << 20, ())
    app = FastAPI()
    app.state.api = api

    @app.post("/toy")
    async def toy(request: Request, stream: bool = False, chat: bool = True, tokens: int = 0):
        generation = GenerationRequest(
            prompt_text=PROMPT if not tokens else None,
            prompt_tokens=tuple([7] * tokens) if tokens else None,
            sampling=SamplingParams(temperature=0.0, max_tokens=12),
            cache_namespace=namespaces.API,
        )
        return await run_generation(request, generation, LinesWriter(chat), 0.0, stream)

    app.add_exception_handler(ApiError, error_response)
    with TestClient(app) as test_client:
        test_client.api = api
        yield test_client


def lines(response) -> list[tuple[str, str]]:
    return [next(iter(json.loads(line).items())) for line in response.text.splitlines()]


def test_a_stream_is_what_the_writer_writes_in_the_engines_order(client):
    response = client.post("/toy", params={"stream": True})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith(LinesWriter.media_type)
    assert response.headers[NAMESPACE_HEADER] == namespaces.label(namespaces.API)
    got = lines(response)
    assert got[0][0] == "open" and got[-1] == ("done", "length")
    assert {kind for kind, _ in got[1:-1]} <= {"token", "reasoning"}
    streamed = "".join(text for kind, text in got if kind == "token")
    assert streamed

    whole = client.post("/toy")  # the same greedy reply, as the writer's body
    assert whole.status_code == 200
    assert whole.headers[NAMESPACE_HEADER] == namespaces.label(namespaces.API)
    assert whole.json() == {"text": streamed, "finish": "length"}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("chat", "param"), [(True, "messages"), (False, "prompt")])
def test_an_engine_error_before_anything_is_sent_names_the_writers_field(
    client, stream, chat, param
):
    """A prompt past the model's context is a 400, before a stream starts too, about the
    field the writer says its prompt is in."""
    response = client.post("/toy", params={"stream": stream, "chat": chat, "tokens": 5000})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == param


def test_a_server_that_stops_answers_503_for_any_writer(client):
    client.api.stop_accepting()
    try:
        response = client.post("/toy", params={"stream": True})
    finally:
        client.api.stopping = False
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "cancelled"
