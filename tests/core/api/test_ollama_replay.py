"""Open WebUI's and Continue's Ollama requests, replayed: the bodies their source builds
(tests/core/api/client_shapes/open_webui and continue; README.md there says where each
comes from) go to a server on a tiny model with a tool-capable template, and each answer is
read the way that client's code reads it (and in the ``ollama`` package's types)."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

import httpx
import ollama
import pytest

from core.api.server import ApiServer
from tests.core.engine.helpers import start_tools_engine

SHAPES = Path(__file__).parent / "client_shapes"
OPEN_WEBUI = sorted((SHAPES / "open_webui").glob("*.json"))
CONTINUE = sorted((SHAPES / "continue").glob("*.json"))
CONTINUE_PARAMETER = re.compile(r'^(\S+)\s+((?:".*")|\S+)$')  # Ollama.ts, /api/show


@pytest.fixture(scope="module")
def server(long_tiny_model, tmp_path_factory):
    engine = start_tools_engine(tmp_path_factory.mktemp("replay") / "data", long_tiny_model)
    with ApiServer(engine, "127.0.0.1", 0, ollama_port=0) as api:
        yield api
    engine.shutdown()


def replay(server, shape: Path) -> httpx.Response:
    recorded = json.loads(shape.read_text())
    return httpx.request(
        recorded["method"],
        server.ollama_address + recorded["path"],
        json=recorded["body"],
        headers=recorded["headers"],
        timeout=300,
    )


def objects(response: httpx.Response) -> list[dict]:
    """An NDJSON answer's objects (a whole answer is one), none of them an error."""
    found = [json.loads(line) for line in response.text.splitlines() if line.strip()]
    assert found and not any("error" in o for o in found), response.text[:300]
    return found


def test_the_shapes_are_there():
    assert len(OPEN_WEBUI) >= 11 and len(CONTINUE) >= 6
    for shape in OPEN_WEBUI + CONTINUE:
        recorded = json.loads(shape.read_text())
        assert {"method", "path", "body", "note"} <= set(recorded)


def read_chat(found: list[dict]) -> None:
    """What both clients read of a chat answer: assistant messages, then done."""
    for o in found:
        reply = ollama.ChatResponse(**o)
        assert reply.message.role == "assistant" and isinstance(reply.message.content, str)
        for call in reply.message.tool_calls or ():
            json.dumps(dict(call.function.arguments))  # Continue: JSON.stringify(arguments)
    assert found[-1]["done"] and all(not o["done"] for o in found[:-1])


def read_embeddings(answer: dict, path: str) -> None:
    """What both read of an embeddings answer: the vectors (an empty one is an error)."""
    if path == "/api/embed":
        vectors = ollama.EmbedResponse(**answer).embeddings
        assert vectors and all(len(v) > 0 for v in vectors)
    else:
        assert len(ollama.EmbeddingsResponse(**answer).embedding) > 0


@pytest.mark.parametrize("shape", OPEN_WEBUI, ids=lambda p: p.stem)
def test_open_webui_requests(server, shape):
    response = replay(server, shape)
    assert response.status_code == 200, response.text[:300]
    path = json.loads(shape.read_text())["path"]
    found = objects(response)
    if path == "/api/version":
        assert isinstance(found[0]["version"], str)
    elif path == "/api/tags":
        models = found[0]["models"]
        assert models and all(m["model"] == m["name"] and ":" in m["model"] for m in models)
    elif path == "/api/ps":
        for m in found[0]["models"]:
            assert m["name"] and datetime.fromisoformat(m["expires_at"]).timestamp() > 0
    elif path == "/api/show":
        assert ollama.ShowResponse(**found[0]).capabilities
    elif path in ("/api/embed", "/api/embeddings"):
        read_embeddings(found[0], path)
    elif path == "/api/chat":
        read_chat(found)
        if shape.stem.endswith("title_task"):  # a task: its JSON read from the content
            assert json.loads(found[0]["message"]["content"])["title"] is not None
    else:  # /api/generate
        assert all(isinstance(ollama.GenerateResponse(**o).response, str) for o in found)
        assert found[-1]["done"]


@pytest.mark.parametrize("shape", CONTINUE, ids=lambda p: p.stem)
def test_continue_requests(server, shape):
    response = replay(server, shape)
    assert response.status_code == 200, response.text[:300]
    path = json.loads(shape.read_text())["path"]
    found = objects(response)
    if path == "/api/show":
        for line in found[0]["parameters"].split("\n"):  # a line that does not match throws
            key, value = CONTINUE_PARAMETER.match(line).groups()
            if key == "stop":
                assert isinstance(json.loads(value), str)
            if key == "num_ctx":
                assert int(value) > 0
        assert ".Suffix" not in found[0]["template"]  # so Continue does no FIM through it
    elif path == "/api/tags":
        assert all(isinstance(m["name"], str) for m in found[0]["models"])
    elif path == "/api/chat":
        read_chat(found)
    elif path == "/api/embed":
        read_embeddings(found[0], path)
    else:  # autocomplete: each line's response
        assert all(isinstance(o.get("response", ""), str) for o in found) and found[-1]["done"]
